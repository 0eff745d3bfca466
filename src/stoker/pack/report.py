"""What a pack did (:class:`PackReport`, for images, records and tokens alike) and how it
says how far it is (:data:`PackProgress`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

#: ``progress(total, samples, nbytes)``: called as input is read, with the number of
#: samples in the input (None while it is unknown), the samples read since the last call
#: and their input bytes. A resumed pack first reports the samples of the shards it keeps
#: (with 0 bytes). Token documents are counted as they are read and checked, before their
#: shards are written.
PackProgress = Callable[[int | None, int, int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenStats:
    """What a token pack wrote, beyond what every pack reports.

    Attributes:
        tokens: Tokens in the dataset (end-of-text ids included).
        dtype: ``uint16`` or ``uint32``.
        eos_id: The end-of-text id appended to each document, or None.
        max_id: The largest id in the dataset.
        tokenizer: The tokenizer used for text, described, or None.
        shuffle_seed: The seed of the documents' order, or None for the input's order.
    """

    tokens: int
    dtype: str
    eos_id: int | None
    max_id: int
    tokenizer: str | None
    shuffle_seed: int | None


@dataclass(slots=True, kw_only=True)
class PackReport:
    """What a pack did.

    Attributes:
        source: Description of the input.
        source_format: The reader used (guessed or given); for tokens ``documents``,
            ``concatenated``, ``jsonl`` or ``parquet``.
        destination: Dataset URL.
        samples: Samples in the dataset (for tokens: documents).
        shards: Shards in the dataset.
        shards_reused: Shards found complete from an earlier, interrupted run.
        bytes_in: Input bytes read in this run.
        bytes_out: Shard bytes written in this run.
        seconds: Wall time.
        skipped: Inputs left out (``on_error="skip"``): key, source, reason.
        requests: Counters (requests, bytes, retries, errors by kind) of the reads from the
            input (``"source"``) and of the writes to the dataset (``"destination"``). With
            ``engine="ray"``, the reads and shard writes made by Ray workers are not in it.
        tokens: For a token pack, its tokens, dtype and ids; None for other packs.
    """

    source: str
    source_format: str
    destination: str
    samples: int = 0
    shards: int = 0
    shards_reused: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    skipped: list[dict[str, str]] = field(default_factory=list)
    requests: dict[str, dict[str, int]] = field(default_factory=dict)
    tokens: TokenStats | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = asdict(self)
        data["samples_per_s"] = round(self.samples / self.seconds, 1) if self.seconds else 0.0
        data["bytes_in_per_s"] = round(self.bytes_in / self.seconds, 1) if self.seconds else 0.0
        if self.tokens is not None:
            rate = self.tokens.tokens / self.seconds if self.seconds else 0.0
            data["tokens"]["tokens_per_s"] = round(rate, 1)
        return data
