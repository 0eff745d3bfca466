"""Autotuner: climbs to the best thread count, deepens prefetch within budget, settles."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import DecodeConfig
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.autotune import AutotuneConfig, Autotuner, sweep_counts
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_image_folder


def _drive(tuner: Autotuner, rate_of: object, fetch_share_of: object, windows: int) -> int:
    """Feed the tuner one-second windows from model functions; return windows until settled."""
    now, samples, waited = 0.0, 0, 0.0
    tuner.observe(now, samples, waited)
    for window in range(windows):
        now += 1.0
        samples += int(rate_of(tuner.threads, tuner.prefetch))  # type: ignore[operator]
        waited += fetch_share_of(tuner.prefetch)  # type: ignore[operator]
        tuner.observe(now, samples, waited)
        if tuner.settled:
            return window + 1
    return windows


@settings(max_examples=60, deadline=None)
@given(
    best=st.integers(1, 12),
    max_threads=st.integers(1, 16),
    start=st.integers(1, 16),
    cpus=st.integers(1, 16),
)
def test_threads_climb_to_the_best_within_the_budget(
    best: int, max_threads: int, start: int, cpus: int
) -> None:
    tuner = Autotuner(
        threads=start,
        prefetch=2,
        group_bytes=1e6,
        tune_threads=True,
        tune_prefetch=False,
        config=AutotuneConfig(max_threads=max_threads, window_s=1.0, min_batches=1),
        cpus=cpus,
    )

    def rate(threads: int, prefetch: int) -> float:
        return 1000.0 * 0.85 ** abs(threads - best)  # a single peak at `best`

    windows = _drive(tuner, rate, lambda prefetch: 0.0, 100)
    assert tuner.settled
    # One window per step and one skipped after each change; besides the climb from the
    # start to the best, the first window is skipped, the sweep measures each count up to
    # the CPU count, and the confirmation measures the best two and the start once more.
    sweep = 2 * len(sweep_counts(cpus, max_threads))
    assert windows <= 2 * abs(min(start, max_threads) - min(best, max_threads)) + sweep + 11
    assert 1 <= tuner.threads <= max_threads
    assert tuner.threads == min(best, max_threads)


def test_prefetch_deepens_while_the_store_is_waited_on_and_respects_memory() -> None:
    tuner = Autotuner(
        threads=3,
        prefetch=2,
        group_bytes=10e6,
        tune_threads=False,
        tune_prefetch=True,
        config=AutotuneConfig(max_buffer_bytes=100_000_000, window_s=1.0, min_batches=1),
    )
    # Always waiting on a store that more reads at once make faster (latency-bound).
    _drive(tuner, lambda t, p: 100.0 * p, lambda prefetch: 0.5, 50)
    assert tuner.settled
    assert tuner.prefetch == 10  # 100 MB / 10 MB per group, never more


def test_a_deeper_prefetch_that_does_not_help_is_undone() -> None:
    # Always waiting on a store whose link is full: 4 groups ahead feed no more than 2, so
    # the memory goes back (set a through 1 Gbit/s had settled on 18 groups, 0.9 GB).
    tuner = Autotuner(
        threads=2,
        prefetch=2,
        group_bytes=10e6,
        tune_threads=False,
        tune_prefetch=True,
        config=AutotuneConfig(max_buffer_bytes=100_000_000, window_s=1.0, min_batches=1),
    )
    tried = set()

    def rate(threads: int, prefetch: int) -> float:
        tried.add(prefetch)
        return 1000.0 * (1.03 if prefetch > 2 else 1.0)  # within the noise

    _drive(tuner, rate, lambda prefetch: 0.5, 50)
    assert tuner.settled
    assert tried == {2, 4}
    assert tuner.prefetch == 2


def test_prefetch_stays_when_the_store_keeps_up() -> None:
    tuner = Autotuner(
        threads=3,
        prefetch=2,
        group_bytes=1e6,
        tune_threads=False,
        tune_prefetch=True,
        config=AutotuneConfig(window_s=1.0, min_batches=1),
    )
    _drive(tuner, lambda t, p: 500.0, lambda prefetch: 0.0, 10)
    assert tuner.settled
    assert tuner.prefetch == 2


Model = Callable[[int, int, int], float]  # (window, threads, prefetch) -> value


def _run(tuner: Autotuner, rate: Model, fetch_share: Model, windows: int = 400) -> int:
    """Feed one-second windows from time-varying models; return windows until settled."""
    now, samples, waited = 0.0, 0, 0.0
    tuner.observe(now, samples, waited)
    for window in range(windows):
        now += 1.0
        samples += int(rate(window, tuner.threads, tuner.prefetch))
        waited += fetch_share(window, tuner.threads, tuner.prefetch)
        tuner.observe(now, samples, waited)
        if tuner.settled:
            return window + 1
    return windows


def _tuner(*, start: int = 2, cpus: int = 2, tune_prefetch: bool = False) -> Autotuner:
    return Autotuner(
        threads=start,
        prefetch=2,
        group_bytes=10e6,
        tune_threads=True,
        tune_prefetch=tune_prefetch,
        config=AutotuneConfig(window_s=1.0, min_batches=1, max_buffer_bytes=80_000_000),
        cpus=cpus,
    )


# Issue 16's set b on 2 cores: 784 images/s with 1 decode thread, 1,024 with 2.
SET_B = {1: 784.0, 2: 1024.0, 3: 1000.0, 4: 980.0}


def _set_b(threads: int) -> float:
    return SET_B.get(threads, 950.0)


def test_slow_first_windows_do_not_talk_it_out_of_the_cores() -> None:
    # The loader's first seconds run at 60 % (connections opening, the server warming up),
    # without waiting on the store: the old tuner judged 2 threads by them and settled on 1.
    tuner = _tuner(tune_prefetch=True)
    _run(tuner, lambda w, t, p: _set_b(t) * (0.6 if w < 3 else 1.0), lambda w, t, p: 0.0)
    assert tuner.settled
    assert tuner.threads == 2
    assert max(tuner.rates[1]) == 784.0  # 1 was measured, and found slower
    assert max(tuner.rates[2]) == 1024.0  # 2 was measured again once warm


def test_windows_waiting_on_the_store_are_not_judged() -> None:
    # The store stalls for four windows while 2 threads are first measured: those windows
    # say nothing about threads (and prefetch may not change here).
    stalled = range(1, 5)

    def rate(window: int, threads: int, prefetch: int) -> float:
        return 300.0 if window in stalled else _set_b(threads)

    def share(window: int, threads: int, prefetch: int) -> float:
        return 0.6 if window in stalled else 0.0

    tuner = _tuner()
    _run(tuner, rate, share)
    assert tuner.settled
    assert tuner.threads == 2
    assert all(300.0 not in rates for rates in tuner.rates.values())


def test_an_io_bound_window_deepens_prefetch_while_the_budget_allows() -> None:
    # Waiting on the store only while prefetch is shallow: deepen it, then tune threads.
    tuner = _tuner(tune_prefetch=True)

    def share(window: int, threads: int, prefetch: int) -> float:
        return 0.5 if prefetch < 8 else 0.0

    _run(tuner, lambda w, t, p: _set_b(t) if p >= 8 else 200.0 * p, share)
    assert tuner.settled
    assert tuner.prefetch == 8  # the 80 MB budget over 10 MB groups
    assert tuner.threads == 2
    assert all(400.0 not in rates for rates in tuner.rates.values())


def test_a_loader_the_store_always_limits_settles_on_its_start() -> None:
    tuner = _tuner(start=2, tune_prefetch=True)
    windows = _run(tuner, lambda w, t, p: 500.0, lambda w, t, p: 0.5)
    assert tuner.settled
    assert tuner.threads == 2
    assert tuner.prefetch == 2  # a doubling was tried, and undone: it fed no more
    assert tuner.rates == {}
    assert windows <= 16  # the cold start, the doubling and its undoing, 5 windows


@settings(max_examples=300, deadline=None)
@given(
    cpus=st.integers(1, 8),
    start=st.integers(1, 8),
    peak=st.integers(1, 16),
    ups=st.lists(st.floats(1.0, 1.5), min_size=16, max_size=16),
    downs=st.lists(st.floats(0.85, 1.0), min_size=16, max_size=16),
    slow_windows=st.integers(0, 3),
    slow=st.floats(0.4, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_never_settles_more_than_5_percent_below_the_best_fixed_count(
    cpus: int,
    start: int,
    peak: int,
    ups: list[float],
    downs: list[float],
    slow_windows: int,
    slow: float,
    seed: int,
) -> None:
    # A rate that rises to a peak with diminishing gains and falls after it, by random
    # steps; every window loses up to 2.5 % to noise (a disturbance only slows a window)
    # and the first ones run slow.
    max_threads = 2 * cpus
    truth = {peak: 1000.0}
    gains = sorted(ups, reverse=True)  # gains[n]: from n to n + 1 threads
    for n in range(peak - 1, 0, -1):
        truth[n] = truth[n + 1] / gains[n]
    for n in range(peak + 1, max_threads + 1):
        truth[n] = truth[n - 1] * downs[n - 1]
    noise = random.Random(seed)

    def rate(window: int, threads: int, prefetch: int) -> float:
        ramp = slow if window < slow_windows else 1.0
        return truth[threads] * ramp * noise.uniform(0.975, 1.0)

    tuner = _tuner(start=min(start, max_threads), cpus=cpus)
    _run(tuner, rate, lambda w, t, p: 0.0)
    assert tuner.settled
    best = max(truth[n] for n in range(1, max_threads + 1))
    assert truth[tuner.threads] >= 0.95 * best


def test_only_the_batches_under_way_after_a_change_are_skipped() -> None:
    # Windows of 8 batches; the cold start is a whole window, the skip after a change only
    # a quarter of one (2 batches).
    tuner = Autotuner(
        threads=2,
        prefetch=2,
        group_bytes=1e6,
        tune_threads=True,
        tune_prefetch=False,
        config=AutotuneConfig(window_s=1e-9, min_batches=8),
        cpus=2,
    )
    changes, threads, samples = [], tuner.threads, 0
    tuner.observe(0.0, 0, 0.0)
    for batch in range(1, 200):
        samples += int(_set_b(tuner.threads))  # a batch every 10 ms: 100x the rate
        tuner.observe(batch * 0.01, samples, 0.0)
        if tuner.threads != threads:
            changes.append(batch)
            threads = tuner.threads
        if tuner.settled:
            break
    assert tuner.settled
    assert tuner.threads == 2
    # 8 cold + 8 judged at 2 threads -> 1; 2 skipped + 8 judged -> 3; 2 + 8 judged, then
    # 8 more at 3 to confirm it (no change, no skip) -> 2, confirmed there.
    assert changes == [16, 26, 44]


def test_an_autotuned_loader_logs_its_choice_and_keeps_results_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Enough batches for the whole search even when a batch takes well under a millisecond
    # (each window must hold at least window_s of batches).
    write_image_folder(tmp_path / "src", files=192, classes=3, width=64, height=48)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=16))
    caplog.set_level(logging.INFO, logger="stoker.pipeline.autotune")
    fast = AutotuneConfig(window_s=0.0001, min_batches=1, max_threads=4)
    with Loader(
        str(tmp_path / "ds"), batch_size=4, transform=RandomResizedCrop(16), autotune=fast
    ) as tuned:
        auto = list(tuned)
        threads = tuned.num_threads
    with Loader(
        str(tmp_path / "ds"),
        batch_size=4,
        transform=RandomResizedCrop(16),
        decode=DecodeConfig(threads=1),
    ) as fixed:
        reference = list(fixed)
    assert "autotune settled" in caplog.text
    assert 1 <= threads <= 4
    for a, b in zip(auto, reference, strict=True):
        assert a["key"] == b["key"]
        np.testing.assert_array_equal(a["image"], b["image"])
