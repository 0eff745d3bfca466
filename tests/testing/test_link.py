"""The delaying link's deadlines, on a clock the test drives: what the proxy tests would
otherwise have to time (a round trip per request, a handshake's extra round trips, a
bandwidth cap), checked as the numbers the link schedules, not as durations measured."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stoker.testing.link import Action, Channel, Link


class _Loop:
    """The parts of an event loop a Channel uses, with a clock the test sets."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Any]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        self.timers.append((when, lambda: callback(*args)))
        return _Handle()  # type: ignore[return-value]

    def run_until(self, now: float) -> None:
        self.now = now
        due = [t for t in self.timers if t[0] <= now]
        self.timers = [t for t in self.timers if t[0] > now]
        for _, call in sorted(due, key=lambda t: t[0]):
            call()


class _Handle:
    def cancel(self) -> None:
        pass


class _Owner:
    def __init__(self, loop: _Loop) -> None:
        self.loop = loop

    def act(self, channel: Channel, action: Action) -> None:
        pass


class _Sink:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def _channel(
    rtt_s: float, *, connect_rtts: float = 0.0, rate: float = 0.0
) -> tuple[Channel, _Loop, _Sink]:
    loop = _Loop()
    channel = Channel(_Owner(loop), Link(rate), rtt_s / 2, connect_rtts * rtt_s)  # type: ignore[arg-type]
    sink = _Sink()
    channel.dst = sink  # type: ignore[assignment]
    return channel, loop, sink


def test_bytes_are_held_half_a_round_trip_plus_the_handshake_once() -> None:
    channel, loop, sink = _channel(0.1, connect_rtts=1.0)
    channel.feed(b"first", now=0.0)
    assert channel.last == pytest.approx(0.05 + 0.1)  # one way, and the handshake's RTT
    loop.run_until(0.14)
    assert sink.written == []  # not before its deadline
    loop.run_until(0.15)
    assert sink.written == [b"first"]
    channel.feed(b"second", now=1.0)
    assert channel.last == pytest.approx(1.05)  # the handshake is charged once
    loop.run_until(1.05)
    assert sink.written == [b"first", b"second"]


def test_a_bandwidth_cap_spaces_bytes_by_their_size() -> None:
    channel, _, _ = _channel(0.0, rate=2e6)
    fin = channel.advance(1_000_000, t0=0.0)
    assert fin == pytest.approx(0.5)  # 1 MB at 2 MB/s
    # The link is shared: bytes entering while it is busy wait for it to be free.
    assert channel.advance(1_000_000, t0=0.1) == pytest.approx(1.0)
    assert channel.last == pytest.approx(1.0)


def test_deadlines_never_go_backwards() -> None:
    channel, loop, sink = _channel(0.2)
    channel.feed(b"a", now=0.0)
    channel.one_way = 0.01  # a later chunk with a shorter delay still comes after
    channel.feed(b"b", now=0.05)
    assert channel.last == pytest.approx(0.1)
    loop.run_until(0.1)
    assert b"".join(sink.written) == b"ab"
