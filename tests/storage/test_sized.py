"""A ranged read brings the whole object's size (S3's Content-Range, a local file's size):
the size check without a HEAD (storage/sized.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stoker.storage import Store, open_store
from stoker.storage.cache import DiskCache
from stoker.storage.cached import cache_reads
from stoker.storage.memory import MemoryStore
from stoker.storage.sized import SizeChangedError, get_parts_sized, get_range_sized

DATA = bytes(range(256)) * 40  # 10,240 bytes


def _stores(tmp_path: Path, bucket: Any) -> list[Store]:
    return [open_store(tmp_path / "local"), bucket.store("sized")]


def test_a_ranged_read_gives_the_whole_size_and_no_head(tmp_path: Path, s3_bucket: Any) -> None:
    for store in _stores(tmp_path, s3_bucket):
        store.put("obj", DATA)
        gets = store.counters.get("requests.get")
        parts, size = store.engine.run(
            get_parts_sized(store, "obj", start=100, end=612, parts=[(100, 200), (300, 612)])
        )
        assert [bytes(p) for p in parts] == [DATA[100:200], DATA[300:612]], store.url
        assert size == len(DATA), store.url
        assert store.counters.get("requests.get") - gets == 1, store.url
        assert store.counters.get("requests.head") == 0, store.url
        with pytest.raises(ValueError, match="ends past the object"):
            store.engine.run(get_range_sized(store, "obj", start=10_000, end=10_300))


def test_a_store_in_memory_gives_no_size() -> None:
    store = MemoryStore()
    store.put("obj", DATA)
    data, size = store.engine.run(get_range_sized(store, "obj", start=0, end=10))
    assert (bytes(data), size) == (DATA[:10], None)


def test_the_disk_cache_refuses_pages_of_an_object_of_another_size(
    tmp_path: Path, s3_bucket: Any
) -> None:
    store = s3_bucket.store("sized")
    store.put("obj", DATA + b"appended")
    disk = DiskCache(tmp_path / "cache", max_bytes=1 << 20)
    cached = cache_reads(store, disk, page_bytes=1024, objects={"obj": ("sha256:x", len(DATA))})
    for _ in range(2):  # refused again: nothing of it was cached
        with pytest.raises(SizeChangedError, match=rf"is {len(DATA) + 8} bytes") as caught:
            cached.engine.run(get_range_sized(cached, "obj", start=0, end=2000))
        assert (caught.value.expected, caught.value.actual) == (len(DATA), len(DATA) + 8)
    store.put("obj", DATA)
    data, size = cached.engine.run(get_range_sized(cached, "obj", start=0, end=2000))
    assert (bytes(data), size) == (DATA[:2000], len(DATA))
    gets = store.counters.get("requests.get")
    data, size = cached.engine.run(get_range_sized(cached, "obj", start=100, end=1500))
    assert (bytes(data), size) == (DATA[100:1500], len(DATA))  # from the cache
    assert store.counters.get("requests.get") == gets
    assert store.counters.get("requests.head") == 0
