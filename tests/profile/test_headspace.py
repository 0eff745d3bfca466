"""The headspace check (issue 32, item 10): the user's step timed on live batches, then on
the same batches replayed from memory, which reads nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import CenterCrop
from stoker.profile.headspace import headspace
from stoker.testing.images import write_packed_images


class FakeClock:
    """A clock that moves only when told: a batch costs ``wait``, a step ``step``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_arithmetic_of_waits_steps_and_headspace() -> None:
    clock = FakeClock()

    def batches() -> Iterator[int]:
        for n in range(100):
            clock.now += 3.0  # a batch waits 3 "seconds"
            yield n

    def step(_: int) -> None:
        clock.now += 1.0

    report = headspace(batches(), step, steps=10, warmup=2, clock=clock)
    assert (report.steps, report.live_s, report.wait_s, report.step_s) == (10, 4.0, 3.0, 1.0)
    assert report.speedup == 4.0
    assert report.data_bound
    assert "data-bound: 75% of each iteration waits" in report.summary()

    def free() -> Iterator[int]:
        yield from range(100)

    quick = headspace(free(), step, steps=5, warmup=0, clock=clock)
    assert (quick.wait_s, quick.speedup, quick.data_bound) == (0.0, 1.0, False)
    assert "step-bound" in quick.summary()


def test_a_loaders_batches_are_replayed_from_memory_reading_nothing(tmp_path: Path) -> None:
    url = write_packed_images(tmp_path, files=48, classes=3, width=24, height=20)
    seen: list[list[str]] = []
    with Loader(url, batch_size=4, seed=0, transform=CenterCrop(16)) as loader:
        report = headspace(loader, lambda batch: seen.append(list(batch["key"])), steps=5, warmup=1)
    assert report.steps == 5
    assert report.requests == 0
    assert len(seen) == 1 + 5 + 5  # warm-up, live, replayed
    assert seen[1:6] == seen[6:]  # the same batches, in the same order


def test_too_few_batches_and_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="fewer than warmup \\+ steps = 12 batches"):
        headspace(iter(range(5)), lambda _: None, steps=10, warmup=2)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        headspace(iter(range(5)), lambda _: None, steps=0)
