"""RunStarter: which :class:`~stoker.pipeline.epoch_run.EpochRun` an iteration of a
:class:`~stoker.pipeline.loader.Loader` takes.

One of three: the next epoch's, read ahead while the last one ended (``Loader.read_ahead``);
the one :meth:`stoker.Loader.start` began before it was asked for (its first batch made on a
thread of its own while a training script loads its model); else a new one, planned from
where the loader is. A run made ahead is taken only where it starts exactly there, so none
changes the order, the batches or the state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stoker.pipeline.batcher import Batcher
from stoker.pipeline.epoch_run import EpochRun, taken_over
from stoker.pipeline.order import Segment
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.prefetch import Prefetcher
from stoker.pipeline.skips import SkipBudget

#: What plans an epoch from a place: ``(epoch, position, segments) -> plan``.
Planner = Callable[[int, int, Sequence[Segment]], EpochPlan]


@dataclass(frozen=True, slots=True)
class Place:
    """Where a Loader is: its epoch, the batches of it delivered on this world size, and the
    segments earlier world sizes ran of it."""

    epoch: int
    position: int = 0
    segments: tuple[Segment, ...] = ()

    @property
    def fresh(self) -> bool:
        """Whether it is the epoch's beginning."""
        return self.position == 0 and not self.segments


class RunStarter:
    """Opens the runs of a Loader's iterations, and holds those made ahead.

    Args:
        plan: Plans an epoch from a place.
        prefetcher: Opens each run's fetch stream.
        batches: The loader's batcher (its decode workers started with a new run).
        batch_size: Rows per batch (to size process workers' slots).
        depth: Batches decoding at once.
        on_drained: Called when a run has every fetch under way (the loader's read-ahead).
    """

    def __init__(
        self,
        *,
        plan: Planner,
        prefetcher: Prefetcher,
        batches: Batcher,
        batch_size: int,
        depth: int,
        on_drained: Callable[[], None],
    ) -> None:
        self._plan, self._prefetcher, self._batches = plan, prefetcher, batches
        self._batch_size, self._depth, self._on_drained = batch_size, depth, on_drained
        self.next: EpochRun | None = None  # the next epoch, started while this one ends
        self.lead = 0  # threads for the next run's first batch (Loader.lead_next_epoch)
        self._started: tuple[Place, EpochRun] | None = None  # start()'s

    def take(self, place: Place) -> EpochRun:
        """The run from ``place``: the one started there, the read-ahead, or a new one."""
        started, self._started = self._started, None
        if started is not None:
            if started[0] == place and started[1].here:
                return started[1]
            started[1].drop(self._batches)
        run = taken_over(self.next, epoch=place.epoch, fresh=place.fresh, batches=self._batches)
        self.next = None
        if run is not None:  # read ahead: no cold first batch to keep the link free for,
            run.stream.delivering = True  # so its next read groups are fetched from now on
        else:
            plan = self._plan(place.epoch, place.position, place.segments)
            if (workers := self._batches.workers) is not None:  # None: made in this thread
                workers.start_workers(batch_size=self._batch_size, depth=self._depth)
            stream = self._prefetcher.open(place.epoch, plan, on_drained=self._on_drained)
            run = EpochRun.start(place.epoch, plan, stream, fresh=place.fresh)
        run.lead, self.lead = self.lead, 0
        return run

    def start(
        self, place: Place, prefetch: int, skipped: list[tuple[str, str]], budget: SkipBudget
    ) -> None:
        """Make the first batch of the run from ``place`` now, on a thread, then fetch
        ``prefetch`` read groups ahead (see :meth:`EpochRun.prepare`); a no-op where it is
        under way already."""
        if self._started_at(place):
            return
        run = self.take(place)
        run.stream.depth = prefetch
        run.prepare(self._batches, self._depth, skipped, budget)
        self._started = (place, run)

    def ready(self, place: Place, timeout_s: float | None) -> bool:
        """Whether the run started from ``place`` has its first batch made (see
        :meth:`EpochRun.prepared`); False where none was."""
        started = self._started
        return started is not None and self._started_at(place) and started[1].prepared(timeout_s)

    def _started_at(self, place: Place) -> bool:
        started = self._started
        return started is not None and started[0] == place and started[1].here

    def start_next(self, room: int) -> None:
        """Start decoding the read-ahead's batches whose samples are in, at most ``room``."""
        if self.next is not None:
            self.next.start_ready(self._batches, room)

    def read_ahead(self, epoch: int) -> None:
        """Start epoch ``epoch``'s run (its first batch's reads) unless one is."""
        if self.next is not None:
            return
        plan = self._plan(epoch, 0, ())
        stream = self._prefetcher.open(epoch, plan, on_drained=self._on_drained)
        self.next = EpochRun.start(epoch, plan, stream)
        stream.top_up()

    def close(self) -> None:
        """Let go of the runs made ahead."""
        if self._started is not None:
            self._started[1].drop(self._batches)
            self._started = None
        taken_over(self.next, epoch=-1, fresh=False, batches=self._batches)  # dropped
        self.next = None
