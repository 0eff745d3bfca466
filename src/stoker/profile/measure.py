"""The doctor's measurement (:func:`~stoker.profile.doctor.diagnose`): a loader run against
a simulated training step, its waits, and the loader's stage timings over the window after
the warm-up."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from stoker.core.metrics import StageTotals, TraceEvent
from stoker.pipeline.loader import Loader
from stoker.pipeline.stats import LoaderStats


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """What a run measured, for the doctor to conclude from."""

    step_s: float
    step: str
    wait_s: float
    step_total_s: float
    window_s: float
    cpu_s: float
    stages: dict[str, StageTotals]
    requests: dict[str, int]
    batches: int
    samples: int
    first_batch_s: float
    wait_phases: dict[str, float]
    epochs: int
    origin_s: float
    window_start_s: float
    events: tuple[TraceEvent, ...]


def phase(seen: int, epochs: int, delivered: int, start_batches: int) -> str:
    """Where batch ``delivered`` of the run's ``epochs``-th epoch (``seen``-th overall) falls,
    when an epoch's first ``start_batches`` are its start."""
    if seen == 1:
        return "first_batch"
    if epochs > 1 and delivered <= start_batches:
        return "epoch_start"
    return "steady"


def simulate_step(step_s: float, step: str) -> None:
    if step_s <= 0:
        return
    if step == "sleep":
        time.sleep(step_s)
        return
    end = time.perf_counter() + step_s
    while time.perf_counter() < end:
        pass


@dataclass(slots=True, kw_only=True)
class Tally:
    """What a run has delivered so far: every batch, and those of the measured window (after
    the warm-up), with when that window started and the counters then."""

    warmup_batches: int
    start_batches: int
    origin: float
    window_start: float
    before: LoaderStats | None
    cpu_before: float
    first_batch_s: float = -1.0
    seen: int = 0
    measured: int = 0
    samples: int = 0
    epochs: int = 0
    wait_s: float = 0.0
    step_total_s: float = 0.0
    phases: dict[str, float] = field(
        default_factory=lambda: {"first_batch": 0.0, "epoch_start": 0.0, "steady": 0.0}
    )

    def count(
        self, loader: Loader, batch: dict[str, Any], *, asked: float, arrived: float, nth: int
    ) -> None:
        """Count ``batch``, the ``nth`` of its epoch, asked for and arrived at those times."""
        self.seen += 1
        if self.first_batch_s < 0:
            self.first_batch_s = arrived - self.origin
        if self.seen > self.warmup_batches:
            self.measured += 1
            self.samples += len(batch["index"])
            self.wait_s += arrived - asked
            self.phases[phase(self.seen, self.epochs, nth, self.start_batches)] += arrived - asked
        elif self.seen == self.warmup_batches:
            self.window_start = arrived
            self.before = loader.stats()
            self.cpu_before = time.process_time()


def run_batches(
    loader: Loader,
    tally: Tally,
    *,
    step_s: float,
    step: str,
    limits: tuple[int | None, float | None],
) -> Iterator[dict[str, Any]]:
    """Take batches, a simulated step after each, epoch after epoch until ``limits`` (most
    batches, seconds) are reached, or one epoch if neither is given; return the last
    epoch's iterator."""
    max_batches, seconds = limits
    open_ended = max_batches is None and seconds is None
    while True:
        iterator = iter(loader)
        tally.epochs += 1
        delivered = 0
        while True:
            asked = time.perf_counter()
            batch = next(iterator, None)
            arrived = time.perf_counter()
            if batch is None:
                break
            delivered += 1
            tally.count(loader, batch, asked=asked, arrived=arrived, nth=delivered)
            simulate_step(step_s, step)
            if tally.before is not None:
                tally.step_total_s += time.perf_counter() - arrived
            if (max_batches is not None and tally.measured >= max_batches) or (
                seconds is not None and time.perf_counter() - tally.window_start >= seconds
            ):
                return iterator
        if open_ended or delivered == 0:
            return iterator


def close_window(
    loader: Loader, tally: Tally, iterator: Iterator[dict[str, Any]], *, step_s: float, step: str
) -> Measured:
    """End the measured window of a run: its timings and the loader's counters since it
    started; the last epoch's ``iterator`` is closed.

    Raises:
        ValueError: No batch was measured after the warm-up.
    """
    window_end = time.perf_counter()
    cpu_s = time.process_time() - tally.cpu_before
    after = loader.stats()
    events = tuple(loader.events())
    if isinstance(iterator, Generator):
        iterator.close()  # stop fetching ahead for batches nobody will take
    if tally.measured == 0 or tally.before is None:
        raise ValueError(
            f"{loader.dataset.url}: no batches after the {tally.warmup_batches} warm-up "
            "batches; use a smaller batch size or fewer warm-up batches"
        )
    done = after.since(tally.before)
    return Measured(
        step_s=step_s,
        step=step,
        wait_s=tally.wait_s,
        step_total_s=tally.step_total_s,
        window_s=window_end - tally.window_start,
        cpu_s=cpu_s,
        stages=done.stages,
        requests=done.requests,
        batches=tally.measured,
        samples=tally.samples,
        first_batch_s=max(tally.first_batch_s, 0.0),
        wait_phases=tally.phases,
        epochs=tally.epochs,
        origin_s=tally.origin,
        window_start_s=tally.window_start,
        events=events,
    )
