"""Thread-safe counters and stage timings that every stage and store records into."""

from __future__ import annotations

import bisect
import collections
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from stoker.core.perprocess import ForkSafeLock


class Counters:
    """A named set of monotonically increasing integer counters.

    Safe to update from any thread. Keys are dotted names such as ``"requests.get"`` or
    ``"errors.timeout"``; :meth:`snapshot` returns a plain dict for reports and JSON.
    """

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = ForkSafeLock()

    def add(self, name: str, value: int = 1) -> None:
        """Add ``value`` to counter ``name``."""
        with self._lock:
            self._counts[name] += value

    def get(self, name: str) -> int:
        """Return the current value of ``name`` (0 if never recorded)."""
        with self._lock:
            return self._counts.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """Return a sorted copy of all counters."""
        with self._lock:
            return dict(sorted(self._counts.items()))

    def __repr__(self) -> str:
        return f"Counters({self.snapshot()})"


def merge_snapshots(snapshots: Iterable[dict[str, int]]) -> dict[str, int]:
    """Sum counter snapshots (of several stores, say) into one sorted dict."""
    total: Counter[str] = Counter()
    for snapshot in snapshots:
        total.update(snapshot)
    return dict(sorted(total.items()))


class Stage(StrEnum):
    """The stages of the read path, named once for the loader, its stats, traces, plots and
    the doctor. Members are strings, so ``stats.stages["decode"]`` works as well."""

    #: Opening the dataset: its index (and listing).
    INDEX = "index"
    #: Ranged reads of a chunk of samples, on the I/O engine.
    FETCH = "fetch"
    #: Decoding images (and the built-in transforms, which decode only what they keep), in
    #: CPU seconds of the decode threads: waits for the GIL or for a core are not decoding.
    DECODE = "decode"
    #: The user's transform callable, and nothing else (wall time: its waits are its own).
    TRANSFORM = "transform"
    #: Assembling a batch's dict from its decoded samples.
    COLLATE = "collate"
    #: The loader waiting for a fetch it needs.
    WAIT_FETCH = "wait.fetch"
    #: The loader waiting for a batch's decoding.
    WAIT_DECODE = "wait.decode"
    #: The training loop waiting for the next batch.
    CONSUMER_WAIT = "consumer.wait"
    #: The training loop's own step, between two batches.
    CONSUMER_STEP = "consumer.step"


#: Upper bounds, in seconds, of the buckets each stage's runs are counted in by duration (a
#: latency histogram, as Prometheus buckets them); a last bucket holds the longer ones.
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


def duration_bucket(seconds: float) -> int:
    """The index of the bucket of :data:`DURATION_BUCKETS_S` that ``seconds`` falls in
    (the first bound it does not pass; ``len(DURATION_BUCKETS_S)`` past the last)."""
    return bisect.bisect_left(DURATION_BUCKETS_S, seconds)


def add_durations(a: tuple[int, ...], b: tuple[int, ...], *, sign: int = 1) -> tuple[int, ...]:
    """``a + sign * b`` bucket by bucket (either may be empty: nothing counted)."""
    if not b:
        return a
    if not a:
        a = (0,) * len(b)
    return tuple(x + sign * y for x, y in zip(a, b, strict=True))


@dataclass(frozen=True, slots=True)
class StageTotals:
    """What one stage did: how often, on how many items and bytes, in how much time.

    Attributes:
        seconds: Time spent in the stage, summed over calls (threads add up, so a stage run
            by four threads at once can pass the wall time).
        calls: Times the stage ran.
        items: Items (samples, batches) it handled.
        bytes: Bytes it handled.
        durations: Its runs counted by duration, one count per bucket of
            :data:`DURATION_BUCKETS_S` and one for the longer ones (empty: not counted).
    """

    seconds: float = 0.0
    calls: int = 0
    items: int = 0
    bytes: int = 0
    durations: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, float | int]:
        """A JSON-ready dict."""
        return {
            "seconds": round(self.seconds, 6),
            "calls": self.calls,
            "items": self.items,
            "bytes": self.bytes,
        }


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One timed span, for a timeline (Chrome trace ``X`` events).

    Attributes:
        stage: The stage's name.
        start_s: Start, in seconds on the ``time.perf_counter`` clock.
        seconds: Duration.
        lane: Where it ran: a thread name, or ``"io"`` for requests on the I/O engine.
        items: Items handled.
        bytes: Bytes handled.
    """

    stage: str
    start_s: float
    seconds: float
    lane: str
    items: int = 0
    bytes: int = 0


class Stages:
    """Time, items and bytes per pipeline stage, and optionally a bounded event timeline.

    Thread-safe. Stages record one entry per unit of work they hand on (a fetch of a read
    group, a decoded slice of a batch, a delivered batch), not per sample, so recording
    costs nothing measurable.

    No timeline is kept until :meth:`start_tracing`.
    """

    def __init__(self) -> None:
        self._totals: dict[str, list[float]] = {}
        self._durations: dict[str, list[int]] = {}  # per stage: runs per duration bucket
        self._lock = ForkSafeLock()
        self._events: collections.deque[TraceEvent] | None = None

    def start_tracing(self, max_events: int) -> None:
        """Keep the last ``max_events`` events from now on (totals are kept as they are)."""
        with self._lock:
            self._events = collections.deque(maxlen=max_events) if max_events > 0 else None

    def record(
        self,
        stage: str,
        seconds: float,
        *,
        start_s: float | None = None,
        items: int = 0,
        nbytes: int = 0,
        lane: str | None = None,
    ) -> None:
        """Add one run of ``stage`` (and an event, if tracing and ``start_s`` is given)."""
        with self._lock:
            totals = self._totals.setdefault(stage, [0.0, 0, 0, 0])
            totals[0] += seconds
            totals[1] += 1
            totals[2] += items
            totals[3] += nbytes
            durations = self._durations.get(stage)
            if durations is None:
                durations = self._durations[stage] = [0] * (len(DURATION_BUCKETS_S) + 1)
            durations[duration_bucket(seconds)] += 1
            if self._events is not None and start_s is not None:
                self._events.append(
                    TraceEvent(
                        stage,
                        start_s,
                        seconds,
                        lane or threading.current_thread().name,
                        items,
                        nbytes,
                    )
                )

    @contextlib.contextmanager
    def time(self, stage: str, *, items: int = 0, nbytes: int = 0) -> Iterator[None]:
        """Time the ``with`` block as one run of ``stage``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.record(
                stage, time.perf_counter() - started, start_s=started, items=items, nbytes=nbytes
            )

    def seconds(self, stage: str) -> float:
        """Seconds spent in ``stage`` so far (0 if it has not run): one stage's total,
        without a copy of them all (the autotuner asks after every batch)."""
        with self._lock:
            totals = self._totals.get(stage)
            return totals[0] if totals is not None else 0.0

    def snapshot(self) -> dict[str, StageTotals]:
        """The totals of every stage so far."""
        with self._lock:
            return {
                name: StageTotals(
                    t[0], int(t[1]), int(t[2]), int(t[3]), tuple(self._durations[name])
                )
                for name, t in sorted(self._totals.items())
            }

    def events(self) -> list[TraceEvent]:
        """The kept events, oldest first (empty unless made with ``max_events``)."""
        with self._lock:
            return list(self._events or ())
