"""Autotuner: climbs to the best thread count, deepens prefetch within budget, settles."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import DecodeConfig
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.autotune import AutotuneConfig, Autotuner
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
@given(best=st.integers(1, 12), max_threads=st.integers(1, 16), start=st.integers(1, 16))
def test_threads_climb_to_the_best_within_the_budget(
    best: int, max_threads: int, start: int
) -> None:
    tuner = Autotuner(
        threads=start,
        prefetch=2,
        group_bytes=1e6,
        tune_threads=True,
        tune_prefetch=False,
        config=AutotuneConfig(max_threads=max_threads, window_s=1.0, min_batches=1),
    )

    def rate(threads: int, prefetch: int) -> float:
        return 1000.0 * 0.85 ** abs(threads - best)  # a single peak at `best`

    windows = _drive(tuner, rate, lambda prefetch: 0.0, 100)
    assert tuner.settled
    # One window per step and one skipped after each change: settled within a minute.
    assert windows <= 2 * abs(min(start, max_threads) - min(best, max_threads)) + 8
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
    _drive(tuner, lambda t, p: 500.0, lambda prefetch: 0.5, 50)  # always waiting on the store
    assert tuner.settled
    assert tuner.prefetch == 10  # 100 MB / 10 MB per group, never more


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
