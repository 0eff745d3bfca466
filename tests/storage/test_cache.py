"""DiskCache and CachedStore: bounded, LRU, crash-safe, shared by processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.storage import CachedStore, DiskCache, MemoryStore, open_store
from stoker.storage.cached import cache_reads
from stoker.storage.engine import default_engine


def _entry_files(directory: Path) -> list[Path]:
    return [p for p in (directory / "v1" / "entries").rglob("*") if p.is_file()]


def test_round_trip_and_counters(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1 << 20)
    assert cache.get("a") is None
    cache.put("a", b"hello")
    assert cache.get("a") == b"hello"
    counts = cache.counters.snapshot()
    assert counts["cache.hits"] == 1
    assert counts["cache.misses"] == 1
    assert counts["cache.writes"] == 1


def test_a_damaged_entry_is_removed_never_returned(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1 << 20)
    cache.put("a", b"x" * 1000)
    (entry,) = _entry_files(tmp_path)
    data = bytearray(entry.read_bytes())
    data[500] ^= 0xFF
    entry.write_bytes(bytes(data))
    assert cache.get("a") is None
    assert not entry.exists()
    assert cache.counters.get("cache.damaged") == 1
    cache.put("a", b"y" * 10)
    (entry,) = _entry_files(tmp_path)
    entry.write_bytes(entry.read_bytes()[:-3])  # truncated, as after a power loss
    assert cache.get("a") is None


def test_the_limit_holds_and_recently_used_entries_stay(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=100_000)
    cache.put("keep", b"k" * 9_000)
    for n in range(40):
        cache.put(f"e{n}", bytes([n]) * 9_000)
        # Entries' last use is their mtime: make "keep" the most recent every time.
        os.utime(
            cache._path("keep"),
            (time.time() + 1000, time.time() + 1000),
        )
        assert cache.bytes <= 100_000
    assert cache.get("keep") == b"k" * 9_000
    assert cache.counters.get("cache.evictions") > 0
    # The oldest entries went first.
    assert cache.get("e0") is None
    assert cache.get("e39") == bytes([39]) * 9_000


def test_crash_leftovers_are_removed_on_open(tmp_path: Path) -> None:
    DiskCache(tmp_path, max_bytes=1 << 20)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    leftover = tmp_path / "v1" / "tmp" / f"{dead.stdout.strip()}-abc"
    leftover.write_bytes(b"half")
    old = time.time() - 120
    os.utime(leftover, (old, old))
    mine = tmp_path / "v1" / "tmp" / f"{os.getpid()}-def"
    mine.write_bytes(b"in progress")
    DiskCache(tmp_path, max_bytes=1 << 20)
    assert not leftover.exists()
    assert mine.exists()  # a live writer's file is left alone


def test_cached_store_pages_serve_any_range(tmp_path: Path) -> None:
    source = MemoryStore()
    blob = os.urandom(10_000)
    source.put("obj", blob)
    store = CachedStore(source, DiskCache(tmp_path, max_bytes=1 << 20), page_bytes=1000)
    assert bytes(store.get_range("obj", start=1500, end=3500)) == blob[1500:3500]
    assert source.counters.get("requests.get") == 1
    assert source.counters.get("bytes.read") == 3000  # pages 1..3, one request
    # Overlapping read: pages 2 and 3 come from the cache, page 4 is fetched.
    assert bytes(store.get_range("obj", start=2999, end=4001)) == blob[2999:4001]
    assert source.counters.get("requests.get") == 2
    assert source.counters.get("bytes.read") == 4000
    with pytest.raises(ValueError, match="past the object"):
        store.get_range("obj", start=9000, end=10_001)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ranges=st.lists(st.tuples(st.integers(0, 4999), st.integers(1, 1500)), min_size=1, max_size=12),
    page=st.sampled_from([7, 256, 1000, 6000]),
)
def test_async_reads_equal_the_source(
    tmp_path_factory: pytest.TempPathFactory, ranges: list[tuple[int, int]], page: int
) -> None:
    source = MemoryStore()
    blob = os.urandom(5000)
    source.put("o", blob)
    cache = DiskCache(tmp_path_factory.mktemp("c"), max_bytes=1 << 20)
    store = CachedStore(source, cache, page_bytes=page, objects={"o": ("v1", 5000)})
    spans = [(s, min(5000, s + n)) for s, n in ranges]

    async def read_all() -> list[bytes]:
        views = await asyncio.gather(
            *(store.get_range_async("o", start=s, end=e) for s, e in spans)
        )
        return [bytes(v) for v in views]

    engine = default_engine()
    for _ in range(2):  # cold, then warm
        assert engine.run(read_all()) == [blob[s:e] for s, e in spans]
    requested = source.counters.get("bytes.read")
    touched = {p for s, e in spans for p in range(s // page, (e - 1) // page + 1)}
    assert requested <= len(touched) * page  # every page fetched at most once


def test_concurrent_reads_of_a_missing_page_share_one_request(tmp_path: Path) -> None:
    source = MemoryStore()
    source.put("o", b"z" * 4096)
    store = CachedStore(source, DiskCache(tmp_path, max_bytes=1 << 20), page_bytes=4096)

    async def many() -> list[memoryview]:
        return list(
            await asyncio.gather(
                *(store.get_range_async("o", start=i, end=i + 10) for i in range(20))
            )
        )

    assert all(bytes(v) == b"z" * 10 for v in default_engine().run(many()))
    assert source.counters.get("requests.get") == 1


def test_a_rewritten_object_is_never_served_stale(tmp_path: Path) -> None:
    source = MemoryStore()
    source.put("o", b"a" * 100)
    cache = DiskCache(tmp_path, max_bytes=1 << 20)
    assert bytes(CachedStore(source, cache).get_range("o", start=0, end=10)) == b"a" * 10
    source.put("o", b"b" * 100)
    # A new process (a new CachedStore) sees the new ETag and misses the old entry.
    assert bytes(CachedStore(source, cache).get_range("o", start=0, end=10)) == b"b" * 10


def test_a_full_disk_turns_caching_off_with_a_warning(
    small_tmpfs: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    tiny_disk = small_tmpfs("256k")
    cache = DiskCache(tiny_disk, max_bytes=1 << 30)  # the limit is not what stops it
    source = MemoryStore()
    blob = os.urandom(1 << 20)
    source.put("o", blob)
    store = CachedStore(source, cache, page_bytes=64 << 10)
    assert bytes(store.get_range("o", start=0, end=1 << 20)) == blob  # reads go on
    assert "no space left on the device" in caplog.text
    assert str(tiny_disk) in caplog.text
    assert cache.counters.get("cache.errors") == 1
    assert list((tiny_disk / "v1" / "tmp").iterdir()) == []  # nothing half-written left
    stored = len(_entry_files(tiny_disk))
    assert stored >= 1
    # What did fit is whole and is served; nothing more is written.
    assert bytes(store.get_range("o", start=0, end=1 << 20)) == blob
    assert cache.counters.get("cache.hits") == stored
    assert cache.counters.get("cache.damaged") == 0


WORKER = textwrap.dedent(
    """
    import hashlib, sys
    from stoker.storage import CachedStore, DiskCache, open_store
    root, cache_dir, limit, page = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    source = open_store(root)
    cache = DiskCache(cache_dir, max_bytes=limit)
    store = CachedStore(source, cache, page_bytes=page)
    names = sorted(m.key for m in source.list())
    bad = 0
    for rnd in range(3):
        for name in names:
            size = source.head(name).size
            data = bytes(store.get_range(name, start=0, end=size))
            if hashlib.sha256(data).hexdigest() != name.split(".")[0]:
                bad += 1
            assert cache.bytes <= limit + page + 16, cache.bytes
    print(bad, source.counters.get("requests.get"), cache.counters.get("cache.hits"))
    """
)


def test_eight_processes_share_one_bounded_cache(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for n in range(24):
        blob = os.urandom(50_000 + n)
        digest = __import__("hashlib").sha256(blob).hexdigest()
        (data_dir / f"{digest}.bin").write_bytes(blob)
    dataset_bytes = sum(p.stat().st_size for p in data_dir.iterdir())
    limit = dataset_bytes // 2
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cache_dir = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(data_dir), str(cache_dir), str(limit), "16384"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append([int(x) for x in out.split()])
    assert all(bad == 0 for bad, _, _ in results)  # no corrupt read, ever
    assert sum(hits for _, _, hits in results) > 0  # entries are shared
    cache = DiskCache(cache_dir, max_bytes=limit)
    assert cache.bytes <= limit
    assert list((cache_dir / "v1" / "tmp").iterdir()) == []
    assert open_store(str(data_dir)).counters.get("requests.get") == 0


def test_cache_reads_never_caches_twice(tmp_path: Path) -> None:
    source = MemoryStore()
    source.put("o", b"q" * 300)
    first = cache_reads(source, DiskCache(tmp_path / "a", max_bytes=1 << 20), page_bytes=100)
    second_cache = DiskCache(tmp_path / "b", max_bytes=1 << 20)
    second = cache_reads(first, second_cache, page_bytes=50, objects={"o": ("v", 300)})
    assert second.inner is source
    assert second.cache is second_cache
    assert bytes(second.get_range("o", start=0, end=120)) == b"q" * 120
    assert first.cache.entries() == 0  # nothing went through the first cache
    assert second_cache.entries() == 3


def test_a_loader_evicting_never_deletes_or_writes_through_a_link(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22.2: a Loader evicting deleted the files of a folder linked into the cache, as
    its oldest entries; and it wrote entries into a folder linked in place of one of its own."""
    from stoker import CacheConfig
    from stoker.pack.packer import PackConfig, pack
    from stoker.pipeline.loader import Loader
    from stoker.testing.images import write_image_folder

    write_image_folder(tmp_path / "src", files=40, classes=2, width=48, height=40)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=10))
    cache_dir = tmp_path / "cache"
    DiskCache(cache_dir, max_bytes=1 << 20)
    victim = tmp_path / "victim"
    victim.mkdir()
    for n in range(3):
        file = victim / (f"{n:02x}" * 32)  # named as an entry would be
        file.write_bytes(b"someone's data")
        os.utime(file, (1, 1))  # older than any entry
    (victim / "notes.txt").write_bytes(b"mine")
    before = {p.name: p.read_bytes() for p in victim.iterdir()}
    entries = cache_dir / "v1" / "entries"
    (entries / "zz").symlink_to(victim, target_is_directory=True)
    for prefix in range(64):  # a quarter of the entries' folders are links
        (entries / f"{prefix:02x}").symlink_to(victim, target_is_directory=True)
    cache = CacheConfig(dir=cache_dir, max_bytes=48 << 10, page_bytes=4096)
    with Loader(tmp_path / "ds", batch_size=8, cache=cache) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sum(len(batch["key"]) for batch in loader) == 40
        counts = loader.stats().disk_cache
    assert counts["cache.evictions"] > 0
    assert counts["cache.writes"] > 0
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before
    assert "left alone" in caplog.text
    assert f"{entries / '00'} (a symbolic link to {victim})" in caplog.text
