"""Autotune: pick decode threads and prefetch depth from what the pipeline measures.

The loader reports, after every batch, how many samples it delivered and how long its
consumer-side thread was blocked waiting for fetches. Every window (at least ``window_s``
and ``min_batches`` batches) the tuner judges the last one:

1. **Prefetch first.** If the pipeline waited on fetches for more than ``fetch_wait_share``
   of the window, the store may not be kept busy enough: double the read groups held
   ahead, up to what ``max_buffer_bytes`` allows, as long as each doubling raises the
   images/s by :data:`DEEPEN_GAIN`. One that does not (the link, not the depth, sets the
   rate) is undone and prefetch stays there: memory that buys nothing is not spent.
2. **Then threads: sweep, climb, confirm.** Measure every thread count up to the CPU count
   (1 to 4, then powers of two and the CPU count itself on a bigger machine), then climb
   from the best one to its untried neighbours while one of them is better (above the CPU
   count, a count must beat the best by ``min_gain``: extra threads cost memory and
   contend with the I/O thread), and try any untried count between measured ones next to
   a count within 5 % of the best (noise on a plateau can make its far end look best and
   hide a peak at its near end). Last, the best two are measured once more, the current
   one first, so that one disturbed window (a cold start, another process) does not
   decide: a count's rate is the best of its windows, since a disturbance only ever slows
   one. The first count measured is measured again too (a loader's first seconds run slow).
   Never above ``max_threads``.
3. **Settle** on the best; nothing changes afterwards, so a long run pays nothing for
   tuning. Every change and the final choice are logged at INFO.

The first window (a cold start) and a short one right after a change (a quarter of
``min_batches``: the batches under way mix both settings) are never judged, and neither
is a window that waited on the store for more than ``io_bound_share`` of its time: its
rate is the store's, whatever the thread count. Such a window deepens prefetch if the
budget allows; after five of them in a row at full prefetch the tuner settles on the best
count measured so far. On 2 cores tuning takes about six windows of at least a second and
12 batches: 10 to 40 seconds.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)

# I/O-bound windows in a row, at the most prefetch allowed, after which tuning stops.
_MAX_IO_WINDOWS = 5

#: Relative images/s gain a doubled prefetch must bring to be kept.
DEEPEN_GAIN = 0.05


#: Counts whose rate is within this fraction of the best are on its plateau: their
#: neighbours are tried too (window noise is up to a few per cent).
_PLATEAU = 0.05


def default_threads() -> int:
    """Decode threads to start with: one per core (the I/O thread needs CPU too; autotune
    may add one)."""
    return os.cpu_count() or 1


@dataclass(frozen=True, slots=True, kw_only=True)
class AutotuneConfig:
    """Budgets and pace of the autotuner.

    Attributes:
        max_threads: Most decode threads (the CPU budget); default twice the CPU count.
        max_buffer_bytes: Most bytes of fetched, undecoded samples held ahead (the RAM
            budget for prefetch).
        window_s: Shortest measurement window.
        min_batches: Fewest batches in a measurement window.
        min_gain: Relative images/s gain a thread count above the CPU count must bring over
            the best to be preferred (kept small: the tuner settles within 5 % of the
            best).
        fetch_wait_share: Waiting on fetches above this share of a window deepens prefetch.
        io_bound_share: A window that waited on fetches above this share of its time is
            not used to compare thread counts.
    """

    max_threads: int | None = None
    max_buffer_bytes: int = 512 << 20
    window_s: float = 1.0
    min_batches: int = 6
    min_gain: float = 0.02
    fetch_wait_share: float = 0.05
    io_bound_share: float = 0.15

    def __post_init__(self) -> None:
        if self.max_threads is not None and self.max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {self.max_threads}")
        if self.max_buffer_bytes < 1 or self.window_s <= 0:
            raise ValueError("max_buffer_bytes and window_s must be > 0")


Phase = Literal["prefetch", "threads", "settled"]


def sweep_counts(cpus: int, max_threads: int) -> list[int]:
    """The thread counts measured first: 1 to 4, then powers of two and ``cpus`` itself."""
    top = max(1, min(cpus, max_threads))
    return [n for n in range(1, top + 1) if n <= 4 or n & (n - 1) == 0 or n == top]


class Autotuner:
    """Chooses ``threads`` and ``prefetch`` for one loader (see the module docstring).

    Args:
        threads: Starting decode threads.
        prefetch: Starting read groups in flight.
        group_bytes: Bytes of one read group (mean sample size times its samples).
        tune_threads: Whether threads may change.
        tune_prefetch: Whether prefetch may change.
        config: Budgets and pace.
        cpus: CPU count the sweep covers (default ``os.cpu_count()``).
        in_flight: Batches decoding at once: after a change, as many are skipped.
    """

    def __init__(
        self,
        *,
        threads: int,
        prefetch: int,
        group_bytes: float,
        tune_threads: bool,
        tune_prefetch: bool,
        config: AutotuneConfig | None = None,
        cpus: int | None = None,
        in_flight: int = 1,
    ) -> None:
        self.config = config or AutotuneConfig()
        self.in_flight = in_flight
        self.cpus = cpus or os.cpu_count() or 1
        self.max_threads = self.config.max_threads or 2 * self.cpus
        self.max_prefetch = max(1, int(self.config.max_buffer_bytes // max(group_bytes, 1.0)))
        self.threads = min(threads, self.max_threads)
        self.prefetch = min(prefetch, self.max_prefetch)
        self.tune_threads = tune_threads
        self.tune_prefetch = tune_prefetch
        self.phase: Phase = "prefetch" if tune_prefetch else "threads"
        if not tune_threads and self.phase == "threads":
            self.phase = "settled"
        self.rates: dict[int, list[float]] = {}  # judged windows' images/s per thread count
        self._sweep = sweep_counts(self.cpus, self.max_threads)
        self._window_start: tuple[float, int, float] | None = None  # (time, samples, waited)
        self._batches = 0
        self._settling = True  # the first window is a cold start: never judged
        self._cold = True
        self._io_windows = 0
        self._first: int | None = None  # the first count measured (the start)
        self._deepened: tuple[int, float] | None = None  # (prefetch, images/s) before

    @property
    def settled(self) -> bool:
        """Whether tuning is over."""
        return self.phase == "settled"

    @property
    def state(self) -> Literal["tuning", "settled", "fixed"]:
        """``"tuning"``, ``"settled"``, or ``"fixed"`` when nothing may change."""
        if not (self.tune_threads or self.tune_prefetch):
            return "fixed"
        return "settled" if self.settled else "tuning"

    def observe(self, now: float, samples: int, fetch_wait_s: float) -> None:
        """Take the loader's running totals after a batch; maybe change a setting.

        Args:
            now: ``time.perf_counter()`` now.
            samples: Samples delivered so far.
            fetch_wait_s: Seconds the pipeline has waited on fetches so far.
        """
        if self.settled:
            return
        if self._window_start is None:
            self._window_start = (now, samples, fetch_wait_s)
            self._batches = 0
            return
        self._batches += 1
        started, samples_then, waited_then = self._window_start
        elapsed = now - started
        if self._settling and not self._cold:
            # After a change only the batches already under way mix both settings: skip
            # them (they were decoding under the old one and come out fast or slow).
            if self._batches < max(1, self.config.min_batches // 4, self.in_flight):
                return
        elif elapsed < self.config.window_s or self._batches < self.config.min_batches:
            return
        rate = (samples - samples_then) / elapsed
        fetch_share = (fetch_wait_s - waited_then) / elapsed
        self._window_start = (now, samples, fetch_wait_s)
        self._batches = 0
        if self._settling:
            self._settling = self._cold = False  # not judged: see the module docstring
            return
        self._step(rate, fetch_share)

    def _step(self, rate: float, fetch_share: float) -> None:
        deepened, self._deepened = self._deepened, None
        if deepened is not None and self._undo_deepening(deepened, rate):
            return
        if self.phase == "prefetch":
            if fetch_share > self.config.fetch_wait_share and self.prefetch < self.max_prefetch:
                self._deepen(fetch_share, rate)
                return
            self.phase = "threads" if self.tune_threads else "settled"
            if self.settled:
                self._log_settled(rate)
                return
        if fetch_share > self.config.io_bound_share:
            self._io_bound(fetch_share, rate)  # the store's rate, not the decoders'
            return
        self._io_windows = 0
        self.rates.setdefault(self.threads, []).append(rate)
        if self._first is None:
            self._first = self.threads
        following = self.next_threads()
        if following is None:
            self.threads = self.best()
            self.phase = "settled"
            self._log_settled(self.score(self.threads))
        else:
            self._change(following, rate)

    def _io_bound(self, fetch_share: float, rate: float) -> None:
        if self.tune_prefetch and self.prefetch < self.max_prefetch:
            self._deepen(fetch_share, rate)
            return
        self._io_windows += 1
        if self._io_windows < _MAX_IO_WINDOWS:
            return
        # The store sets the rate whatever the threads: keep the best measured so far.
        if self.rates:
            self.threads = self.best()
        self.phase = "settled"
        logger.info(
            "autotune: waited on the store %.0f%% of the time in %d windows in a row, "
            "with all the prefetch the memory budget allows",
            100 * fetch_share,
            _MAX_IO_WINDOWS,
        )
        self._log_settled(self.score(self.threads) if self.threads in self.rates else 0.0)

    def _undo_deepening(self, deepened: tuple[int, float], rate: float) -> bool:
        """Undo the last doubling of prefetch (from ``deepened``: the prefetch and images/s
        before it), and deepen no more, if it did not raise the images/s; whether it was
        undone."""
        before, before_rate = deepened
        if rate >= before_rate * (1 + DEEPEN_GAIN):
            return False
        logger.info(
            "autotune: prefetch %d gave %.0f images/s, %d gave %.0f: back to %d read groups",
            self.prefetch,
            rate,
            before,
            before_rate,
            before,
        )
        self.prefetch = self.max_prefetch = before
        self._settling = True
        return True

    def _deepen(self, fetch_share: float, rate: float) -> None:
        self._deepened = (self.prefetch, rate)
        new = min(self.prefetch * 2, self.max_prefetch)
        logger.info(
            "autotune: waited on the store %.0f%% of the time: prefetch %d -> %d read groups",
            100 * fetch_share,
            self.prefetch,
            new,
        )
        self.prefetch = new
        self._settling = True

    def score(self, threads: int) -> float:
        """Images/s of ``threads``: the best of its windows (what disturbs a window, a
        cold start or another process, only ever slows it), less ``min_gain`` above the
        CPU count."""
        rate = max(self.rates[threads])
        return rate / (1 + self.config.min_gain) if threads > self.cpus else rate

    def best(self) -> int:
        """The best thread count measured so far (fewer threads on a tie)."""
        return max(sorted(self.rates), key=self.score)

    def next_threads(self) -> int | None:
        """The thread count to measure next, or None when the search is over."""
        current = self.threads
        # 1. Sweep: every count up to the CPU count, nearest first.
        untried = [n for n in self._sweep if n not in self.rates]
        if untried:
            return min(untried, key=lambda n: (abs(n - current), n))
        # 2. Climb: the best count's untried neighbours; then any untried count between
        # measured ones next to a count within noise of the best (on a plateau, noise can
        # make its far end look best and hide a peak in a gap at its near end).
        best = self.best()
        for n in (best + 1, best - 1):
            if 1 <= n <= self.max_threads and n not in self.rates:
                return n
        low, high = min(self.rates), max(self.rates)
        near = [n for n in self.rates if self.score(n) >= (1 - _PLATEAU) * self.score(best)]
        for n in sorted(near, key=lambda n: (abs(n - best), n)):
            for m in (n + 1, n - 1):
                if low < m < high and m not in self.rates:
                    return m
        # 3. Confirm: the best two and the first measured (early windows run slow) measured
        # twice, the current one first.
        ranked = sorted(sorted(self.rates), key=self.score, reverse=True)[:2]
        if self._first is not None and self._first not in ranked:
            ranked.append(self._first)
        ranked.sort(key=lambda n: n != current)
        for n in ranked:
            if len(self.rates[n]) < 2:
                return n
        return None

    def _change(self, threads: int, rate: float) -> None:
        if threads != self.threads:
            logger.info(
                "autotune: %.0f images/s with %d decode threads; trying %d",
                rate,
                self.threads,
                threads,
            )
            self.threads = threads
            self._settling = True

    def _log_settled(self, rate: float) -> None:
        logger.info(
            "autotune settled: %d decode threads, %d read groups in flight (%.0f images/s)",
            self.threads,
            self.prefetch,
            rate,
        )
