"""Writing a token dataset from documents' token arrays (see :mod:`stoker.format.tokens`).

This is the format's writer: it takes documents that have already been checked (1-D,
integer, in range, non-empty) and cut into the dataset's dtype; ``stoker pack --tokens``
(:mod:`stoker.pack`) reads inputs, checks them and writes shard by shard with
:func:`write_token_shard` (so an interrupted pack resumes at the first shard missing), then
the index with :func:`write_token_index`. Both cut the stream with :func:`group_documents`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from stoker.format.index import DatasetIndex, write_index
from stoker.format.spec import shard_name
from stoker.format.tokens import TOKEN_LIMITS, TokenLayout, TokenShardWriter
from stoker.format.writer import ShardRecord
from stoker.storage.base import Store

_T = TypeVar("_T")

#: Tokens per shard when the caller leaves it unset: 64 Mi tokens, 128 MiB of uint16.
DEFAULT_SHARD_TOKENS = 64 << 20


@dataclass(frozen=True, slots=True)
class TokenShard:
    """A token shard written: its record, its tokens, the byte offset of its first token and
    its largest id."""

    record: ShardRecord
    tokens: int
    data_offset: int
    max_id: int


def group_documents(
    documents: Iterable[_T], length: Callable[[_T], int], shard_tokens: int
) -> Iterator[list[_T]]:
    """Cut documents, in stream order, into shards: a shard is closed at the first document
    boundary at or past ``shard_tokens`` tokens (``length`` gives a document's, end-of-text
    included); documents never cross shards."""
    group: list[_T] = []
    tokens = 0
    for document in documents:
        group.append(document)
        tokens += length(document)
        if tokens >= shard_tokens:
            yield group
            group, tokens = [], 0
    if group:
        yield group


def write_token_shard(
    store: Store,
    number: int,
    documents: Iterable[tuple[str, np.ndarray]],
    *,
    dtype: np.dtype[Any],
    eos_id: int | None = None,
) -> TokenShard:
    """Write documents as token shard ``number`` (one atomic ``put``), ``eos_id`` appended
    to each when given.

    Raises:
        ValueError: No documents, or a document that is not a non-empty 1-D array of ids
            that fit ``dtype``.
    """
    dtype, limit = _checked_dtype(dtype, eos_id)
    writer = TokenShardWriter(store, shard_name(number), number=number, dtype=dtype)
    max_id = -1 if eos_id is None else eos_id
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
        writer.add(key, tokens.astype(dtype, copy=False))
    count = writer.tokens
    record, offset = writer.close()
    return TokenShard(record, count, offset, max_id)


def write_token_index(
    store: Store,
    shards: Sequence[TokenShard],
    *,
    dtype: np.dtype[Any],
    eos_id: int | None = None,
    packed_with: Mapping[str, Any] | None = None,
    skipped: list[dict[str, str]] | None = None,
) -> DatasetIndex:
    """Write the index of ``shards`` (in stream order): the commit point of a token dataset.

    Raises:
        ValueError: No shards.
    """
    if not shards:
        raise ValueError("no documents to write")
    records = [shard.record for shard in shards]
    index = DatasetIndex.from_shards(
        records,
        class_names=[],
        fields={"tokens": sum(len(r.samples) for r in records)},
        packed_with=dict(packed_with or {}),
        skipped=skipped,
    )
    index.tokens = TokenLayout(
        dtype=_checked_dtype(dtype, eos_id)[0],
        eos_id=eos_id,
        max_id=max(shard.max_id for shard in shards),
        shard_tokens=np.asarray([shard.tokens for shard in shards], dtype=np.int64),
        data_offsets=np.asarray([shard.data_offset for shard in shards], dtype=np.int64),
    )
    write_index(store, index)
    return index


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

    A shard is closed at the first document boundary at or past ``shard_tokens`` (see
    :func:`group_documents`). ``eos_id``, when given, is appended to every document.

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
    _checked_dtype(dtype, eos_id)
    extra = 0 if eos_id is None else 1
    groups = group_documents(documents, lambda d: np.size(d[1]) + extra, shard_tokens)
    shards = [
        write_token_shard(store, n, group, dtype=dtype, eos_id=eos_id)
        for n, group in enumerate(groups)
    ]
    return write_token_index(
        store, shards, dtype=dtype, eos_id=eos_id, packed_with=packed_with, skipped=skipped
    )


def _checked_dtype(dtype: np.dtype[Any], eos_id: int | None) -> tuple[np.dtype[Any], int]:
    """The dtype, little-endian, and its largest id; refusing another dtype or an
    ``eos_id`` that does not fit it."""
    dtype = np.dtype(dtype).newbyteorder("<")
    if dtype.name not in TOKEN_LIMITS:
        raise ValueError(f"dtype {dtype.name} is not one of {sorted(TOKEN_LIMITS)}")
    limit = TOKEN_LIMITS[dtype.name]
    if eos_id is not None and not 0 <= eos_id <= limit:
        raise ValueError(f"eos_id {eos_id} does not fit {dtype.name} (0..{limit})")
    return dtype, limit
