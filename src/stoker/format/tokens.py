"""Token shards: tokenized documents stored as one contiguous array per shard.

A token dataset is a stoker dataset (``index.json``, ``index.bin``, tar shards) whose
samples are *documents*. Each shard holds one tar member, ``NNNNNN.tokens.npy``: a
one-dimensional little-endian ``uint16`` or ``uint32`` ``.npy`` array, the concatenated
tokens of the shard's documents (with the end-of-text id appended to each when the pack was
given one). The index's per-sample arrays describe the documents: ``offset`` is the byte
offset of a document's first token in its shard object, ``length`` its bytes, ``crc32`` the
CRC-32 of those bytes, ``key`` its name; labels are -1. The manifest's ``tokens`` section
(:class:`TokenLayout`) gives the dtype, the end-of-text id, the largest id, and for each
shard its token count and the byte offset of its first token.

So the dataset is one stream of tokens, shard after shard; token ``t`` of the stream is at
a byte offset found by arithmetic, a run of tokens is one ranged GET (two where it crosses
a shard), and document boundaries come from the index, never from scanning the tokens.
``tar tf`` lists the shards and ``numpy.load`` reads an extracted member.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.core.crc import crc32
from stoker.format.spec import TAR_BLOCK
from stoker.format.tar import member_header, padded
from stoker.format.writer import SampleRecord, ShardRecord
from stoker.storage.base import Store

#: The dtypes a token shard may hold, by name.
TOKEN_DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
#: The largest id each token dtype holds.
TOKEN_LIMITS = {"uint16": (1 << 16) - 1, "uint32": (1 << 32) - 1}
#: The extension of a token shard's one member.
TOKENS_EXTENSION = "tokens.npy"


def token_dtype(max_id: int) -> np.dtype[Any]:
    """The narrowest token dtype for ids up to ``max_id``: ``uint16`` when it fits."""
    if max_id < 0 or max_id > TOKEN_LIMITS["uint32"]:
        raise ValueError(f"token id {max_id} does not fit an unsigned 32-bit integer")
    return TOKEN_DTYPES["uint16" if max_id <= TOKEN_LIMITS["uint16"] else "uint32"]


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """The manifest's ``tokens`` section: how a token dataset's shards hold its stream.

    Attributes:
        dtype: ``uint16`` or ``uint32`` (little-endian).
        eos_id: The end-of-text id appended to every document at pack time, or None.
        max_id: The largest token id in the dataset.
        shard_tokens: Tokens in each shard.
        data_offsets: Byte offset of each shard's first token in the shard object.
    """

    dtype: np.dtype[Any]
    eos_id: int | None
    max_id: int
    shard_tokens: np.ndarray
    data_offsets: np.ndarray

    @property
    def itemsize(self) -> int:
        """Bytes per token."""
        return int(self.dtype.itemsize)

    @property
    def tokens(self) -> int:
        """Tokens in the whole stream."""
        return int(self.shard_tokens.sum())

    @property
    def shard_starts(self) -> np.ndarray:
        """The stream position of each shard's first token, and the total at the end."""
        starts = np.zeros(len(self.shard_tokens) + 1, dtype=np.int64)
        np.cumsum(self.shard_tokens, out=starts[1:])
        return starts

    def to_json(self) -> dict[str, Any]:
        """The manifest section."""
        return {
            "dtype": self.dtype.name,
            "eos_id": self.eos_id,
            "max_id": self.max_id,
            "tokens": self.tokens,
            "shards": [
                {"tokens": int(n), "data_offset": int(o)}
                for n, o in zip(self.shard_tokens, self.data_offsets, strict=True)
            ],
        }

    @classmethod
    def from_json(cls, section: Any, *, shards: int) -> TokenLayout:
        """Parse and check the manifest section written by :meth:`to_json`.

        Raises:
            ValueError: A field missing, of the wrong type or out of range, or a shard count
                other than the manifest's.
        """
        if not isinstance(section, Mapping):
            raise ValueError("tokens: expected an object")
        dtype = section.get("dtype")
        if dtype not in TOKEN_DTYPES:
            raise ValueError(f"tokens.dtype: {dtype!r} is not one of {sorted(TOKEN_DTYPES)}")
        eos_id, max_id = section.get("eos_id"), section.get("max_id")
        limit = TOKEN_LIMITS[dtype]
        for name, value in (("eos_id", eos_id), ("max_id", max_id)):
            if value is None and name == "eos_id":
                continue
            if type(value) is not int or not 0 <= value <= limit:
                raise ValueError(f"tokens.{name}: {value!r} is not an id a {dtype} holds")
        entries = section.get("shards")
        if not isinstance(entries, list) or len(entries) != shards:
            raise ValueError(f"tokens.shards: expected a list of {shards} entries")
        counts, offsets = [], []
        for n, entry in enumerate(entries):
            values = [entry.get(k) if isinstance(entry, Mapping) else None for k in _SHARD_KEYS]
            if not all(type(v) is int and 0 <= v < 1 << 62 for v in values):
                raise ValueError(f"tokens.shards[{n}]: expected non-negative integer {_SHARD_KEYS}")
            counts.append(values[0])
            offsets.append(values[1])
        layout = cls(
            dtype=TOKEN_DTYPES[dtype],
            eos_id=eos_id,
            max_id=int(max_id),  # type: ignore[arg-type]  # checked above
            shard_tokens=np.asarray(counts, dtype=np.int64),
            data_offsets=np.asarray(offsets, dtype=np.int64),
        )
        if section.get("tokens") != layout.tokens:
            raise ValueError(f"tokens.tokens: {section.get('tokens')!r} != the shards' sum")
        return layout

    def ranges(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """Where stream tokens ``[start, stop)`` lie: ``(shard, byte_start, byte_end)`` per
        shard they touch, in stream order (one range, or more where they cross shards).

        Raises:
            IndexError: The range is empty or runs outside the stream.
        """
        starts = self.shard_starts
        if not 0 <= start < stop <= int(starts[-1]):
            raise IndexError(f"tokens [{start}, {stop}) outside the stream of {starts[-1]}")
        first = int(np.searchsorted(starts, start, side="right")) - 1
        out = []
        shard = first
        while start < stop:
            end = min(stop, int(starts[shard + 1]))
            if end > start:
                base = int(self.data_offsets[shard]) - int(starts[shard]) * self.itemsize
                out.append((shard, base + start * self.itemsize, base + end * self.itemsize))
            start = end
            shard += 1
        return out


_SHARD_KEYS = ("tokens", "data_offset")


def npy_header(dtype: np.dtype[Any], count: int) -> bytes:
    """A ``.npy`` version 1.0 header for a one-dimensional array of ``count`` items,
    padded (as numpy pads) so the data after it starts 64-byte aligned."""
    text = f"{{'descr': '{dtype.str}', 'fortran_order': False, 'shape': ({count},), }}"
    prefix = 10  # magic (6), version (2), header length (2)
    total = -(-(prefix + len(text) + 1) // 64) * 64
    text += " " * (total - prefix - len(text) - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + (total - prefix).to_bytes(2, "little") + text.encode("ascii")


class TokenShardWriter:
    """Collects documents' tokens into one token shard and writes it with one atomic ``put``.

    Args:
        store: Where the shard goes.
        name: Its object name (``shard-000000.tar``).
        number: The shard's number, which names its member (``000000.tokens.npy``).
        dtype: The dataset's token dtype.
    """

    def __init__(self, store: Store, name: str, *, number: int, dtype: np.dtype[Any]) -> None:
        if dtype not in TOKEN_DTYPES.values():
            raise ValueError(f"dtype {dtype} is not one of {sorted(TOKEN_DTYPES)}")
        self._store, self._name, self._number, self._dtype = store, name, number, dtype
        self._parts: list[bytes] = []
        self._docs: list[tuple[str, int, int]] = []  # key, byte offset in the data, CRC-32
        self._bytes = 0

    @property
    def tokens(self) -> int:
        """Tokens added so far."""
        return self._bytes // self._dtype.itemsize

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, key: str, tokens: np.ndarray) -> None:
        """Append a document's tokens (already in the dataset's dtype, end-of-text included).

        Raises:
            ValueError: Not a non-empty one-dimensional array of the shard's dtype.
        """
        if tokens.dtype != self._dtype or tokens.ndim != 1 or not len(tokens):
            raise ValueError(
                f"document {key!r}: expected a non-empty 1-D {self._dtype} array, "
                f"got {tokens.dtype} of shape {tokens.shape}"
            )
        data = np.ascontiguousarray(tokens).tobytes()
        self._docs.append((key, self._bytes, crc32(data)))
        self._parts.append(data)
        self._bytes += len(data)

    def close(self) -> tuple[ShardRecord, int]:
        """Write the shard; return its record (one sample per document) and the byte offset
        of its first token.

        Raises:
            ValueError: No document was added.
        """
        if not self._docs:
            raise ValueError(f"token shard {self._name} has no documents")
        header = npy_header(self._dtype, self.tokens)
        size = len(header) + self._bytes
        member = member_header(f"{self._number:06d}.{TOKENS_EXTENSION}", size)
        data_offset = len(member) + len(header)
        body = b"".join(
            [member, header, *self._parts, bytes(padded(size) - size), bytes(2 * TAR_BLOCK)]
        )
        self._store.put(self._name, body)
        ends = [offset for _, offset, _ in self._docs[1:]] + [self._bytes]
        samples = [
            SampleRecord(key, -1, data_offset + offset, end - offset, crc)
            for (key, offset, crc), end in zip(self._docs, ends, strict=True)
        ]
        record = ShardRecord(self._name, len(body), hashlib.sha256(body).hexdigest(), samples)
        self._parts, self._docs, self._bytes = [], [], 0
        return record, data_offset


def document_starts(
    layout: TokenLayout, shard: np.ndarray, offset: np.ndarray, length: np.ndarray
) -> np.ndarray:
    """Stream position of each document's first token, plus the total at the end, from the
    index's per-document arrays (no token is read).

    Raises:
        ValueError: The documents do not tile the stream exactly, in order.
    """
    shard = np.asarray(shard, dtype=np.int64)
    item = layout.itemsize
    within = (np.asarray(offset, dtype=np.int64) - layout.data_offsets[shard]) // item
    starts = np.append(layout.shard_starts[shard] + within, layout.tokens).astype(np.int64)
    lengths = np.asarray(length, dtype=np.int64) // item
    if len(lengths) and not (
        starts[0] == 0 and np.array_equal(starts[:-1] + lengths, starts[1:]) and lengths.min() > 0
    ):
        raise ValueError("documents do not tile the token stream in order")
    return starts
