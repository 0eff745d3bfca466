"""Side tables: rows equal the source array, bytes read stay within the rows asked for."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.errors import ShardFormatError
from stoker.format import sidetable
from stoker.format.sidetable import (
    SideTable,
    open_side_table,
    parse_npy_header,
    write_side_table,
)
from stoker.storage import MemoryStore, Store
from stoker.storage.cache import DiskCache
from stoker.storage.cached import CachedStore

dtypes = st.sampled_from(["<f2", "<f4", ">f8", "<i4", "u1", "?", "<c8", "S3"])
row_shapes = st.sampled_from([(), (1,), (7,), (4, 3), (0,)])


def _table(store: Store, array: np.ndarray, key: str = "features.npy") -> SideTable:
    write_side_table(store, key, array)
    return open_side_table(store, key)


def _read_bytes(store: Store) -> tuple[int, int]:
    snapshot = store.counters.snapshot()
    return snapshot.get("bytes.read", 0), snapshot.get("requests.get", 0)


def _runs(unique: np.ndarray) -> int:
    """Runs of adjacent row numbers in sorted distinct rows."""
    return int(len(unique) and 1 + np.count_nonzero(np.diff(unique) > 1))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 300),
    dtype=dtypes,
    row_shape=row_shapes,
    seed=st.integers(0, 2**32),
    batch=st.integers(0, 80),
    max_gap_rows=st.sampled_from([0, 0, 1, 5]),
)
def test_rows_equal_the_array_and_read_only_their_bytes(
    rows, dtype, row_shape, seed, batch, max_gap_rows
) -> None:
    rng = np.random.default_rng(seed)
    array = (rng.random((rows, *row_shape)) * 200).astype(dtype)
    store = MemoryStore()
    table = _table(store, array)
    assert (table.shape, table.dtype) == (array.shape, array.dtype)
    indices = rng.integers(-rows, rows, size=batch)  # repeats and negatives included
    max_gap_bytes = max_gap_rows * table.row_bytes
    before = _read_bytes(store)
    got = table.rows(indices, max_gap_bytes=max_gap_bytes)
    read, requests = (a - b for a, b in zip(_read_bytes(store), before, strict=True))
    np.testing.assert_array_equal(got, array[indices])
    assert got.shape == (batch, *row_shape)
    assert got.dtype == array.dtype
    unique = np.unique(indices % rows)
    wanted = len(unique) * table.row_bytes
    if max_gap_bytes == 0:  # exactly the rows asked for, one request per run of rows
        assert read == wanted
        assert requests == (_runs(unique) if table.row_bytes else 0)
    else:  # plus at most the gaps that were merged
        assert wanted <= read <= wanted + max(0, len(unique) - 1) * max_gap_bytes
        assert requests <= _runs(unique)
    assert table.counters.get("bytes.read") == read


@pytest.mark.parametrize("max_gap_bytes", [0, 64 << 10])
def test_rows_from_a_bucket(s3_bucket, max_gap_bytes) -> None:
    rng = np.random.default_rng(4)
    array = rng.standard_normal((3000, 256)).astype(np.float16)  # 512-byte rows
    store = s3_bucket.store("tables")
    table = _table(store, array, key="emb/features.npy")
    assert len(table) == 3000
    assert table.row_bytes == 512
    for _ in range(4):
        indices = rng.choice(3000, size=rng.integers(1, 200), replace=False)
        before = _read_bytes(store)
        got = table.rows(indices, max_gap_bytes=max_gap_bytes)
        read, requests = (a - b for a, b in zip(_read_bytes(store), before, strict=True))
        np.testing.assert_array_equal(got, array[indices])
        unique = np.unique(indices)
        wanted = len(unique) * 512
        if max_gap_bytes:
            assert wanted <= read <= wanted + (len(unique) - 1) * max_gap_bytes
            assert requests <= _runs(unique)
        else:
            assert (read, requests) == (wanted, _runs(unique))
    # A block of contiguous rows (what a block-shuffled read group asks for) is one request.
    before = _read_bytes(store)
    got = table.rows(np.random.default_rng(1).permutation(np.arange(640, 704)))
    assert tuple(a - b for a, b in zip(_read_bytes(store), before, strict=True)) == (64 * 512, 1)
    np.testing.assert_array_equal(np.sort(got, axis=0), np.sort(array[640:704], axis=0))


def test_rows_keep_any_index_shape_and_order() -> None:
    array = np.arange(50 * 3, dtype=np.int32).reshape(50, 3)
    table = _table(MemoryStore(), array)
    windows = np.array([[4, 5, 6, 7], [20, 21, 22, 23], [49, 48, 3, 3]])
    np.testing.assert_array_equal(table.rows(windows), array[windows])
    assert table.rows([]).shape == (0, 3)
    assert table.rows(np.zeros((2, 0), dtype=np.int64)).shape == (2, 0, 3)
    with pytest.raises(IndexError, match="row 50 out of range"):
        table.rows([1, 50])
    with pytest.raises(IndexError, match="row -51"):
        table.rows([-51])
    with pytest.raises(TypeError, match="integers"):
        table.rows([1.5])


def test_long_runs_are_split_into_capped_requests() -> None:
    array = np.arange(1000, dtype=np.float64)
    store = MemoryStore()
    table = _table(store, array)
    before = _read_bytes(store)
    got = table.rows(np.arange(1000)[::-1], max_run_bytes=800)  # 100 rows per request
    assert np.array_equal(got, array[::-1])
    assert tuple(a - b for a, b in zip(_read_bytes(store), before, strict=True)) == (8000, 10)
    before = _read_bytes(store)
    table.rows([0, 300, 999], max_gap_bytes=10_000, max_run_bytes=1)  # one row at least
    assert tuple(a - b for a, b in zip(_read_bytes(store), before, strict=True)) == (24, 3)


def _npy(array: np.ndarray, version: tuple[int, int] | None = None, **kw: bool) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version, **kw)
    return buffer.getvalue()


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_every_npy_version_opens(version) -> None:
    store = MemoryStore()
    array = np.arange(24, dtype=">i2").reshape(6, 4)
    store.put("t.npy", _npy(array, version))
    table = open_side_table(store, "t.npy")
    assert table.shape == (6, 4)
    assert table.dtype == np.dtype(">i2")
    np.testing.assert_array_equal(table.rows([5, 0]), array[[5, 0]])


def test_a_header_longer_than_the_first_read_is_fetched_whole() -> None:
    fields = [(f"field_{i:04d}", "<f4") for i in range(300)]  # a header of several KB
    array = np.zeros(5, dtype=fields)
    array["field_0123"] = np.arange(5)
    store = MemoryStore()
    store.put("wide.npy", _npy(array))
    table = open_side_table(store, "wide.npy")
    assert table.shape == (5,)
    assert table.rows([3, 2])["field_0123"].tolist() == [3.0, 2.0]
    assert store.counters.get("requests.get") == 3  # header in two reads, then the rows


def test_opening_costs_a_head_and_one_small_read() -> None:
    store = MemoryStore()
    write_side_table(store, "t.npy", np.zeros((100_000, 8), dtype=np.float32))
    open_side_table(store, "t.npy")
    counts = store.counters.snapshot()
    assert (counts["requests.head"], counts["requests.get"]) == (1, 1)
    assert counts["bytes.read"] <= 4096


def _header(text: str, version: tuple[int, int] = (1, 0)) -> bytes:
    body = text.encode("latin-1")
    length = struct.pack("<H" if version == (1, 0) else "<I", len(body))
    return sidetable.NPY_MAGIC + bytes(version) + length + body


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"PK\x03\x04 a zip file, not an npy file", "not an NPY file"),
        (b"\x93NUMPY\x04\x00" + b"\x00" * 60, "version 4.0"),
        (_header("{'descr': '<f4', 'fortran_order': False}"), "dict of descr"),
        (_header("[1, 2, 3]"), "dict of descr"),
        (_header("__import__('os').system('true')"), "not a Python literal"),
        (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, -1), }"), "shape"),
        (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (True,), }"), "shape"),
        (_header("{'descr': 'nonsense', 'fortran_order': False, 'shape': (3,), }"), "dtype"),
        (_header("{'descr': '<f4', 'fortran_order': 1, 'shape': (3,), }"), "fortran_order"),
        (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (), }"), "0-d"),
        (_header("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", (2, 0)), "objects"),
    ],
)
def test_garbage_headers_are_refused(data, message) -> None:
    store = MemoryStore()
    store.put("bad.npy", data)
    with pytest.raises(ShardFormatError, match=message):
        open_side_table(store, "bad.npy")


def test_pickled_fortran_and_mis_sized_files_are_refused() -> None:
    store = MemoryStore()
    objects = np.array([{"a": 1}, None, "x"], dtype=object)
    store.put("objects.npy", _npy(objects, allow_pickle=True))
    with pytest.raises(ShardFormatError, match="never unpickled"):
        open_side_table(store, "objects.npy")
    store.put("fortran.npy", _npy(np.asfortranarray(np.ones((3, 4)))))
    with pytest.raises(ShardFormatError, match="Fortran order"):
        open_side_table(store, "fortran.npy")
    whole = _npy(np.ones((10, 4), dtype=np.float32))
    store.put("short.npy", whole[:-1])
    with pytest.raises(ShardFormatError, match="truncated"):
        open_side_table(store, "short.npy")
    store.put("long.npy", whole + b"\x00")
    with pytest.raises(ShardFormatError, match="trailing"):
        open_side_table(store, "long.npy")
    store.put("tiny.npy", b"\x93NUMPY")
    with pytest.raises(ShardFormatError, match="too short"):
        open_side_table(store, "tiny.npy")
    store.put("cut.npy", whole[:40])
    with pytest.raises(ShardFormatError, match="header of"):
        open_side_table(store, "cut.npy")
    with pytest.raises(FileNotFoundError):
        open_side_table(store, "missing.npy")
    with pytest.raises(ShardFormatError, match="at most"):
        parse_npy_header(sidetable.NPY_MAGIC + b"\x02\x00" + struct.pack("<I", 1 << 30), where="x")


def test_write_side_table_stores_c_order_and_refuses_objects(monkeypatch) -> None:
    store = MemoryStore()
    fortran = np.asfortranarray(np.arange(12, dtype=np.uint16).reshape(3, 4))
    write_side_table(store, "c.npy", fortran)
    np.testing.assert_array_equal(open_side_table(store, "c.npy").rows([2, 1]), fortran[[2, 1]])
    assert np.load(io.BytesIO(bytes(store.get("c.npy"))), allow_pickle=False).flags.c_contiguous
    with pytest.raises(ValueError, match="Python objects"):
        write_side_table(store, "o.npy", np.array([None, 1], dtype=object))
    with pytest.raises(ValueError, match="dimension"):
        write_side_table(store, "s.npy", np.float32(1))
    # Large arrays go through a temporary file: the same bytes.
    monkeypatch.setattr(sidetable, "_IN_MEMORY_WRITE_BYTES", 0)
    write_side_table(store, "big.npy", fortran)
    assert bytes(store.get("big.npy")) == bytes(store.get("c.npy"))


def test_rows_through_the_disk_cache(tmp_path) -> None:
    rng = np.random.default_rng(9)
    array = rng.standard_normal((2000, 128)).astype(np.float32)  # 512-byte rows
    inner = MemoryStore()
    write_side_table(inner, "features.npy", array)
    page = 4096
    cached = CachedStore(inner, DiskCache(tmp_path / "cache", max_bytes=1 << 24), page_bytes=page)
    table = open_side_table(cached, "features.npy")
    indices = rng.choice(2000, size=150, replace=False)
    before = _read_bytes(inner)
    np.testing.assert_array_equal(table.rows(indices), array[indices])
    read = _read_bytes(inner)[0] - before[0]
    # The cache reads whole aligned pages: at most the pages the requested rows touch.
    offset = len(bytes(inner.get("features.npy"))) - array.nbytes
    starts = offset + np.unique(indices) * 512
    touched = np.unique(np.concatenate([starts // page, (starts + 511) // page]))
    assert read <= len(touched) * page
    # The same rows again: served from the cache, not one request to the bucket.
    before = _read_bytes(inner)
    np.testing.assert_array_equal(table.rows(indices[::-1]), array[indices[::-1]])
    assert _read_bytes(inner) == before
