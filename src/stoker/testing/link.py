"""The emulated wide-area link of `~stoker.testing.netproxy.NetProxy`.

Its shape (`LinkConfig`), each direction's bandwidth shared by all connections and kept as a
virtual clock of when it is next free (`Link`), and each connection's two `Channel`s, which
hold every chunk until its deadline: half the round trip after it is on the link, plus the
handshake's round trips for the first bytes.  A channel stops reading its source while more
than 50 ms of data waits for the link, so senders feel backpressure.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import math
import re
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Action", "Channel", "ChannelOwner", "Link", "LinkConfig", "parse_rate"]

_TIMER_SLACK = 0.0005  # event-loop timers fire late (epoll rounds up to 1 ms): aim a bit early
_QUEUE_MAX_S = 0.05  # like a router buffer: stop reading while more than this waits for the link
_QUEUE_MAX_BYTES = 8 << 20  # per connection and direction: bounds memory on uncapped links


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkConfig:
    """Shape of the emulated wide-area link.

    Attributes:
        rtt_s: Round-trip time to add, in seconds; half of it is added on each direction.
        bandwidth_bytes_s: Bandwidth of each direction in bytes per second, shared by all
            connections; 0 means unlimited.
        connect_rtts: Extra round trips before the first bytes of a new connection reach the
            server (1 for a TCP handshake, 2 or 3 with TLS).
    """

    rtt_s: float = 0.02
    bandwidth_bytes_s: float = 0.0
    connect_rtts: float = 1.0

    def __post_init__(self) -> None:
        for name in ("rtt_s", "bandwidth_bytes_s", "connect_rtts"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"LinkConfig.{name} must be a finite number >= 0, got {value!r}")


class Action(enum.Enum):
    """What a channel does when it reaches a marker queued between chunks."""

    EOF = enum.auto()  # half-close the destination
    RESET = enum.auto()  # reset the client, close the server connection
    CLOSE = enum.auto()  # close both connections once written


class Link:
    """One direction of the shared path: when it is next free."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.free_at = 0.0


class ChannelOwner(Protocol):
    """The connection a `Channel` belongs to: its event loop, and what to do on an `Action`."""

    loop: asyncio.AbstractEventLoop

    def act(self, channel: Channel, action: Action) -> None: ...


class Channel:
    """One direction of one connection: holds chunks until their deadline, in order."""

    def __init__(self, conn: ChannelOwner, link: Link, one_way: float, extra: float) -> None:
        self.conn, self.loop, self.link = conn, conn.loop, link
        self.one_way = one_way
        self.extra = extra  # charged once, on the first bytes
        self.last = 0.0  # deadline of the last byte charged: deadlines never go backwards
        self.queue: collections.deque[tuple[float, bytes | Action]] = collections.deque()
        self.queued = 0
        self.timer: asyncio.TimerHandle | None = None
        self.src: asyncio.Transport | None = None
        self.dst: asyncio.Transport | None = None
        self.paused: set[str] = set()  # why src is not being read
        self.done = False

    def advance(self, size: int, t0: float) -> float:
        """Charge size bytes that enter the link at t0; return when they are all on it."""
        fin = t0
        if self.link.rate > 0.0:
            fin = self.link.free_at = max(t0, self.link.free_at) + size / self.link.rate
        self.last = max(self.last, fin + self.one_way + self.extra)
        self.extra = 0.0
        return fin

    def push(self, item: bytes | Action, size: int, t0: float, now: float) -> float:
        fin = self.advance(size, t0)
        if self.done:
            return fin
        self.queue.append((self.last, item))
        self.queued += size
        if self.timer is None:
            if self.last - _TIMER_SLACK <= now:
                self.flush()
            else:
                self.timer = self.loop.call_at(self.last - _TIMER_SLACK, self.flush)
        if self.queued > _QUEUE_MAX_BYTES:
            self.pause("queue")
        return fin

    def feed(self, data: bytes, now: float) -> None:
        fin = self.push(data, len(data), now, now)
        if fin - now > _QUEUE_MAX_S and "link" not in self.paused:
            self.pause("link")
            self.loop.call_at(fin - _QUEUE_MAX_S, self.resume, "link")

    def flush(self) -> None:
        self.timer = None
        dst, queue = self.dst, self.queue
        if dst is None or self.done or not queue:
            return
        limit = self.loop.time() + _TIMER_SLACK
        chunks: list[bytes] = []
        while queue and queue[0][0] <= limit:
            item = queue.popleft()[1]
            if not isinstance(item, bytes):
                dst.write(b"".join(chunks))
                self.conn.act(self, item)
                return
            chunks.append(item)
            self.queued -= len(item)
        if chunks:
            dst.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if queue:
            self.timer = self.loop.call_at(queue[0][0] - _TIMER_SLACK, self.flush)
        if "queue" in self.paused and self.queued <= _QUEUE_MAX_BYTES // 2:
            self.resume("queue")

    def pause(self, reason: str) -> None:
        if not self.paused and self.src is not None:
            self.src.pause_reading()
        self.paused.add(reason)

    def resume(self, reason: str) -> None:
        if reason in self.paused:
            self.paused.discard(reason)
            if not self.paused and self.src is not None:
                self.src.resume_reading()

    def stop(self) -> None:
        self.done = True
        self.queue.clear()
        if self.timer is not None:
            self.timer.cancel()


_RATE = re.compile(
    r"\s*(?P<number>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*"
    r"(?P<prefix>[kKmMgGtT]?)(?P<binary>i?)(?P<unit>[A-Za-z/]*)\s*"
)
_PREFIX_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_rate(text: str) -> float:
    """Parse a bandwidth such as "1gbit", "800mbit", "100MB", "50MiB" or "0".

    A plain number is bytes per second; "bit", "bits", "bps" and "bit/s" mean bits; "B" and
    "B/s" mean bytes; a prefix with "i" (as in "MiB") is binary.

    Returns:
        Bytes per second; 0 means unlimited.

    Raises:
        ValueError: If text is not a rate.
    """
    match = _RATE.fullmatch(text)
    if match is None:
        raise ValueError(f"bad rate {text!r}: expected e.g. 0, 800mbit, 1gbit, 100MB, 50MiB")
    number, prefix, binary, unit = match.group("number", "prefix", "binary", "unit")
    if unit.lower() in ("bit", "bits", "bps", "bit/s"):
        divisor = 8.0
    elif unit in ("B", "B/s") or not (unit or prefix or binary):
        divisor = 1.0
    else:
        raise ValueError(f"bad rate {text!r}: say bit (bits/s) or B (bytes/s), as in 1gbit, 100MB")
    base = 1024.0 if binary else 1000.0
    return float(number) * base ** _PREFIX_POWERS[prefix.lower()] / divisor
