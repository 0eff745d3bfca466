"""Writing a token dataset from documents' token arrays (see :mod:`stoker.format.tokens`).

This is the format's writer: it takes documents that have already been checked (1-D,
integer, in range, non-empty) and cut into the dataset's dtype; ``stoker pack --tokens``
(:mod:`stoker.pack`) reads inputs, checks them and calls it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from stoker.format.index import DatasetIndex, write_index
from stoker.format.spec import shard_name
from stoker.format.tokens import TOKEN_LIMITS, TokenLayout, TokenShardWriter
from stoker.format.writer import ShardRecord
from stoker.storage.base import Store

#: Tokens per shard when the caller leaves it unset: 64 Mi tokens, 128 MiB of uint16.
DEFAULT_SHARD_TOKENS = 64 << 20


def write_token_dataset(
    store: Store,
    documents: Iterable[tuple[str, np.ndarray]],
    *,
    dtype: np.dtype[Any],
    eos_id: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    packed_with: Mapping[str, Any] | None = None,
    skipped: list[dict[str, str]] | None = None,
) -> DatasetIndex:
    """Write documents as token shards, then the index (the commit point).

    A shard is closed at the first document boundary at or past ``shard_tokens``; documents
    never cross shards. ``eos_id``, when given, is appended to every document.

    Args:
        store: The dataset's root.
        documents: ``(key, tokens)`` pairs in stream order; tokens are 1-D integer arrays
            whose ids fit ``dtype``.
        dtype: ``uint16`` or ``uint32`` (see :func:`~stoker.format.tokens.token_dtype`).
        eos_id: The end-of-text id to append to each document, if any.
        shard_tokens: Tokens a shard holds at least before it is closed.
        packed_with: Pack parameters to record.
        skipped: Inputs left out, to record.

    Returns:
        The index written.

    Raises:
        ValueError: No documents, or a document that is not a non-empty 1-D array of ids
            that fit ``dtype``.
    """
    dtype = np.dtype(dtype).newbyteorder("<")
    if dtype.name not in TOKEN_LIMITS:
        raise ValueError(f"dtype {dtype.name} is not one of {sorted(TOKEN_LIMITS)}")
    limit = TOKEN_LIMITS[dtype.name]
    if eos_id is not None and not 0 <= eos_id <= limit:
        raise ValueError(f"eos_id {eos_id} does not fit {dtype.name} (0..{limit})")
    records: list[ShardRecord] = []
    counts: list[int] = []
    offsets: list[int] = []
    max_id = -1
    writer: TokenShardWriter | None = None
    for key, tokens in documents:
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or not len(tokens) or tokens.dtype.kind not in "iu":
            raise ValueError(f"document {key!r}: expected a non-empty 1-D integer array")
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high > limit:
            bad = low if low < 0 else high
            raise ValueError(f"document {key!r}: token id {bad} outside 0..{limit}")
        max_id = max(max_id, high)
        if eos_id is not None:
            tokens = np.append(tokens.astype(dtype), np.asarray([eos_id], dtype=dtype))
        if writer is None:
            writer = TokenShardWriter(
                store, shard_name(len(records)), number=len(records), dtype=dtype
            )
        writer.add(key, tokens.astype(dtype, copy=False))
        if writer.tokens >= shard_tokens:
            _close(writer, records, counts, offsets)
            writer = None
    if writer is not None:
        _close(writer, records, counts, offsets)
    if not records:
        raise ValueError("no documents to write")
    index = DatasetIndex.from_shards(
        records,
        class_names=[],
        fields={"tokens": sum(len(r.samples) for r in records)},
        packed_with=dict(packed_with or {}),
        skipped=skipped,
    )
    index.tokens = TokenLayout(
        dtype=dtype,
        eos_id=eos_id,
        max_id=max(max_id, -1 if eos_id is None else eos_id),
        shard_tokens=np.asarray(counts, dtype=np.int64),
        data_offsets=np.asarray(offsets, dtype=np.int64),
    )
    write_index(store, index)
    return index


def _close(
    writer: TokenShardWriter, records: list[ShardRecord], counts: list[int], offsets: list[int]
) -> None:
    counts.append(writer.tokens)
    record, offset = writer.close()
    records.append(record)
    offsets.append(offset)
