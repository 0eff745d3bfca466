"""Stages and StoragePrices."""

from __future__ import annotations

import threading

import pytest

from stoker.core.metrics import Stages
from stoker.core.pricing import StoragePrices


def test_stages_add_up_across_threads() -> None:
    stages = Stages()

    def work() -> None:
        for _ in range(1000):
            stages.record("decode", 0.001, items=2, nbytes=10)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    totals = stages.snapshot()["decode"]
    assert totals.calls == 4000
    assert totals.items == 8000
    assert totals.bytes == 40_000
    assert totals.seconds == pytest.approx(4.0)
    assert stages.seconds("decode") == totals.seconds
    assert stages.seconds("fetch") == 0.0
    assert stages.events() == []


def test_events_are_bounded_and_only_kept_when_tracing() -> None:
    stages = Stages()
    with stages.time("fetch"):
        pass
    assert stages.events() == []
    stages.start_tracing(3)
    for n in range(5):
        stages.record("fetch", 0.5, start_s=float(n), lane="io")
    assert [e.start_s for e in stages.events()] == [2.0, 3.0, 4.0]
    assert stages.snapshot()["fetch"].calls == 6


def test_prices() -> None:
    prices = StoragePrices()
    assert prices.cost(requests=1_000_000, nbytes=0) == pytest.approx(0.4)
    assert StoragePrices(transfer_per_gib=0.09).cost(requests=0, nbytes=2**31) == pytest.approx(
        0.18
    )
    with pytest.raises(ValueError, match=">= 0"):
        StoragePrices(get_per_1000=-1)
