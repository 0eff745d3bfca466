"""TokenSummary: what a token dataset holds, from its index alone (``stoker inspect``).

It reads the index only (no shard), so it lives beside the pack that writes that index
and is importable from :mod:`stoker.pack.tokens` as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stoker.format.index import DatasetIndex
from stoker.format.tokens import TokenLayout


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenSummary:
    """What a token dataset holds, from its index alone (``stoker inspect``).

    Attributes:
        url: The dataset.
        tokens: Tokens in the stream (end-of-text ids included).
        documents: Documents.
        dtype: ``uint16`` or ``uint32``.
        eos_id: The end-of-text id appended to each document, or None.
        max_id: The largest id.
        bytes: Shard bytes.
        document_tokens: Mean, min and max tokens a document (its end-of-text id included).
        seq_len: The sequence length the next figure is for.
        sequences: Sequences of ``seq_len + 1`` tokens (the inputs and their next-token targets)
            an epoch of the whole stream holds, on one rank.
        skipped: Inputs left out at pack time.
        packed_with: The pack's parameters.
        shards: Per shard: name, documents, tokens, bytes.
    """

    url: str
    tokens: int
    documents: int
    dtype: str
    eos_id: int | None
    max_id: int
    bytes: int
    document_tokens: dict[str, float]
    seq_len: int
    sequences: int
    skipped: int
    packed_with: dict[str, Any]
    shards: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def summarise_tokens(
    url: str, layout: TokenLayout, index: DatasetIndex, *, seq_len: int
) -> TokenSummary:
    """Summarise a token dataset's index for sequences of ``seq_len`` tokens (no shard is
    read).

    Raises:
        ValueError: ``seq_len`` below 1.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    lengths = np.asarray(index.length, dtype=np.int64) // layout.itemsize
    return TokenSummary(
        url=url,
        tokens=layout.tokens,
        documents=len(index),
        dtype=layout.dtype.name,
        eos_id=layout.eos_id,
        max_id=layout.max_id,
        bytes=sum(s.size for s in index.shards),
        document_tokens={
            "mean": round(float(lengths.mean()), 1) if len(lengths) else 0.0,
            "min": int(lengths.min()) if len(lengths) else 0,
            "max": int(lengths.max()) if len(lengths) else 0,
        },
        seq_len=seq_len,
        sequences=layout.tokens // (seq_len + 1),
        skipped=len(index.skipped),
        packed_with=dict(index.packed_with),
        shards=[
            {"name": s.name, "documents": s.samples, "tokens": int(n), "bytes": s.size}
            for s, n in zip(index.shards, layout.shard_tokens, strict=True)
        ],
    )
