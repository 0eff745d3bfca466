"""Hedged ranged GETs: a second request for a read that outlasts its peers, first answer wins.

A GET that stalls (a slow disk behind the server, a lost packet, an overloaded node) holds
the batch that waits for it. A :class:`Hedger` times each ranged GET of a store and keeps
the recent durations per size class (ranges within a factor of 4 of each other); once a class
has ``min_samples`` of them, a read of that class that has not answered after
``max(min_delay_s, multiplier x quantile)`` gets a second, identical request. The first
complete answer wins and the caller stops waiting for the other; its native request cannot
be stopped from Python (obstore goes on with it: checked through the proxy, the stalled
connection stays open), so it runs on outside the request slots until it answers or
``timeout_s`` ends it, and the I/O engine's close waits for it. A token bucket caps the
hedges: each GET earns ``max_share`` of a token, a hedge spends one, so hedges never exceed
``max_share`` of the GETs however slow the store gets. Only reads are hedged: a range of an
object is idempotent; PUT, DELETE and LIST never.

Counters: ``requests.hedged`` (second requests sent), ``requests.hedge_won`` (those that
answered first).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from stoker.core.metrics import Counters

T = TypeVar("T")

_RECOMPUTE_EVERY = 8  # observations between two recomputations of a class's delay


@dataclass(frozen=True, slots=True, kw_only=True)
class HedgePolicy:
    """When a ranged GET gets a second request.

    Attributes:
        quantile: The latency quantile of recent GETs of the same size class that a read
            is compared with.
        multiplier: A read is hedged after ``multiplier`` times that quantile.
        min_delay_s: Never hedge a read sooner than this.
        min_samples: GETs of a size class timed before any read of that class is hedged.
        window: Recent GET durations kept per size class.
        max_share: Most hedges as a share of GETs (each GET earns this much of a token, a
            hedge spends one).
        burst: Most tokens saved up, hedges that may follow each other at once.
    """

    quantile: float = 0.95
    multiplier: float = 1.5
    min_delay_s: float = 0.05
    min_samples: int = 20
    window: int = 200
    max_share: float = 0.05
    burst: float = 5.0

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"HedgePolicy.quantile must be in (0, 1], got {self.quantile}")
        if self.multiplier < 1.0:
            raise ValueError(f"HedgePolicy.multiplier must be >= 1, got {self.multiplier}")
        if self.min_delay_s < 0.0:
            raise ValueError(f"HedgePolicy.min_delay_s must be >= 0, got {self.min_delay_s}")
        if self.min_samples < 1 or self.window < self.min_samples:
            raise ValueError(
                f"HedgePolicy needs 1 <= min_samples <= window, got min_samples="
                f"{self.min_samples}, window={self.window}"
            )
        if not 0.0 < self.max_share <= 1.0:
            raise ValueError(f"HedgePolicy.max_share must be in (0, 1], got {self.max_share}")
        if self.burst < 1.0:
            raise ValueError(f"HedgePolicy.burst must be >= 1, got {self.burst}")


class _LatencyClass:
    """Recent GET durations of one size class and the hedge delay they give."""

    __slots__ = ("delay_s", "durations", "since")

    def __init__(self, window: int) -> None:
        self.durations: collections.deque[float] = collections.deque(maxlen=window)
        self.delay_s: float | None = None  # None: too few observations to hedge
        self.since = 0  # observations since delay_s was computed

    def observe(self, seconds: float, policy: HedgePolicy) -> None:
        self.durations.append(seconds)
        self.since += 1
        if len(self.durations) < policy.min_samples:
            return
        if self.delay_s is None or self.since >= _RECOMPUTE_EVERY:
            ordered = sorted(self.durations)
            at = min(len(ordered) - 1, int(policy.quantile * len(ordered)))
            self.delay_s = max(policy.min_delay_s, policy.multiplier * ordered[at])
            self.since = 0


def _size_class(size: int) -> int:
    return max(0, size.bit_length() - 16) // 2  # < 64 KiB, < 256 KiB, < 1 MiB, ...


class Hedger:
    """Runs one store's ranged GETs with hedging, in one process (see the module docstring).

    Args:
        policy: When to hedge.
    """

    def __init__(self, policy: HedgePolicy) -> None:
        self.policy = policy
        self._classes: dict[int, _LatencyClass] = {}
        self._tokens = 0.0

    def _latency(self, size: int) -> _LatencyClass:
        key = _size_class(size)
        latency = self._classes.get(key)
        if latency is None:
            latency = self._classes[key] = _LatencyClass(self.policy.window)
        return latency

    def _take_token(self) -> bool:
        if self._tokens >= 1.0 - 1e-9:
            self._tokens -= 1.0
            return True
        return False

    async def run(self, attempt: Callable[[], Awaitable[T]], *, size: int, counters: Counters) -> T:
        """Await ``attempt()``, and a second ``attempt()`` if the first is slow; the first
        to succeed gives the result and the other is cancelled. An error of one waits for
        the other; both failing raises the first error."""
        policy = self.policy
        self._tokens = min(policy.burst, self._tokens + policy.max_share)
        latency = self._latency(size)
        delay = latency.delay_s
        started = time.monotonic()
        if delay is None:  # too few reads of this size timed yet
            result = await attempt()
            latency.observe(time.monotonic() - started, policy)
            return result
        first = asyncio.ensure_future(attempt())
        tasks = [first]
        try:
            await asyncio.wait(tasks, timeout=delay)
            if first.done() or not self._take_token():
                result = await first
                latency.observe(time.monotonic() - started, policy)
                return result
            counters.add("requests.hedged")
            tasks.append(asyncio.ensure_future(attempt()))
            errors: list[BaseException] = []
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in (t for t in tasks if t in done):  # the first request wins a tie
                    failure = task.exception()
                    if failure is None:
                        if task is not first:
                            counters.add("requests.hedge_won")
                        # The read took at least this long: a lower bound keeps the
                        # tracker honest when the store as a whole slows down.
                        latency.observe(time.monotonic() - started, policy)
                        return task.result()
                    errors.append(failure)
            raise errors[0]  # both failed
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)
