"""Processes of a node that miss the same disk-cache pages at once fetch each page from
the store once: one claims it, the others wait for it in the cache; a dead claimant's
claim is taken over, and a live one is waited for only so long (issue 25.2)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from stoker.storage.cache import DiskCache
from stoker.storage.cached import CachedStore
from stoker.storage.memory import MemoryStore

PAGE = 4096
PAGES = 8
DATA = random.Random(0).randbytes(PAGES * PAGE)
OBJECTS = {"obj": ("v1", len(DATA))}


class SlowStore(MemoryStore):
    """A memory store whose ranged reads take ``delay_s``: long enough for several
    processes' reads to overlap."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.put("obj", DATA)

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        await asyncio.sleep(self.delay_s)
        return await super().get_range_async(path, start=start, end=end)


def _cached(directory: str, delay_s: float, claim_wait_s: float = 30.0) -> CachedStore:
    cache = DiskCache(directory, max_bytes=1 << 24)
    store = SlowStore(delay_s)
    return CachedStore(store, cache, page_bytes=PAGE, objects=OBJECTS, claim_wait_s=claim_wait_s)


def _read_all(directory: str, barrier: Any, out: Any) -> None:
    cached = _cached(directory, delay_s=0.5)
    barrier.wait()
    ok = bytes(cached.get_range("obj", start=0, end=len(DATA))) == DATA
    counters = cached.inner.counters
    out.put((ok, counters.get("requests.get"), counters.get("bytes.read")))


def _hang_on_pages(directory: str) -> None:
    # Claims pages 2-3, then never finishes fetching them (until killed).
    _cached(directory, delay_s=3600).get_range("obj", start=2 * PAGE, end=4 * PAGE)


def test_two_processes_fetch_each_missed_page_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    barrier, out = context.Barrier(2), context.Queue()
    workers = [
        context.Process(target=_read_all, args=(str(tmp_path), barrier, out)) for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=10)
    assert all(ok for ok, _, _ in results)
    assert sum(read for _, _, read in results) == len(DATA)  # each page from the store once
    assert sum(gets for _, gets, _ in results) <= PAGES


def test_a_dead_claimants_claim_is_taken_over_and_a_live_one_waited_for_a_while(
    tmp_path: Path,
) -> None:
    context = multiprocessing.get_context("spawn")
    hanging = context.Process(target=_hang_on_pages, args=(str(tmp_path),))
    hanging.start()
    try:
        claims = tmp_path / "v1" / "claims"
        deadline = time.monotonic() + 60
        while len(list(claims.glob("*"))) < 2:
            assert hanging.is_alive()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert {f.read_text() for f in claims.glob("*")} == {f"{hanging.pid}\n"}
        # Alive: waited for claim_wait_s, then fetched here.
        bounded = _cached(str(tmp_path), delay_s=0.0, claim_wait_s=0.3)
        assert (
            bytes(bounded.get_range("obj", start=2 * PAGE, end=3 * PAGE))
            == DATA[2 * PAGE : 3 * PAGE]
        )
        assert bounded.cache.counters.get("cache.wait_timeouts") == 1  # waited, then fetched
        os.kill(hanging.pid or 0, signal.SIGKILL)
        hanging.join(timeout=10)
        # Dead: its claim on page 3 is taken over at once, however long a wait is allowed.
        patient = _cached(str(tmp_path), delay_s=0.0, claim_wait_s=3600)
        got = patient.get_range("obj", start=3 * PAGE, end=4 * PAGE)
        assert bytes(got) == DATA[3 * PAGE : 4 * PAGE]
        assert patient.cache.counters.get("cache.waits") == 0  # taken over, not waited for
        assert patient.inner.counters.get("requests.get") == 1
        # The taker removed the claim it took over; page 2's stays until a cache is opened
        # a minute after its owner died.
        assert len(list(claims.glob("*"))) == 1
    finally:
        if hanging.is_alive():
            hanging.kill()
        hanging.join(timeout=10)


def test_opening_a_cache_removes_old_claims_no_one_holds_and_nothing_else(
    tmp_path: Path,
) -> None:
    cache = DiskCache(tmp_path, max_bytes=1 << 20)
    held = cache.claim("held")
    assert held is not None
    assert held.exclusive
    assert cache.claim("held") is None  # another claimant (here: another open file) waits
    claims = tmp_path / "v1" / "claims"
    dead = claims / ("d" * 64)  # a dead owner's: no lock on it
    dead.write_text("999999\n")
    stranger = claims / "notes.txt"
    stranger.write_text("not the cache's")
    for path in claims.iterdir():
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    DiskCache(tmp_path, max_bytes=1 << 20)
    assert not dead.exists()
    assert stranger.exists()
    assert len(list(claims.glob("?" * 64))) == 1  # the held one stays
    held.release()
    assert not list(claims.glob("?" * 64))
