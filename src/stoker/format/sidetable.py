"""Side tables: per-sample arrays stored once in the bucket, read by rows with ranged GETs.

A side table is one ``.npy`` file (for example an ``N x 4096`` float16 matrix of features)
whose row ``i`` belongs to sample ``i`` of a dataset. It is never copied into the shards:
:meth:`SideTable.rows` reads just the rows a batch needs.

- **Opening** costs a HEAD and one small ranged read: the NPY header (versions 1.0, 2.0 and
  3.0) is parsed here with :func:`ast.literal_eval`, which evaluates literals only. Arrays
  of Python objects (which NPY stores pickled) are refused, never unpickled; so are
  Fortran-ordered arrays, whose rows are not contiguous, and files whose size does not
  match their header.
- **Reading** sorts and de-duplicates the requested rows, merges rows no more than
  ``max_gap_bytes`` apart into one ranged read (default 0: only adjacent rows merge, so no
  byte outside the requested rows is read), issues all reads at once on the store's I/O
  engine, and returns the rows in the caller's order. Everything goes through the
  :class:`~stoker.storage.base.Store` protocol, so a caching store serves repeated rows.
"""

from __future__ import annotations

import ast
import asyncio
import io
import math
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stoker.core.metrics import Counters
from stoker.errors import ShardFormatError
from stoker.storage.base import ObjectMeta, Store

NPY_MAGIC = b"\x93NUMPY"
#: Rows closer than this are read by one request (the gap is read too).
DEFAULT_MAX_GAP_BYTES = 0
#: Cap on one ranged read.
DEFAULT_MAX_RUN_BYTES = 64 << 20
#: First read at open; numpy pads headers to 64 bytes, so this holds almost every header.
_FIRST_READ_BYTES = 4096
#: Longest header accepted (numpy's own reader stops at 10,000 by default).
MAX_HEADER_BYTES = 1 << 20
#: Arrays up to this size are written from memory; larger ones through a temporary file.
_IN_MEMORY_WRITE_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """What an NPY header says.

    Attributes:
        version: Format version, ``(1, 0)``, ``(2, 0)`` or ``(3, 0)``.
        dtype: Element type.
        shape: Array shape (C order).
        data_offset: Bytes from the start of the file to the first element.
    """

    version: tuple[int, int]
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    data_offset: int

    @property
    def data_bytes(self) -> int:
        """Bytes of the array's data."""
        return math.prod(self.shape) * self.dtype.itemsize


def npy_header_size(prefix: bytes | memoryview, *, where: str) -> int:
    """Bytes from the start of an NPY file to its data, from its first 12 bytes.

    Raises:
        ShardFormatError: Not an NPY file, an unknown version, or an oversized header.
    """
    prefix = bytes(prefix[:12])
    if prefix[:6] != NPY_MAGIC or len(prefix) < 10:
        raise ShardFormatError(f"{where}: not an NPY file (starts with {prefix[:8]!r})")
    version = (prefix[6], prefix[7])
    if version == (1, 0):
        (length,) = struct.unpack("<H", prefix[8:10])
        start = 10
    elif version in ((2, 0), (3, 0)) and len(prefix) == 12:
        (length,) = struct.unpack("<I", prefix[8:12])
        start = 12
    else:
        raise ShardFormatError(
            f"{where}: NPY version {version[0]}.{version[1]} is not supported (1.0, 2.0, 3.0)"
        )
    if length > MAX_HEADER_BYTES:
        raise ShardFormatError(
            f"{where}: NPY header of {length} bytes; at most {MAX_HEADER_BYTES} accepted"
        )
    return start + int(length)


def parse_npy_header(preamble: bytes | memoryview, *, where: str) -> NpyHeader:
    """Parse the header of an NPY file from its first bytes (at least the header's).

    Args:
        preamble: The file's first bytes.
        where: Named in error messages (the file's URL).

    Raises:
        ShardFormatError: The header is malformed, the array is Fortran-ordered, 0-d, or
            of a dtype that holds Python objects.
    """
    size = npy_header_size(preamble, where=where)
    if len(preamble) < size:
        raise ShardFormatError(f"{where}: NPY header cut short ({len(preamble)} of {size} bytes)")
    data = bytes(preamble[:size])
    version = (data[6], data[7])
    start = 10 if version == (1, 0) else 12
    try:
        text = data[start:size].decode("utf-8" if version == (3, 0) else "latin-1")
        header = ast.literal_eval(text)
    except (UnicodeDecodeError, SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        raise ShardFormatError(f"{where}: NPY header is not a Python literal") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ShardFormatError(
            f"{where}: NPY header must be a dict of descr, fortran_order and shape"
        )
    shape = header["shape"]
    if not isinstance(shape, tuple) or not all(
        type(n) is int and n >= 0
        for n in shape  # bool is an int subclass: refuse it
    ):
        raise ShardFormatError(f"{where}: NPY shape {shape!r} is not a tuple of sizes")
    if not isinstance(header["fortran_order"], bool):
        raise ShardFormatError(f"{where}: NPY fortran_order {header['fortran_order']!r}")
    if header["fortran_order"]:
        raise ShardFormatError(
            f"{where}: array is stored in Fortran order; side tables need C order "
            "(rewrite it with write_side_table, or np.save(np.ascontiguousarray(a)))"
        )
    try:
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise ShardFormatError(f"{where}: bad NPY dtype {header['descr']!r}: {exc}") from None
    if dtype.hasobject:
        raise ShardFormatError(
            f"{where}: dtype {dtype} holds Python objects (a pickled array); "
            "side tables are never unpickled"
        )
    if not shape:
        raise ShardFormatError(f"{where}: a 0-d array has no rows")
    return NpyHeader(version, dtype, shape, size)


class SideTable:
    """Rows of a ``.npy`` file in a store, read by ranged GETs.

    Use :func:`open_side_table` to make one. Row ``i`` is ``array[i]``.

    Args:
        store: Store holding the file.
        key: The file's key in ``store``.
        header: Its parsed header.

    Attributes:
        counters: ``requests.get``, ``bytes.read`` and ``rows.read`` of this table.
    """

    def __init__(self, store: Store, key: str, header: NpyHeader) -> None:
        self._store = store
        self._key = key
        self._header = header
        self._row_shape = header.shape[1:]
        self._row_bytes = math.prod(self._row_shape) * header.dtype.itemsize
        self.counters = Counters()

    @property
    def url(self) -> str:
        """The file's URL."""
        return f"{self._store.url.rstrip('/')}/{self._key}"

    @property
    def store(self) -> Store:
        """The store the rows are read from."""
        return self._store

    @property
    def key(self) -> str:
        """The file's key in the store."""
        return self._key

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape; ``shape[0]`` rows."""
        return self._header.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The array's element type (byte order as stored)."""
        return self._header.dtype

    @property
    def row_bytes(self) -> int:
        """Bytes of one row."""
        return self._row_bytes

    def __len__(self) -> int:
        return self._header.shape[0]

    def __repr__(self) -> str:
        return f"SideTable({self.url!r}, shape={self.shape}, dtype={self.dtype})"

    def rows(
        self,
        indices: np.ndarray | Sequence[int],
        *,
        max_gap_bytes: int = DEFAULT_MAX_GAP_BYTES,
        max_run_bytes: int = DEFAULT_MAX_RUN_BYTES,
    ) -> np.ndarray:
        """Return ``array[indices]``, read with as few ranged GETs as the limits allow.

        Args:
            indices: Row numbers, in any order and any shape, repeats allowed; negative
                numbers count from the end.
            max_gap_bytes: Rows at most this many bytes apart share one request.
            max_run_bytes: Most bytes in one request (at least one row is always read).

        Returns:
            A new array of shape ``indices.shape + shape[1:]``.

        Raises:
            IndexError: A row number is out of range.
            TypeError: ``indices`` are not integers.
        """
        return self._store.engine.run(
            self.rows_async(indices, max_gap_bytes=max_gap_bytes, max_run_bytes=max_run_bytes)
        )

    async def rows_async(
        self,
        indices: np.ndarray | Sequence[int],
        *,
        max_gap_bytes: int = DEFAULT_MAX_GAP_BYTES,
        max_run_bytes: int = DEFAULT_MAX_RUN_BYTES,
    ) -> np.ndarray:
        """Async form of :meth:`rows`; run it on the store's I/O engine."""
        wanted = np.asarray(indices)
        if wanted.size and not np.issubdtype(wanted.dtype, np.integer):
            raise TypeError(f"{self.url}: row indices must be integers, got {wanted.dtype}")
        wanted = wanted.astype(np.int64, copy=False)
        n = len(self)
        if wanted.size and (wanted.min() < -n or wanted.max() >= n):
            bad = wanted[(wanted < -n) | (wanted >= n)][0]
            raise IndexError(f"{self.url}: row {bad} out of range for {n} rows")
        unique, inverse = np.unique(wanted % n if n else wanted, return_inverse=True)
        found = np.empty((len(unique), *self._row_shape), dtype=self.dtype)
        if len(unique) and self._row_bytes:
            runs = _plan_runs(unique, self._row_bytes, max_gap_bytes, max_run_bytes)
            await asyncio.gather(*(self._read_run(unique, found, a, b) for a, b in runs))
        self.counters.add("rows.read", len(unique))
        return found[inverse.reshape(-1)].reshape(*wanted.shape, *self._row_shape)

    async def _read_run(self, unique: np.ndarray, found: np.ndarray, a: int, b: int) -> None:
        """Read rows ``unique[a:b]`` (all inside one request) into ``found[a:b]``."""
        first, last = int(unique[a]), int(unique[b - 1])
        start = self._header.data_offset + first * self._row_bytes
        data = await self._store.get_range_async(
            self._key, start=start, end=start + (last - first + 1) * self._row_bytes
        )
        self.counters.add("requests.get")
        self.counters.add("bytes.read", len(data))
        span = np.frombuffer(data, dtype=self.dtype).reshape(-1, *self._row_shape)
        found[a:b] = span[unique[a:b] - first]


def _plan_runs(
    unique: np.ndarray, row_bytes: int, max_gap_bytes: int, max_run_bytes: int
) -> list[tuple[int, int]]:
    """Cut sorted distinct rows into requests: ``(a, b)`` covers ``unique[a:b]``."""
    gaps = (np.diff(unique) - 1) * row_bytes
    breaks = np.concatenate([[0], np.flatnonzero(gaps > max_gap_bytes) + 1, [len(unique)]])
    rows_per_run = max(1, max_run_bytes // row_bytes)
    runs: list[tuple[int, int]] = []
    for a, b in zip(breaks[:-1].tolist(), breaks[1:].tolist(), strict=True):
        while a < b:
            # The first row past this request's reach starts the next one.
            stop = a + int(np.searchsorted(unique[a:b], unique[a] + rows_per_run))
            runs.append((a, stop))
            a = stop
    return runs


def open_side_table(store: Store, key: str) -> SideTable:
    """Open the ``.npy`` file at ``key`` as a side table: one HEAD and one small read.

    Args:
        store: Store holding the file (any store, caching ones included).
        key: The file's key in ``store``.

    Raises:
        FileNotFoundError: No object at ``key``.
        ShardFormatError: Not a C-ordered NPY array of plain data, or its size does not
            match its header.
    """
    where = f"{store.url.rstrip('/')}/{key}"
    size = store.head(key).size
    if size < 10:
        raise ShardFormatError(f"{where}: {size} bytes is too short for an NPY file")
    preamble = bytes(store.get_range(key, start=0, end=min(size, _FIRST_READ_BYTES)))
    needed = npy_header_size(preamble, where=where)
    if needed > size:
        raise ShardFormatError(f"{where}: NPY header of {needed} bytes in a {size}-byte file")
    if needed > len(preamble):
        preamble += bytes(store.get_range(key, start=len(preamble), end=needed))
    header = parse_npy_header(preamble, where=where)
    expected = header.data_offset + header.data_bytes
    if size != expected:
        raise ShardFormatError(
            f"{where}: {size} bytes, but a {header.dtype} array of shape {header.shape} "
            f"takes {expected} (truncated, or trailing bytes)"
        )
    return SideTable(store, key, header)


def write_side_table(store: Store, key: str, array: np.ndarray) -> ObjectMeta:
    """Write ``array`` to ``key`` as a C-ordered ``.npy`` file (never pickled).

    Args:
        store: Where to write.
        key: The file's key, by convention ending in ``.npy``.
        array: At least one dimension; row ``i`` belongs to sample ``i``.

    Returns:
        The written object's metadata.

    Raises:
        ValueError: ``array`` is 0-d or holds Python objects.
    """
    if np.ndim(array) == 0:
        raise ValueError("a side table needs at least one dimension (its rows)")
    data = np.ascontiguousarray(array)
    if data.dtype.hasobject:
        raise ValueError(f"dtype {data.dtype} holds Python objects; side tables hold plain data")
    if data.nbytes <= _IN_MEMORY_WRITE_BYTES:
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, data, allow_pickle=False)
        return store.put(key, buffer.getbuffer())
    with tempfile.TemporaryDirectory(prefix="stoker-sidetable-") as tmp:
        path = Path(tmp) / "table.npy"
        with open(path, "wb") as file:
            np.lib.format.write_array(file, data, allow_pickle=False)
        return store.put(key, path)
