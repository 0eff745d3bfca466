"""Reads of parts through the disk cache: only the parts' bytes are read from cached pages,
and a damaged page is found, removed and fetched again, never returned (issue 25.2)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stoker.format.reader import ShardDataset, open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.storage.cache import DiskCache
from stoker.storage.cached import CachedStore, cache_reads
from stoker.storage.memory import MemoryStore
from stoker.testing.images import write_image_folder

PAGE = 4096
DATA = random.Random(0).randbytes(4 * PAGE + 100)


def _cached(tmp_path: Path) -> tuple[MemoryStore, CachedStore]:
    store = MemoryStore()
    store.put("obj", DATA)
    return store, CachedStore(
        store, DiskCache(tmp_path / "cache", max_bytes=1 << 24), page_bytes=PAGE
    )


def _entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").glob("v1/entries/*/*"))


def test_parts_of_cached_pages_count_only_their_bytes(tmp_path: Path) -> None:
    store, cached = _cached(tmp_path)
    parts = [(10, 50), (PAGE - 6, PAGE + 10), (3 * PAGE + 1, 3 * PAGE + 2)]
    cold = cached.get_parts("obj", start=10, end=3 * PAGE + 2, parts=parts)
    assert [bytes(p) for p in cold] == [DATA[s:e] for s, e in parts]
    # Pages 0-1 in one ranged GET, page 3 in another; page 2 holds no part and is not read.
    assert store.counters.get("requests.get") == 2
    assert store.counters.get("bytes.read") == 3 * PAGE
    assert cached.cache.counters.get("cache.bytes_hit") == 0
    warm = cached.get_parts("obj", start=10, end=3 * PAGE + 2, parts=parts)
    assert [bytes(p) for p in warm] == [DATA[s:e] for s, e in parts]
    assert store.counters.get("requests.get") == 2
    assert cached.cache.counters.get("cache.bytes_hit") == sum(e - s for s, e in parts) == 57


def test_a_store_without_cache_reads_parts_in_one_request() -> None:
    store = MemoryStore()
    store.put("obj", DATA)
    got = store.get_parts("obj", start=100, end=9000, parts=[(100, 110), (8000, 9000)])
    assert [bytes(p) for p in got] == [DATA[100:110], DATA[8000:9000]]
    assert store.counters.get("bytes.read") == 8900
    assert store.counters.get("requests.get") == 1
    with pytest.raises(ValueError, match="bad part"):
        store.get_parts("obj", start=100, end=200, parts=[(50, 150)])


@pytest.mark.parametrize("damage", ["truncated", "header"])
def test_a_damaged_entry_is_removed_and_fetched_again(tmp_path: Path, damage: str) -> None:
    store, cached = _cached(tmp_path)
    cached.get_range("obj", start=0, end=len(DATA))  # every page cached
    victim = _entries(tmp_path)[0]
    raw = victim.read_bytes()
    victim.write_bytes(raw[:-1] if damage == "truncated" else b"XXXX" + raw[4:])
    # a part in every page, whichever page the damaged entry holds
    parts = [(s, s + 7) for s in range(0, len(DATA) - 7, 1000)] + [(len(DATA) - 7, len(DATA))]
    got = cached.get_parts("obj", start=0, end=len(DATA), parts=parts)
    assert [bytes(p) for p in got] == [DATA[s:e] for s, e in parts]
    assert cached.cache.counters.get("cache.damaged") == 1
    assert store.counters.get("requests.get") == 2  # the damaged page, fetched again
    assert victim.read_bytes() == raw  # and cached again, whole


def test_a_flipped_byte_in_a_cached_page_never_reaches_a_sample(tmp_path: Path) -> None:
    # A part of a page has no CRC of its own: the sample's CRC-32 from the index finds the
    # damage, and the whole page, read again, fails its CRC-32 and is fetched afresh.
    write_image_folder(tmp_path / "src", files=12, classes=2, width=32, height=24)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=12))
    plain = open_dataset(str(tmp_path / "ds"))
    disk = DiskCache(tmp_path / "cache", max_bytes=1 << 24)
    shard = plain.shards[0]
    store = cache_reads(
        plain.store, disk, page_bytes=PAGE, objects={shard.name: (shard.sha256, shard.size)}
    )
    dataset = ShardDataset(store, plain.index)
    expected = dataset.read_many(range(12), max_gap_bytes=0)
    for entry in _entries(tmp_path):
        raw = bytearray(entry.read_bytes())
        raw[-1] ^= 0xFF  # the header stays right: only a CRC-32 can tell
        entry.write_bytes(bytes(raw))
    assert dataset.read_many(range(12), max_gap_bytes=0) == expected
    assert disk.counters.get("cache.damaged") >= 1
