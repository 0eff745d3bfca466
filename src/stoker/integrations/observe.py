"""What an adapter's loaders have done, over epochs and DataLoader worker processes.

An adapter that makes a new :class:`stoker.Loader` every epoch, or one in each worker
process, keeps a :class:`RunRecord`: it folds each epoch's stats and timeline into running
totals, so the adapter's ``stats()`` and ``events()`` say what one long-lived Loader's
would. No framework is imported here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from stoker.core.metrics import Stage, Stages, TraceEvent
from stoker.pipeline.loader import Loader
from stoker.pipeline.stats import LoaderStats, one_after_another, side_by_side

#: Stages of the training loop's side: with workers, measured in the training process.
CONSUMER_STAGES = (Stage.CONSUMER_WAIT, Stage.CONSUMER_STEP)


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a DataLoader worker's loader has done, sent along with each of its batches.

    Attributes:
        worker: The worker's id.
        stats: Its loader's stats after the batch (since the worker started).
        events: Timeline events recorded since its last report (when tracing).
        skips: The samples its loader skipped since its last report, as records of the
            skipped file (:class:`~stoker.pipeline.skips.SkipBudget`).
    """

    worker: int
    stats: LoaderStats
    events: tuple[TraceEvent, ...] = ()
    skips: tuple[dict[str, Any], ...] = ()


def new_events(events: list[TraceEvent], last: TraceEvent | None) -> list[TraceEvent]:
    """The events after ``last`` (all of them if it is no longer kept)."""
    for n in range(len(events) - 1, -1, -1):
        if events[n] is last:
            return events[n + 1 :]
    return events


def batched_by_a_dataloader(dataset: object) -> bool:
    """Whether a DataLoader with automatic batching (a ``batch_size`` other than None) is
    asking ``dataset`` for items.

    torch gives an iterable dataset no way to know, so this looks at the few frames above
    for the object fetching from it (torch's ``_IterableDatasetFetcher``: its ``dataset``
    and ``auto_collation``); if torch fetches differently one day, it finds nothing.
    """
    frame = inspect.currentframe()
    for _ in range(6):
        if frame is None:
            return False
        owner = frame.f_locals.get("self")
        if owner is not None and getattr(owner, "dataset", None) is dataset:
            return bool(getattr(owner, "auto_collation", False))
        frame = frame.f_back
    return False


class RunRecord:
    """Running totals of an adapter's loaders.

    Args:
        in_process: The loader runs in this process (its stats are read from it directly,
            and its store's counters keep running over epochs); else worker processes send
            :class:`WorkerReport` s and the training loop's side is timed here.
    """

    def __init__(self, *, in_process: bool) -> None:
        self.in_process = in_process
        self.max_events: int | None = None
        self._earlier = LoaderStats()  # the epochs run to their end (or stopped)
        self._workers: dict[int, LoaderStats] = {}  # this epoch: each worker's last report
        self._events: list[TraceEvent] = []  # from workers and past epochs
        self._stages = Stages()  # the consumer's side, with workers
        self._delivered = (0, 0)  # batches and samples handed out, with workers

    def trace(self, max_events: int) -> None:
        """Keep the last ``max_events`` events from now on."""
        self.max_events = max_events
        self._stages.start_tracing(max_events)

    def report(self, report: WorkerReport) -> None:
        """Take a worker's report."""
        self._workers[report.worker] = report.stats
        self._events += report.events

    def delivered(self, items: int, waited_from: float, now: float) -> None:
        """Count a batch of ``items`` handed out at ``now``, asked for at ``waited_from``."""
        batches, samples = self._delivered
        self._delivered = (batches + 1, samples + items)
        self._stages.record(
            Stage.CONSUMER_WAIT,
            now - waited_from,
            start_s=waited_from,
            items=items,
            lane="consumer",
        )

    def stepped(self, started: float, now: float) -> None:
        """Count the training step between a delivery at ``started`` and the next ask."""
        self._stages.record(Stage.CONSUMER_STEP, now - started, start_s=started, lane="consumer")

    def stats(self, live: Loader | None) -> LoaderStats:
        """Every epoch so far, ``live`` (the loader running in this process) included."""
        return one_after_another(self._earlier, self._current(live), same_store=self.in_process)

    def events(self, live: Loader | None) -> list[TraceEvent]:
        """The timeline kept since :meth:`trace`, oldest first."""
        if self.max_events is None:
            return []
        events = self._events + self._stages.events()
        if self.in_process and live is not None:
            events += live.events()
        events.sort(key=lambda e: e.start_s)
        return events[-self.max_events :]

    def finish(self, live: Loader | None) -> None:
        """Fold the epoch (ended, or stopped early) into the totals."""
        current = self._current(live)
        if self.in_process and live is not None:
            self._events += live.events()
        self._events += self._stages.events()
        if self.max_events is not None:
            self._events = self._events[-self.max_events :]
        self._earlier = one_after_another(self._earlier, current, same_store=self.in_process)
        self._workers, self._stages, self._delivered = {}, Stages(), (0, 0)
        if self.max_events is not None:
            self._stages.start_tracing(self.max_events)

    def _current(self, live: Loader | None) -> LoaderStats:
        if self.in_process:
            return live.stats() if live is not None else LoaderStats()
        now = side_by_side(list(self._workers.values()))
        mine = self._stages.snapshot()
        now.stages = {k: v for k, v in now.stages.items() if k not in CONSUMER_STAGES}
        now.stages.update({k: v for k, v in mine.items() if k in CONSUMER_STAGES})
        now.batches, now.samples = self._delivered
        return now
