"""Autotune: pick decode threads and prefetch depth from what the pipeline measures.

The loader reports, after every batch, how many samples it delivered and how long its
consumer-side thread was blocked waiting for fetches and for decodes. Every ``window_s``
the tuner looks at the last window:

1. **Prefetch first.** If the pipeline waited on fetches for more than ``fetch_wait_share``
   of the window, the store is not kept busy enough: double the read groups in flight,
   up to what ``max_buffer_bytes`` allows. Prefetch never shrinks (it costs only memory,
   which the budget bounds).
2. **Then threads, by hill climbing.** Try one more decode thread; keep it if images/s
   rose by more than ``min_gain``, and try another; otherwise go back and try fewer, one
   at a time, while that helps. Never above ``max_threads``.
3. **Settle** when neither move helps; nothing changes afterwards, so a long run pays
   nothing for tuning. Every change and the final choice are logged at INFO.

A window lasts at least two seconds and four batches, and the window right after a change
is not judged (it mixes both settings), so tuning settles within seconds to a minute; on a
noisy machine a change is kept only for a clear gain (8 %).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)


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
        min_gain: Relative images/s gain a thread change must bring to be kept.
        fetch_wait_share: Waiting on fetches above this share of a window deepens prefetch.
    """

    max_threads: int | None = None
    max_buffer_bytes: int = 512 << 20
    window_s: float = 2.0
    min_batches: int = 4
    min_gain: float = 0.08
    fetch_wait_share: float = 0.05

    def __post_init__(self) -> None:
        if self.max_threads is not None and self.max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {self.max_threads}")
        if self.max_buffer_bytes < 1 or self.window_s <= 0:
            raise ValueError("max_buffer_bytes and window_s must be > 0")


Phase = Literal["prefetch", "more", "fewer", "settled"]


class Autotuner:
    """Chooses ``threads`` and ``prefetch`` for one loader (see the module docstring).

    Args:
        threads: Starting decode threads.
        prefetch: Starting read groups in flight.
        group_bytes: Bytes of one read group (mean sample size times its samples).
        tune_threads: Whether threads may change.
        tune_prefetch: Whether prefetch may change.
        config: Budgets and pace.
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
    ) -> None:
        self.config = config or AutotuneConfig()
        self.max_threads = self.config.max_threads or 2 * (os.cpu_count() or 1)
        self.max_prefetch = max(1, int(self.config.max_buffer_bytes // max(group_bytes, 1.0)))
        self.threads = min(threads, self.max_threads)
        self.prefetch = min(prefetch, self.max_prefetch)
        self.tune_threads = tune_threads
        self.tune_prefetch = tune_prefetch
        self.phase: Phase = "prefetch" if tune_prefetch else "more"
        if not tune_threads and self.phase == "more":
            self.phase = "settled"
        self._window_start: tuple[float, int, float] | None = None  # (time, samples, waited)
        self._best_rate = 0.0
        self._best_threads = self.threads
        self._batches = 0
        self._settling = False

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
        if elapsed < self.config.window_s or self._batches < self.config.min_batches:
            return
        rate = (samples - samples_then) / elapsed
        fetch_share = (fetch_wait_s - waited_then) / elapsed
        self._window_start = (now, samples, fetch_wait_s)
        self._batches = 0
        if self._settling:
            self._settling = False  # the window after a change mixes both settings
            return
        self._step(rate, fetch_share)

    def _step(self, rate: float, fetch_share: float) -> None:
        if self.phase == "prefetch":
            if fetch_share > self.config.fetch_wait_share and self.prefetch < self.max_prefetch:
                new = min(self.prefetch * 2, self.max_prefetch)
                logger.info(
                    "autotune: waited on the store %.0f%% of the time: prefetch %d -> %d "
                    "read groups",
                    100 * fetch_share,
                    self.prefetch,
                    new,
                )
                self.prefetch = new
                self._settling = True
                return
            self.phase = "more" if self.tune_threads else "settled"
            if self.settled:
                self._log_settled(rate)
                return
        if self.phase == "more":
            if rate > self._best_rate * (1 + self.config.min_gain) or self._best_rate == 0:
                self._best_rate, self._best_threads = rate, self.threads
                if self.threads < self.max_threads:
                    self._change(self.threads + 1, rate)
                    return
            else:
                self._change(self._best_threads, rate)  # back to the best
            self.phase = "fewer"
            if self._best_threads > 1 and self.threads == self._best_threads:
                self._change(self._best_threads - 1, rate)
                return
        if self.phase == "fewer":
            if self.threads != self._best_threads and rate > self._best_rate * (
                1 + self.config.min_gain
            ):
                self._best_rate, self._best_threads = rate, self.threads
                if self.threads > 1:
                    self._change(self.threads - 1, rate)
                    return
            self._change(self._best_threads, rate)
            self.phase = "settled"
            self._log_settled(self._best_rate)

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
