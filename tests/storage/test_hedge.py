"""Hedged ranged GETs: a stalled read is answered by a second request, within a budget."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from stoker.core.metrics import Counters
from stoker.storage import Store
from stoker.storage.hedge import HedgePolicy, Hedger
from stoker.storage.options import StorageOptions
from stoker.testing.netproxy import FaultConfig, NetProxy

DATA = os.urandom(256 * 1024)
KEY = "shard.bin"
WARM_UP = 20  # HedgePolicy's min_samples: GETs timed before a read is hedged


def _stall(*, stall_s: float, max_faults: int | None = None) -> FaultConfig:
    return FaultConfig(
        fault_rate=1.0,
        kinds=("stall",),
        stall_s=stall_s,
        max_faults=max_faults,
        fault_methods=frozenset({"GET"}),
    )


def _store(bucket: Any, proxy: NetProxy, hedge: HedgePolicy | None) -> Store:
    bucket.store().put(KEY, DATA)
    # timeout_s bounds a read that nothing hedged (a failing test), well below the stalls.
    store: Store = bucket.store(endpoint=proxy.endpoint, hedge=hedge, timeout_s=15.0)
    return store


def _read(store: Store, i: int) -> None:
    start = (i * 4096) % (len(DATA) - 65536)
    assert bytes(store.get_range(KEY, start=start, end=start + 65536)) == DATA[start:][:65536]


def test_a_stalled_get_is_answered_by_its_hedge(s3_bucket: Any, proxy: NetProxy) -> None:
    store = _store(s3_bucket, proxy, HedgePolicy())
    for i in range(WARM_UP):
        _read(store, i)
    proxy.set_faults(_stall(stall_s=60.0, max_faults=1))
    _read(store, WARM_UP)
    assert store.counters.get("requests.hedged") == 1
    assert store.counters.get("requests.hedge_won") == 1
    assert proxy.stats().faults["stall"] == 1
    # The answer came from the hedge: the stalled response is still held back.
    assert proxy.held_responses() == 1


def test_the_budget_caps_hedges(s3_bucket: Any, proxy: NetProxy) -> None:
    store = _store(s3_bucket, proxy, HedgePolicy(max_share=0.05))
    for i in range(WARM_UP):
        _read(store, i)
    proxy.set_faults(_stall(stall_s=0.3))  # every GET from now on, hedges too
    for i in range(10):
        _read(store, i)
    # 30 GETs earn 1.5 tokens of 0.05: one hedge, however slow every read was.
    assert store.counters.get("requests.hedged") == 1


def test_no_hedge_before_enough_observations(s3_bucket: Any, proxy: NetProxy) -> None:
    store = _store(s3_bucket, proxy, HedgePolicy(max_share=1.0))  # the budget no limit
    for i in range(WARM_UP - 1):
        _read(store, i)
    proxy.set_faults(_stall(stall_s=0.5, max_faults=1))
    _read(store, WARM_UP)  # the 20th GET: 19 timed before it
    assert store.counters.get("requests.hedged") == 0
    proxy.set_faults(_stall(stall_s=60.0, max_faults=1))
    _read(store, WARM_UP + 1)  # 20 timed: this one is hedged
    assert store.counters.get("requests.hedged") == 1
    assert store.counters.get("requests.hedge_won") == 1


def test_hedging_off_sends_one_request_a_read(s3_bucket: Any, proxy: NetProxy) -> None:
    store = _store(s3_bucket, proxy, None)
    for i in range(WARM_UP + 5):
        _read(store, i)
    proxy.set_faults(_stall(stall_s=0.5, max_faults=1))
    _read(store, 0)
    assert store.counters.get("requests.hedged") == 0
    assert store.counters.get("requests.get") == WARM_UP + 6
    assert proxy.stats().faults["stall"] == 1


def test_a_local_folder_is_never_hedged(tmp_path: Any) -> None:
    from stoker.storage import open_store

    store = open_store(str(tmp_path), storage_options={"hedge": {"max_share": 1.0}})
    store.put(KEY, DATA)
    for i in range(WARM_UP + 5):
        _read(store, i)
    assert store.counters.get("requests.hedged") == 0


def test_hedger_cancels_the_loser() -> None:
    """The first request hangs; its hedge answers and the first is cancelled."""
    hedger = Hedger(HedgePolicy(min_samples=1, window=1, min_delay_s=0.0, max_share=1.0))
    counters = Counters()
    calls: list[str] = []
    cancelled: list[int] = []

    async def attempt() -> int:
        number = len(calls)
        calls.append("call")
        if number == 1:  # the read to hedge: it never answers unless cancelled
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(number)
                raise
        return number

    async def main() -> list[int]:
        first = await hedger.run(attempt, size=100, counters=counters)  # timed, not hedged
        second = await asyncio.wait_for(
            hedger.run(attempt, size=100, counters=counters), timeout=30.0
        )
        return [first, second]

    assert asyncio.run(main()) == [0, 2]
    assert cancelled == [1]
    assert counters.get("requests.hedged") == 1
    assert counters.get("requests.hedge_won") == 1


def test_hedger_waits_for_the_other_when_one_fails() -> None:
    hedger = Hedger(HedgePolicy(min_samples=1, window=1, min_delay_s=0.0, max_share=1.0))
    counters = Counters()
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        if len(calls) == 2:  # slow, then fails: the hedge's answer is used
            await asyncio.sleep(0.01)
            raise ConnectionResetError("reset")
        if len(calls) == 3:
            await asyncio.sleep(0.05)
        return "ok"

    async def main() -> str:
        await hedger.run(attempt, size=100, counters=counters)
        return await hedger.run(attempt, size=100, counters=counters)

    assert asyncio.run(main()) == "ok"
    assert counters.get("requests.hedge_won") == 1


def test_hedge_policy_from_options() -> None:
    options = StorageOptions.from_mapping({"hedge": {"max_share": 0.02}})
    assert options.hedge == HedgePolicy(max_share=0.02)
    assert StorageOptions().hedge is None
    with pytest.raises(ValueError, match="max_share"):
        HedgePolicy(max_share=0.0)
    with pytest.raises(ValueError, match="min_samples"):
        HedgePolicy(min_samples=50, window=10)
