"""What every connection through `~stoker.testing.netproxy.NetProxy` shares: the link, the
fault policy, the rate limit, the counters, and the open connections
(`~stoker.testing.relay.Relay`, one per connection)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Protocol

from stoker.testing.faults import FAULT_KINDS, FaultPolicy
from stoker.testing.link import Link, LinkConfig
from stoker.testing.ratelimit import PrefixRateLimiter

__all__ = ["OpenRelay", "ProxyState", "ProxyStats"]


class OpenRelay(Protocol):
    """What the proxy uses of an open connection."""

    connecting: asyncio.Task[None] | None
    held_until: float  # when the response held back is delivered (loop time)

    def close(self, *, reset: bool = False, abort: bool = False) -> None: ...


@dataclass(slots=True, kw_only=True)
class ProxyStats:
    """Counters of one proxy; `NetProxy.stats` returns a snapshot copy.

    Attributes:
        connections: Client connections accepted.
        requests: HTTP requests seen from clients: forwarded plus faulted plus throttled.
        forwarded: Requests forwarded to the upstream server untouched.
        throttled: Requests the per-prefix rate limit answered ``503 SlowDown``.
        faults: Requests faulted, by fault kind (response faults are forwarded too, but
            counted here and not in ``forwarded``).
        bytes_up: Bytes read from clients.
        bytes_down: Bytes read from the upstream server.
    """

    connections: int = 0
    requests: int = 0
    forwarded: int = 0
    throttled: int = 0
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 0))
    bytes_up: int = 0
    bytes_down: int = 0

    @property
    def faulted(self) -> int:
        """Requests faulted, all kinds together."""
        return sum(self.faults.values())


@dataclass(slots=True, kw_only=True)
class ProxyState:
    """What every connection of one proxy shares.

    Attributes:
        upstream: Host and port of the real server.
        link: Delay and bandwidth of the emulated link.
        up_link: The client-to-server direction of the link, shared by all connections.
        down_link: The server-to-client direction.
        policy: The fault injection; `NetProxy.set_faults` replaces it whole.
        limiter: The per-prefix rate limit, if any; `NetProxy.set_rate_limit` replaces it.
        stats: The counters.
        lock: Guards the request counters in ``stats`` and ``seen``.
        relays: The open connections.
        seen: Each request's method, target and answer (``"forwarded"``, or the fault, such
            as ``"503"``), in order; None: not recorded.
    """

    upstream: tuple[str, int]
    link: LinkConfig
    up_link: Link
    down_link: Link
    policy: FaultPolicy
    limiter: PrefixRateLimiter | None = None
    stats: ProxyStats = field(default_factory=ProxyStats)
    lock: threading.Lock = field(default_factory=threading.Lock)
    relays: set[OpenRelay] = field(default_factory=set)
    seen: list[tuple[str, str, str]] | None = None

    def decide(self, method: str, target: str) -> str | None:
        """Choose the fault for a request (None: forward it), and count the request.

        A request over its prefix's rate limit is answered "503" (SlowDown)."""
        limiter = self.limiter
        throttled = limiter is not None and not limiter.admit(target)
        kind = "503" if throttled else self.policy.choose(method, target)
        with self.lock:
            self.stats.requests += 1
            if self.seen is not None:
                self.seen.append((method, target, kind or "forwarded"))
            if throttled:
                self.stats.throttled += 1
            elif kind is None:
                self.stats.forwarded += 1
            else:
                self.stats.faults[kind] += 1
        return kind
