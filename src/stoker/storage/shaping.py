"""Client-side request-rate shaping: an adaptive token bucket per (endpoint, bucket, prefix).

S3 partitions a bucket by key prefix and serves each partition a limited number of requests
per second (about 5,500 GETs on AWS, far fewer on many S3-compatible stores); beyond it, it
answers ``503 SlowDown`` (some stores ``429``). Retrying each throttled request on its own
leaves the rate where it was, so many workers stampede one prefix and half their requests
are wasted. Instead every request of the process draws a token from the bucket of its
prefix, and the bucket's rate adapts, as the AWS SDKs' "adaptive" retry mode does:

* **Unbounded until the first throttle.** No rate limit, only a window on the requests in
  flight per prefix that starts at 8 and grows by one with every success (it doubles every
  round trip, as TCP's slow start does, and is gone after 1,024 successes), so that a
  process does not send its whole in-flight limit (128) into a throttled prefix at once.
* **Multiplicative decrease.** A throttle sets the rate to ``decrease_factor`` times the
  rate in force (the first time: times the rate the server admitted over the last second).
  Only a request sent after the last decrease can decrease it again, so the burst of
  throttles one overshoot causes counts as one signal; a request that waited for an I/O
  slot across a decrease takes a new token before it goes.
* **Increase.** After the first decrease the rate doubles every second (a slow start,
  since the first estimate is rough) until the next throttle; from then on it grows
  additively, by ``(1 - decrease_factor)`` of the rate at the last throttle every
  ``recovery_s``, with a random factor in [0.75, 1.25] drawn at each decrease so that
  processes sharing a prefix fall out of step. Once back at the rate it was throttled at
  without a new throttle, it doubles every second again (a neighbour may have gone). It
  does not grow while above twice the rate the server admitted over the last second (a
  client that asks for less keeps its learned rate, but does not inflate it).
* A fixed cap (``StorageOptions.max_requests_per_s``) bounds the rate from the start.
* ``ShapingPolicy(adaptive=False)`` leaves only the cap: no window, no adaptation.

**Prefix.** S3 splits partitions at key prefixes, and datasets are laid out as one directory
per dataset (or per hashed shard prefix), so the prefix here is the store's root plus the
first path segment of the key below it: for a store at ``s3://b/datasets/imagenet``, the key
``train/shard-0001.tar`` belongs to ``datasets/imagenet/train`` and ``index.json`` to
``datasets/imagenet``.

**Saying so.** The first throttle of the process is logged as a warning (shown without
``-v``), with the rate the prefix had reached; later ones at debug level. Each shaper keeps
when it last served a request and since when it has throttled every one, so that a transfer
can give up on a store that throttles everything (:meth:`Shapers.throttled_since`).

**Processes on one node** each adapt on their own, with the jitter above; what each learns
is not shared through a file. Measured (docs/reliability.md): 2 downloads and 8 loader ranks
on one prefix converge to 0.87-0.93x its limit with 2-4 % of requests throttled, so a file
(its locking, its stale entries, where it lives without a cache directory) buys too little.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_WINDOW_S = 1.0  # the window the admitted rate is measured over
_MAX_SLEEP_S = 0.05  # a waiter re-reads the rate at least this often
_INITIAL_WINDOW = 8  # requests in flight per prefix before the first success
_OPEN_WINDOW = 1024  # a window this large is no bound: drop it
_MIN_ESTIMATE_S = 0.1  # the first estimate of the admitted rate is over at least this long


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapingPolicy:
    """How the request rate of a prefix adapts to throttling.

    Attributes:
        adaptive: Adapt the rate to throttles; False leaves only the fixed cap
            (``StorageOptions.max_requests_per_s``), if any.
        decrease_factor: A throttle multiplies the rate by this.
        recovery_s: Time the additive increase takes to win back what one decrease took.
        min_requests_per_s: The rate never drops below this.
        burst_s: The bucket holds this many seconds' worth of tokens (at least one), so
            requests are paced rather than sent in bursts.
    """

    adaptive: bool = True
    decrease_factor: float = 0.7
    recovery_s: float = 2.0
    min_requests_per_s: float = 1.0
    burst_s: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 < self.decrease_factor < 1.0:
            raise ValueError(f"decrease_factor must be in (0, 1), got {self.decrease_factor}")
        if self.recovery_s <= 0 or self.min_requests_per_s <= 0 or self.burst_s < 0:
            raise ValueError(
                "recovery_s and min_requests_per_s must be > 0 and burst_s >= 0, got "
                f"{self.recovery_s}, {self.min_requests_per_s}, {self.burst_s}"
            )


def prefix_of(root: str, key: str) -> str:
    """The prefix a request for ``key`` counts against: ``root`` plus the key's first
    path segment when the key has a directory (see the module docstring)."""
    root = root.strip("/")
    key = key.strip("/")
    head, sep, _ = key.partition("/")
    first = head if sep else ""
    if root and first:
        return f"{root}/{first}"
    return root or first


class PrefixShaper:
    """The adaptive token bucket of one prefix; used from one event loop.

    Args:
        policy: How the rate adapts.
        cap: Fixed most requests per second; None for none.
        clock: Monotonic clock in seconds (tests pass a fake one).
        rng: Jitter source.
        name: The prefix, for messages.
        on_first_throttle: Called once, at the first throttle, with the shaper and the
            requests per second the prefix had reached.
    """

    def __init__(
        self,
        *,
        policy: ShapingPolicy,
        cap: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        name: str = "",
        on_first_throttle: Callable[[PrefixShaper, float], None] | None = None,
    ) -> None:
        self.policy = policy
        self.cap = cap
        self.name = name
        self.throttles = 0
        #: When a request was last served (any answer but a throttle); -inf: never.
        self.served_at = -float("inf")
        #: When the first throttle since the last served request came; None: none since.
        self.throttled_since: float | None = None
        #: When the last throttle came; -inf: never.
        self.throttled_at = -float("inf")
        self._on_first_throttle = on_first_throttle
        #: Requests that waited for a token of the shaped rate, and the seconds they did.
        self.waits = 0
        self.wait_s = 0.0
        #: Requests that waited for room in the slow-start window, and the seconds they did.
        self.window_waits = 0
        self.window_wait_s = 0.0
        self._clock = clock
        self._rng = rng or random.Random()
        self._rate: float | None = None  # the adaptive rate; None until the first throttle
        self._slow_start = False
        self._increase_per_s = 0.0
        self._last_decrease = -float("inf")
        self._last_update = 0.0
        self._last_throttled_rate = 0.0
        self._started = clock()
        self._tokens = 1.0
        self._last_refill = clock()
        self._admitted: collections.deque[float] = collections.deque()
        self._refused: collections.deque[float] = collections.deque()  # throttles, last second
        self._lock = asyncio.Lock()
        # Until the first throttle, requests in flight are bounded by a window that grows
        # by one with each success (doubling every round trip), as TCP's slow start does.
        self._window: int | None = _INITIAL_WINDOW if policy.adaptive else None
        self._in_flight = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def rate(self) -> float | None:
        """The requests per second allowed now (None: unbounded)."""
        if self._rate is None:
            return self.cap
        return self._rate if self.cap is None else min(self._rate, self.cap)

    def _expire(self, now: float) -> None:
        for times in (self._admitted, self._refused):
            while times and times[0] < now - _WINDOW_S:
                times.popleft()

    async def acquire(self) -> tuple[float, float]:
        """Wait for room in the window and a token; return the time the request may be sent
        (for :meth:`throttled`) and the seconds waited for the token: the shaped rate's
        wait (after a throttle, or under a cap), which the store counts as
        ``shaping.wait_ms``. The wait for room in the slow-start window is queueing, as
        for an I/O slot, and is counted apart (:attr:`window_waits`,
        :attr:`window_wait_s`). Call :meth:`release` when the request is done, however it
        ends."""
        start = self._clock()
        if await self._enter_window():
            self.window_waits += 1
            self.window_wait_s += self._clock() - start
        try:
            return await self.take_token()
        except BaseException:
            self.release()
            raise

    async def take_token(self, start: float | None = None) -> tuple[float, float]:
        """Wait for a token alone (the request already holds its place in the window)."""
        now = start = self._clock() if start is None else start
        if self.rate is None:  # no shaped rate: no wait (not the clock's few microseconds)
            return now, 0.0
        if self.rate is not None:
            async with self._lock:
                while (rate := self.rate) is not None:
                    now = self._clock()
                    capacity = max(1.0, rate * self.policy.burst_s)
                    self._tokens = min(capacity, self._tokens + (now - self._last_refill) * rate)
                    self._last_refill = now
                    if self._tokens >= 1.0:
                        self._tokens -= 1.0
                        break
                    await asyncio.sleep(min((1.0 - self._tokens) / rate, _MAX_SLEEP_S))
        now = self._clock()
        waited = now - start
        if waited > 0:
            self.waits += 1
            self.wait_s += waited
        return now, waited

    async def _enter_window(self) -> bool:
        """Take a place in the window; whether that meant waiting for one."""
        waited = False
        while self._window is not None and self._in_flight >= self._window:
            waited = True
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done() or waiter.cancelled():
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                self._wake()  # pass a wake-up on if this waiter was cancelled
        self._in_flight += 1
        return waited

    def release(self) -> None:
        """A request that :meth:`acquire` let through is done."""
        self._in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        free = len(self._waiters) if self._window is None else self._window - self._in_flight
        while self._waiters and free > 0:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1

    def outdated(self, sent_at: float) -> bool:
        """Whether the rate decreased since a token was taken at ``sent_at``: a request that
        has not been sent yet should take a new one."""
        return sent_at < self._last_decrease

    def succeeded(self) -> None:
        """Count a request the server served (any answer but a throttle)."""
        now = self._clock()
        self._admitted.append(now)
        self._expire(now)
        self.served_at = now
        self.throttled_since = None
        if self._window is not None:
            self._window = self._window + 1 if self._window < _OPEN_WINDOW else None
            self._wake()
        if self._rate is None:
            return
        elapsed = now - self._last_update
        self._last_update = now
        if self._rate > 2.0 * len(self._admitted) / _WINDOW_S:
            return  # the client asks for less than it may: keep the rate, do not inflate it
        if self._slow_start:
            self._rate *= 2.0**elapsed
        else:
            self._rate += self._increase_per_s * elapsed
            # Back where it was throttled, and no throttle since: probe faster for more (a
            # neighbour may have gone).
            self._slow_start = self._rate >= self._last_throttled_rate

    def throttled(self, sent_at: float) -> None:
        """Count a throttled request sent at ``sent_at`` (from :meth:`acquire`); decrease
        the rate if it was sent after the last decrease."""
        now = self._clock()
        self.throttles += 1
        self.throttled_at = now
        if self.throttled_since is None:
            self.throttled_since = now
        self._refused.append(now)
        self._expire(now)
        if self.throttles == 1 and self._on_first_throttle is not None:
            seen_s = min(_WINDOW_S, max(now - self._started, _MIN_ESTIMATE_S))
            self._on_first_throttle(self, (len(self._admitted) + len(self._refused)) / seen_s)
        if not self.policy.adaptive or sent_at < self._last_decrease:
            return
        policy = self.policy
        first = self._rate is None
        if first:
            # A rough estimate (a burst may have just been admitted); slow start mends it.
            seen_s = min(_WINDOW_S, max(now - self._started, _MIN_ESTIMATE_S))
            base = len(self._admitted) / seen_s
            self._slow_start = True
            self._tokens, self._last_refill = 0.0, now
        else:
            base = self.rate or 0.0
            self._slow_start = False
        self._last_throttled_rate = base
        self._window = None  # the rate governs from now on
        self._wake()
        self._rate = max(policy.min_requests_per_s, base * policy.decrease_factor)
        jitter = self._rng.uniform(0.75, 1.25)
        self._increase_per_s = base * (1.0 - policy.decrease_factor) / policy.recovery_s * jitter
        self._last_decrease = self._last_update = now
        logger.debug("throttled: request rate now %.1f/s", self._rate)
        if first:
            logger.debug("throttled by the store: shaping requests, %.1f/s to start", self._rate)


ShaperKey = tuple[str, str, str]


class Shapers:
    """The process's prefix shapers, keyed by (endpoint, bucket, prefix); an I/O engine owns
    one (:attr:`stoker.storage.engine.IOEngine.shapers`), so every store on it shares them."""

    def __init__(self) -> None:
        self._shapers: dict[ShaperKey, PrefixShaper] = {}
        self._warned = False

    def get(self, key: ShaperKey, *, policy: ShapingPolicy, cap: float | None) -> PrefixShaper:
        """The shaper of ``key``, made with ``policy`` on first use. A cap lowers the
        shaper's cap (the lowest any store of the process gave holds)."""
        shaper = self._shapers.get(key)
        if shaper is None:
            name = "/".join(part for part in key[1:] if part)
            shaper = self._shapers[key] = PrefixShaper(
                policy=policy, cap=cap, name=name, on_first_throttle=self._first_throttle
            )
        elif cap is not None and (shaper.cap is None or cap < shaper.cap):
            shaper.cap = cap
        return shaper

    def _first_throttle(self, shaper: PrefixShaper, rate: float) -> None:
        # Once a process: a user without -v hears that the store is the bottleneck.
        if self._warned:
            logger.info("the store is throttling requests to %s too", shaper.name)
            return
        self._warned = True
        logger.warning(
            "the store is throttling requests to %s (503 SlowDown or 429) at %.0f requests/s; %s",
            shaper.name or "its root",
            rate,
            "backing off" if shaper.policy.adaptive else "retrying (adaptive rate is off)",
        )

    def throttled_since(self) -> float | None:
        """Since when every answer the store gave has been a throttle: the last request
        served on any prefix, or the first throttle if none was ever served; None if the
        last answer was not a throttle (or none came)."""
        shapers = list(self._shapers.values())
        served = max((s.served_at for s in shapers), default=-float("inf"))
        since = [
            s.throttled_since
            for s in shapers
            if s.throttled_since is not None and s.throttled_at > served
        ]
        return max(served, min(since)) if since else None

    def snapshot(self) -> dict[ShaperKey, tuple[int, float | None]]:
        """Each shaper's throttles and current rate (None: unbounded)."""
        return {key: (s.throttles, s.rate) for key, s in list(self._shapers.items())}
