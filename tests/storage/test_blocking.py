"""The storage seam: blocking forms derived from the async ones, run on the store's engine."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stoker.storage import CachedStore, DiskCache, IOEngine, MemoryStore, default_engine, open_store


class _SlowStore(MemoryStore):
    """Ranged reads take a while, so that concurrent ones overlap."""

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        await asyncio.sleep(0.05)
        return await super().get_range_async(path, start=start, end=end)


def test_blocking_cached_reads_of_a_missing_page_share_one_request(tmp_path: Path) -> None:
    source = _SlowStore()
    source.put("o", b"z" * 4096)
    store = CachedStore(
        source, DiskCache(tmp_path, max_bytes=1 << 20), page_bytes=4096, objects={"o": ("v", 4096)}
    )
    threads = 16
    barrier = threading.Barrier(threads)

    def read(i: int) -> bytes:
        barrier.wait()
        return bytes(store.get_range("o", start=i, end=i + 10))

    with ThreadPoolExecutor(threads) as pool:
        assert list(pool.map(read, range(threads))) == [b"z" * 10] * threads
    assert source.counters.get("requests.get") == 1


def test_blocking_cached_ranges_of_an_unknown_object_make_one_head(tmp_path: Path) -> None:
    source = MemoryStore()
    source.put("o", bytes(range(200)))
    store = CachedStore(source, DiskCache(tmp_path, max_bytes=1 << 20), page_bytes=16)
    views = store.get_ranges("o", starts=[0, 50, 100], ends=[10, 60, 110])
    assert [bytes(v) for v in views] == [bytes(range(200))[s : s + 10] for s in (0, 50, 100)]
    assert source.counters.get("requests.head") == 1


def test_the_engine_is_the_stores_own(tmp_path: Path) -> None:
    engine = IOEngine(max_in_flight=2, name="test-seam")
    try:
        memory = MemoryStore("seam", engine=engine)
        assert memory.engine is engine
        assert MemoryStore().engine is default_engine()
        cached = CachedStore(memory, DiskCache(tmp_path, max_bytes=1 << 20))
        assert cached.engine is engine
        memory.put("k", b"v")
        assert bytes(cached.get("k")) == b"v"
    finally:
        engine.close()


def test_cache_and_options_of_each_backend(tmp_path: Path) -> None:
    local = open_store(tmp_path / "root", storage_options={"part_size_bytes": 6 << 20})
    assert local.cache is None
    assert local.options.part_size_bytes == 6 << 20
    disk = DiskCache(tmp_path / "cache", max_bytes=1 << 20)
    cached = CachedStore(local, disk)
    assert cached.cache is disk
    assert cached.options is local.options
    assert cached.engine is local.engine
    assert MemoryStore().cache is None


def test_blocking_forms_refuse_the_engine_thread() -> None:
    store = MemoryStore()
    store.put("k", b"v")

    async def blocking_inside() -> memoryview:
        return store.get("k")

    with pytest.raises(RuntimeError, match="engine thread"):
        store.engine.run(blocking_inside())
