"""pack_tokens(): tokenized documents, or text and a tokenizer, into a token dataset.

The inputs (:mod:`stoker.pack.token_sources`) are read once, in order, and each document
is checked (one-dimensional integer ids, not empty, each below the vocabulary size, or
fitting 32 bits when none is known) and appended to a staging file in the temporary
directory (``tempfile``; 2 or 4 bytes a token, removed at the end). Staging gives the
largest id before the dtype is chosen and lets the documents be written in a seeded
shuffled order (as image packs are), whatever the input: the dataset is ``uint16`` when
the vocabulary size (given, or the tokenizer's) fits it, or, with no vocabulary size
known, when the largest id found does; else ``uint32``. Then
:func:`~stoker.format.token_writer.write_token_dataset` writes the shards and, last, the
index (the commit point): an interrupted pack leaves shards and no index; the
destination must be empty, so delete them and pack again.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Literal

import numpy as np

from stoker.errors import SourceError
from stoker.format.foreign.locations import LocationReader
from stoker.format.token_writer import write_token_dataset
from stoker.format.tokens import TOKEN_LIMITS, token_dtype
from stoker.pack.packer import DEFAULT_SHARD_BYTES
from stoker.pack.sources import refuse_destination_in_source
from stoker.pack.token_sources import (
    BIN_DTYPES,
    Item,
    TokenInputs,
    find_token_inputs,
    read_concatenated,
    read_documents,
    read_jsonl,
    read_parquet,
)
from stoker.pack.token_summary import TokenSummary, summarise_tokens
from stoker.pack.tokenizers import TOKENIZE_BATCH, Tokenizer, load_tokenizer, tokenized
from stoker.storage import Store, open_store

logger = logging.getLogger(__name__)

# Importable from here as before: the tokenizers (stoker.pack.tokenizers) and the summary
# of a packed dataset (stoker.pack.token_summary).
__all__ = [
    "TOKENIZE_BATCH",
    "TokenPackConfig",
    "TokenPackReport",
    "TokenSummary",
    "Tokenizer",
    "load_tokenizer",
    "pack_tokens",
    "summarise_tokens",
]

_UINT32_MAX = TOKEN_LIMITS["uint32"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenPackConfig:
    """How to pack tokens.

    Attributes:
        eos_id: The end-of-text id appended after every document, if any.
        vocab_size: Ids at or above it are out of range; it also sets the dtype (``uint16``
            up to 65,536). A ``tokenizers`` file gives its own when this is None.
        bin_dtype: The dtype of raw ``.bin`` inputs (``uint16``, ``uint32``, ``int32``, ...).
        text_field: The JSONL field or Parquet column holding the text.
        max_shard_bytes: Target shard size: a shard is closed at the first document
            boundary past this many token bytes.
        shuffle_seed: Write the documents in the random order of this seed (recorded in
            the index); None keeps the input's order.
        on_error: ``"raise"`` stops at the first bad document, naming it; ``"skip"`` leaves
            it out and lists it, with the reason, in the index and the report.
        workers: Input files read at once (for a folder of documents in a bucket).
    """

    eos_id: int | None = None
    vocab_size: int | None = None
    bin_dtype: str | None = None
    text_field: str = "text"
    max_shard_bytes: int = DEFAULT_SHARD_BYTES
    shuffle_seed: int | None = 0
    on_error: Literal["raise", "skip"] = "raise"
    workers: int = 32

    def __post_init__(self) -> None:
        for name in ("eos_id", "vocab_size", "shuffle_seed", "max_shard_bytes", "workers"):
            value = getattr(self, name)
            # True is an int to Python, but not an id: it packed a dataset nothing could open.
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if self.vocab_size is not None and not 1 <= self.vocab_size <= _UINT32_MAX + 1:
            raise ValueError(f"vocab_size must be between 1 and 2**32, got {self.vocab_size}")
        if self.eos_id is not None and not 0 <= self.eos_id <= _UINT32_MAX:
            raise ValueError(f"eos_id must be between 0 and 2**32 - 1, got {self.eos_id}")
        if self.bin_dtype is not None and self.bin_dtype not in BIN_DTYPES:
            raise ValueError(f"bin_dtype must be one of {list(BIN_DTYPES)}, got {self.bin_dtype!r}")
        if self.max_shard_bytes < 1 or self.workers < 1:
            raise ValueError("max_shard_bytes and workers must be >= 1")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")


@dataclass(slots=True, kw_only=True)
class TokenPackReport:
    """What a token pack did.

    Attributes:
        source: Description of the input.
        source_format: ``documents``, ``concatenated``, ``jsonl`` or ``parquet``.
        tokenizer: The tokenizer used for text, described, or None.
        destination: Dataset URL.
        documents: Documents in the dataset.
        tokens: Tokens in the dataset (end-of-text ids included).
        shards: Shards in the dataset.
        dtype: ``uint16`` or ``uint32``.
        eos_id: The end-of-text id appended to each document, or None.
        max_id: The largest id in the dataset.
        shuffle_seed: The seed of the documents' order, or None for the input's order.
        bytes_in: Input bytes read.
        bytes_out: Shard bytes written.
        seconds: Wall time.
        skipped: Documents left out (``on_error="skip"``): key, source, reason.
        requests: Request counters of the reads (``"source"``) and writes (``"destination"``).
    """

    source: str
    source_format: str
    tokenizer: str | None
    destination: str
    documents: int = 0
    tokens: int = 0
    shards: int = 0
    dtype: str = ""
    eos_id: int | None = None
    max_id: int = 0
    shuffle_seed: int | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    skipped: list[dict[str, str]] = field(default_factory=list)
    requests: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = asdict(self)
        data["tokens_per_s"] = round(self.tokens / self.seconds, 1) if self.seconds else 0.0
        return data


def pack_tokens(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    config: TokenPackConfig | None = None,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    offsets: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: Callable[[str, int | None, int], None] | None = None,
) -> TokenPackReport:
    """Pack tokenized documents, or text with a tokenizer, into a token dataset.

    Args:
        source: A folder (local or bucket) of ``.npy``/``.bin`` documents, one file of
            concatenated tokens (with ``offsets``), or JSONL or Parquet text (a file or a
            folder of them); see :mod:`stoker.pack.token_sources`.
        destination: Where the dataset goes; must be empty.
        config: End-of-text id, vocabulary size, shard size, order, error policy.
        tokenizer: For text: a function of one text returning its ids, or a Hugging Face
            ``tokenizers`` JSON file (``pip install 'stoker[tokenizers]'``).
        offsets: A ``.npy`` of each document's start in ``source``, and the end.
        storage_options: For source and destination (see :func:`stoker.open_store`).
        progress: Called as ``progress(phase, total, advance)``: phase ``"read"`` per
            document read (total None while unknown), then ``"write"`` per document written.

    Returns:
        What was packed.

    Raises:
        SourceError: A bad document with ``on_error="raise"``: names it and the reason (an
            id out of range, an empty document, not a 1-D integer array).
        ValueError: The destination inside the source folder or not empty; input of
            mixed kinds or none; text and no tokenizer; bad offsets.
        ImportError: A tokenizer file and no ``tokenizers``, or Parquet and no pyarrow.
    """
    config = config or TokenPackConfig()
    started = time.perf_counter()
    src, dst = os.fspath(source), os.fspath(destination)
    refuse_destination_in_source(src, dst)
    store = open_store(dst, storage_options=storage_options)
    _refuse_occupied(store)
    offsets_at = None if offsets is None else os.fspath(offsets)
    inputs = find_token_inputs(src, offsets=offsets_at, storage_options=storage_options)
    text = inputs.kind in ("jsonl", "parquet")
    if text != (tokenizer is not None):
        raise ValueError(
            f"{src}: {inputs.kind} input needs a tokenizer"
            if text
            else f"{src}: already tokens ({inputs.kind}); a tokenizer applies to text only"
        )
    encoder = load_tokenizer(tokenizer, storage_options=storage_options) if text else None  # type: ignore[arg-type]
    vocab_size = config.vocab_size or (encoder.vocab_size if encoder else None)
    if config.eos_id is not None and vocab_size is not None and config.eos_id >= vocab_size:
        raise ValueError(f"eos id {config.eos_id} is outside the vocabulary of {vocab_size:,}")
    limit = _UINT32_MAX if vocab_size is None else vocab_size - 1
    reader = LocationReader(storage_options)
    items = _read(inputs, reader, config, offsets_at)
    if encoder is not None:
        items = tokenized(items, encoder)
    report = TokenPackReport(
        source=f"{inputs.kind} {src} ({len(inputs.files):,} files)",
        source_format=inputs.kind,
        tokenizer=encoder.description if encoder else None,
        destination=store.url,
        bytes_in=inputs.bytes,
        shuffle_seed=config.shuffle_seed,
    )
    total = len(inputs.files) if inputs.kind == "documents" else None
    with _Staging(token_dtype(limit)) as staging:
        for item in items:
            tokens, problem = _checked(item, limit, vocab_size)
            if problem is None:
                staging.add(item.key, tokens)
            elif config.on_error == "raise":
                raise SourceError(f"{item.source}: document {item.key!r}: {problem}")
            else:
                report.skipped.append({"key": item.key, "source": item.source, "reason": problem})
            if progress is not None:
                progress("read", total, 1)
        if not staging.keys:
            raise ValueError(
                f"{src}: no documents to pack ({len(report.skipped)} skipped: "
                f"{report.skipped[0]['reason'] if report.skipped else 'none found'})"
            )
        largest = max(staging.max_id, -1 if config.eos_id is None else config.eos_id)
        dtype = token_dtype(largest if vocab_size is None else vocab_size - 1)
        order = list(range(len(staging.keys)))
        if config.shuffle_seed is not None:
            random.Random(config.shuffle_seed).shuffle(order)
        packed_with = {
            "source": report.source,
            "format": inputs.kind,
            "tokenizer": report.tokenizer,
            "text_field": config.text_field if text else None,
            "bin_dtype": config.bin_dtype,
            "vocab_size": vocab_size,
            "eos_id": config.eos_id,
            "max_shard_bytes": config.max_shard_bytes,
            "shuffle_seed": config.shuffle_seed,
        }
        documents = staging.documents(order)
        if progress is not None:
            documents = _ticking(documents, progress, len(order))
        index = write_token_dataset(
            store,
            documents,
            dtype=dtype,
            eos_id=config.eos_id,
            shard_tokens=max(1, config.max_shard_bytes // dtype.itemsize),
            packed_with=packed_with,
            skipped=report.skipped,
        )
    layout = index.tokens
    if layout is None:  # write_token_dataset always sets it
        raise RuntimeError("write_token_dataset wrote no tokens section")
    report.documents, report.tokens, report.shards = len(index), layout.tokens, len(index.shards)
    report.dtype, report.eos_id, report.max_id = layout.dtype.name, layout.eos_id, layout.max_id
    report.bytes_out = sum(s.size for s in index.shards)
    report.requests = {"source": reader.requests(), "destination": store.counters.snapshot()}
    report.seconds = time.perf_counter() - started
    return report


def _refuse_occupied(store: Store) -> None:
    found = []
    for meta in store.list(""):
        found.append(repr(meta.key))
        if len(found) > 5:
            break
    if found:
        named = ", ".join(found[:5]) + (" and more" if len(found) > 5 else "")
        raise ValueError(
            f"{store.url}: not empty, it holds {named}; a token pack writes only into an "
            "empty folder or prefix (one interrupted leaves shards and no index.json: delete "
            "them and pack again)"
        )


def _read(
    inputs: TokenInputs, reader: LocationReader, config: TokenPackConfig, offsets: str | None
) -> Iterator[Item]:
    if inputs.kind == "documents":
        return read_documents(
            inputs.files, reader, bin_dtype=config.bin_dtype, workers=config.workers
        )
    if inputs.kind == "concatenated" and offsets is not None:
        return read_concatenated(inputs.files[0], offsets, reader, bin_dtype=config.bin_dtype)
    if inputs.kind == "jsonl":
        return read_jsonl(inputs.files, reader, text_field=config.text_field)
    return read_parquet(inputs.files, reader, text_field=config.text_field)


def _checked(item: Item, limit: int, vocab_size: int | None) -> tuple[np.ndarray, str | None]:
    """The document's ids as an array, and why it cannot be packed (None if it can)."""
    if item.problem is not None:
        return np.zeros(0, np.uint32), item.problem
    try:
        array = np.asarray(item.value)
    except (ValueError, TypeError) as exc:
        return np.zeros(0, np.uint32), f"not an array of token ids: {exc}"
    if array.ndim != 1:
        return array, f"a {array.ndim}-D array of shape {array.shape}, expected one dimension"
    if not len(array):
        return array, "empty document (no tokens)"
    if array.dtype.kind not in "iu":
        return array, f"ids of dtype {array.dtype}, expected integers"
    low, high = int(array.min()), int(array.max())
    if low < 0:
        return array, f"token id {low} is negative"
    if high > limit:
        within = f"the vocabulary of {vocab_size:,}" if vocab_size else "32 bits"
        return array, f"token id {high} is out of range (outside {within})"
    return array, None


def _ticking(
    documents: Iterator[tuple[str, np.ndarray]],
    progress: Callable[[str, int | None, int], None],
    total: int,
) -> Iterator[tuple[str, np.ndarray]]:
    for document in documents:
        yield document
        progress("write", total, 1)


class _Staging:
    """Checked documents in a temporary file, in input order, read back in any order."""

    def __init__(self, dtype: np.dtype[Any]) -> None:
        self.dtype = dtype
        self.keys: list[str] = []
        self.starts: list[int] = [0]
        self.max_id = -1
        # Closed by __exit__; unnamed, so nothing is left behind even on a crash.
        self._file: IO[bytes] = tempfile.TemporaryFile(prefix="stoker-tokens-")  # noqa: SIM115

    def __enter__(self) -> _Staging:
        return self

    def __exit__(self, *_: object) -> None:
        self._file.close()

    def add(self, key: str, tokens: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self.keys.append(key)
        self.starts.append(self.starts[-1] + len(tokens))
        self.max_id = max(self.max_id, int(tokens.max()))

    def documents(self, order: Sequence[int]) -> Iterator[tuple[str, np.ndarray]]:
        self._file.flush()
        item = self.dtype.itemsize
        for n in order:
            start, end = self.starts[n], self.starts[n + 1]
            self._file.seek(start * item)
            data = self._file.read((end - start) * item)
            yield self.keys[n], np.frombuffer(data, dtype=self.dtype)
