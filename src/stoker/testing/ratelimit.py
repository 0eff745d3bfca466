"""The per-prefix request-rate limit of `~stoker.testing.netproxy.NetProxy`: S3's throttling.

S3 serves each partition of a bucket (a key prefix) a limited number of requests per second
and answers ``503 SlowDown`` beyond it. `PrefixRateLimiter` does the same to the requests
that pass through the proxy: a token bucket per prefix admits ``requests_per_s`` (with a
burst of ``burst_s`` seconds' worth), and a request that finds its bucket empty is answered
``503 SlowDown`` without reaching the server.

A request's prefix is the first ``prefix_depth`` path segments of its key (path-style
addressing: ``/BUCKET/KEY``); a request without a key (a LIST) counts against the first
segments of its ``prefix=`` query parameter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["PrefixCounts", "PrefixRateLimiter", "RateLimitConfig", "request_prefix"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitConfig:
    """How many requests per second the proxy admits per prefix.

    Attributes:
        requests_per_s: Requests admitted per second and prefix.
        burst_s: The bucket holds this many seconds' worth of requests (at least one).
        prefix_depth: Path segments of the key that make its prefix.
    """

    requests_per_s: float
    burst_s: float = 0.1
    prefix_depth: int = 1

    def __post_init__(self) -> None:
        if not self.requests_per_s > 0:
            raise ValueError(f"requests_per_s must be > 0, got {self.requests_per_s}")
        if self.burst_s < 0 or self.prefix_depth < 1:
            raise ValueError(
                f"burst_s must be >= 0 and prefix_depth >= 1, got {self.burst_s}, "
                f"{self.prefix_depth}"
            )


@dataclass(frozen=True, slots=True)
class PrefixCounts:
    """What the rate limit did to the requests of one prefix.

    Attributes:
        admitted: Requests passed on.
        throttled: Requests answered ``503 SlowDown``.
        seconds: Time from the prefix's first request to its last.
    """

    admitted: int
    throttled: int
    seconds: float

    @property
    def admitted_per_s(self) -> float:
        """Requests admitted per second, between the first request and the last."""
        return self.admitted / self.seconds if self.seconds > 0 else 0.0


def request_prefix(target: str, depth: int) -> str:
    """The bucket and prefix of an HTTP request-target, as ``BUCKET/SEG1/.../SEGdepth``."""
    parts = urlsplit(target)
    bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
    segments = [s for s in key.split("/") if s][:-1]  # a key's last segment is its name
    if not key:
        listed = parse_qs(parts.query).get("prefix", [""])[0]
        segments = [s for s in listed.split("/") if s]
    return "/".join([bucket, *segments[:depth]])


class PrefixRateLimiter:
    """A token bucket per prefix; thread-safe.

    Args:
        config: The rate, burst and prefix depth.
        clock: Monotonic clock in seconds.
    """

    def __init__(
        self, config: RateLimitConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self._clock = clock
        self._capacity = max(1.0, config.requests_per_s * config.burst_s)
        self._buckets: dict[str, tuple[float, float]] = {}  # prefix: (tokens, last refill)
        self.lock = threading.Lock()
        self._admitted: dict[str, int] = {}
        self._throttled: dict[str, int] = {}
        self._span: dict[str, tuple[float, float]] = {}  # first and last request

    def admit(self, target: str) -> bool:
        """Take a token for a request to ``target``; False if it is to be throttled."""
        prefix = request_prefix(target, self.config.prefix_depth)
        now = self._clock()
        with self.lock:
            tokens, last = self._buckets.get(prefix, (self._capacity, now))
            tokens = min(self._capacity, tokens + (now - last) * self.config.requests_per_s)
            ok = tokens >= 1.0
            self._buckets[prefix] = (tokens - 1.0 if ok else tokens, now)
            counts = self._admitted if ok else self._throttled
            counts[prefix] = counts.get(prefix, 0) + 1
            self._span[prefix] = (self._span.get(prefix, (now, now))[0], now)
        return ok

    def counts(self) -> dict[str, PrefixCounts]:
        """Requests admitted and throttled so far, per prefix (``BUCKET/PREFIX``)."""
        with self.lock:
            return {
                prefix: PrefixCounts(
                    self._admitted.get(prefix, 0), self._throttled.get(prefix, 0), last - first
                )
                for prefix, (first, last) in sorted(self._span.items())
            }
