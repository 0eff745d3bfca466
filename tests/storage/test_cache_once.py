"""fetch_once: a whole disk-cache entry made by one process of the node (issue 32 item 8)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from stoker.storage.cache import DiskCache
from stoker.storage.cache_once import fetch_once


def _cache(path: Path) -> DiskCache:
    return DiskCache(path, max_bytes=1 << 20)


def test_a_miss_is_fetched_and_stored_and_a_hit_is_not_fetched(tmp_path: Path) -> None:
    calls: list[int] = []

    def fetch() -> bytes:
        calls.append(1)
        return b"listing"

    cache = _cache(tmp_path / "c")
    assert fetch_once(cache, "k", fetch) == b"listing"
    assert fetch_once(_cache(tmp_path / "c"), "k", fetch) == b"listing"
    assert len(calls) == 1


def test_a_failed_fetch_is_raised_and_the_next_one_fetches(tmp_path: Path) -> None:
    cache = _cache(tmp_path / "c")

    def broken() -> bytes:
        raise OSError("listing failed")

    with pytest.raises(OSError, match="listing failed"):
        fetch_once(cache, "k", broken)
    assert fetch_once(cache, "k", lambda: b"second") == b"second"


def test_a_claim_held_too_long_is_fetched_here(tmp_path: Path) -> None:
    held = _cache(tmp_path / "c").claim("k")  # another process's claim, as flock sees it
    assert held is not None
    assert held.exclusive
    cache = _cache(tmp_path / "c")
    try:
        assert fetch_once(cache, "k", lambda: b"mine", wait_s=0.0) == b"mine"
    finally:
        held.release()
    assert cache.counters.get("cache.wait_timeouts") == 1


def _fetch_and_count(directory: str, log: str) -> None:
    def fetch() -> bytes:
        with open(log, "a") as f:  # one line per fetch, whichever process made it
            f.write(f"{os.getpid()}\n")
        return b"x" * 1000

    assert fetch_once(_cache(Path(directory)), "listing", fetch) == b"x" * 1000


def test_processes_missing_one_entry_fetch_it_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    log = tmp_path / "fetches"
    processes = [
        context.Process(target=_fetch_and_count, args=(str(tmp_path / "c"), str(log)))
        for _ in range(6)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0] * 6
    assert len(log.read_text().splitlines()) == 1
