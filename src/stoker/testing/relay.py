"""One connection through `~stoker.testing.netproxy.NetProxy` (what connections share is
:mod:`stoker.testing.proxystate`).

A `Relay` carries the bytes of one client connection both ways through the link's channels
(:mod:`stoker.testing.link`).  Client-to-server bytes are HTTP/1.1 requests, not pipelined;
only their heads are parsed (bodies are counted by ``Content-Length`` or chunked framing), so
that a request can be answered with a fault instead, or forwarded with its response spoiled
(:mod:`stoker.testing.faults` describes each kind).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from typing import cast

from stoker.testing.faults import (
    RESPONSE_FAULTS,
    ResponseCutter,
    error_response,
)
from stoker.testing.link import Action, Channel
from stoker.testing.proxystate import ProxyState, ProxyStats

__all__ = ["ProxyState", "ProxyStats", "Relay"]

_log = logging.getLogger(__name__)

_HEAD_MAX = 64 << 10  # a longer request head is not HTTP we understand: pass the rest through
# Request parser states; _RAW passes bytes through unparsed, _DEAD drops them.
_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _RAW, _DEAD = range(7)


class Relay(asyncio.Protocol):
    """One proxied connection: the client-side protocol, both channels, the request parser."""

    client: asyncio.Transport
    connecting: asyncio.Task[None] | None = None
    upstream: asyncio.Transport | None = None

    def __init__(self, proxy: ProxyState) -> None:
        self.proxy, self.loop = proxy, asyncio.get_running_loop()
        rtt, half = proxy.link.rtt_s, proxy.link.rtt_s / 2
        self.up = Channel(self, proxy.up_link, half, proxy.link.connect_rtts * rtt)
        self.down = Channel(self, proxy.down_link, half, 0.0)
        self.closed = False
        self.state, self.buf, self.remaining = _HEAD, b"", 0
        self.fault: str | None = None  # the request fault chosen for the request being read
        self.head_only = False  # that request is a HEAD: its error response has no body
        self.cutter: ResponseCutter | None = None  # spoils the response being received
        self.stalled = False  # a "stall" cut its response: hold the client until it gives up
        self.hold_s: float | None = None  # a timed "stall": hold the next response this long
        self.held_until = 0.0  # when the response held back is delivered (loop time)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = self.up.src = self.down.dst = cast(asyncio.Transport, transport)
        _nodelay(self.client)
        self.proxy.relays.add(self)
        with self.proxy.lock:
            self.proxy.stats.connections += 1
        self.connecting = self.loop.create_task(self._connect())

    def data_received(self, data: bytes) -> None:
        self.proxy.stats.bytes_up += len(data)
        now = self.loop.time()
        if self.state >= _RAW:
            if self.state == _RAW:
                self.up.feed(data, now)
            return
        data, self.buf = self.buf + data if self.buf else data, b""
        out: list[bytes] = []  # bytes to forward, in order
        pos, end = 0, len(data)
        while pos < end and self.state < _RAW:
            state = self.state
            if state in (_BODY, _CHUNK_DATA):
                stop = min(end, pos + self.remaining)
                self._take(out, data[pos:stop] if stop - pos < end else data, now)
                self.remaining -= stop - pos
                pos = stop
                if not self.remaining and state == _BODY:
                    self._request_done(now)
                elif not self.remaining:
                    self.state = _CHUNK_SIZE
                continue
            stop = data.find(b"\r\n\r\n" if state == _HEAD else b"\r\n", pos)
            if stop < 0:
                if end - pos > _HEAD_MAX:
                    self._lost_framing(now)
                else:
                    self.buf = data[pos:]
                break
            stop += 4 if state == _HEAD else 2
            piece = data[pos:stop] if stop - pos < end else data
            pos = stop
            if state == _HEAD:
                self._on_head(out, piece, now)
                continue
            self._take(out, piece, now)
            if state == _TRAILER:
                if piece == b"\r\n":
                    self._request_done(now)
                continue
            try:
                size = int(piece.split(b";", 1)[0], 16)
            except ValueError:
                self._lost_framing(now)
                continue
            self.state, self.remaining = (_CHUNK_DATA, size + 2) if size else (_TRAILER, 0)
        if self.state == _RAW:
            out.append(data[pos:])
        if out:
            self.up.feed(out[0] if len(out) == 1 else b"".join(out), now)

    def eof_received(self) -> bool:
        now = self.loop.time()
        self.up.push(Action.EOF, 0, now, now)
        return True  # keep the other direction open until the server is done

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(abort=True)

    def pause_writing(self) -> None:
        self.down.pause("write")

    def resume_writing(self) -> None:
        self.down.resume("write")

    def _take(self, out: list[bytes], piece: bytes, now: float) -> None:
        if self.fault is None:
            out.append(piece)
            return
        if out:  # a faulted request's bytes go nowhere, but they still use the link
            self.up.feed(b"".join(out), now)
            out.clear()
        self.up.advance(len(piece), now)

    def _on_head(self, out: list[bytes], head: bytes, now: float) -> None:
        request_line = head[: head.find(b"\r\n")].split(b" ")
        lower = head.lower()
        try:
            length = int(_header(lower, b"content-length") or b"0")
        except ValueError:
            length = -1
        if len(request_line) != 3 or not request_line[2].startswith(b"HTTP/1.") or length < 0:
            out.append(head)
            self._lost_framing(now)
            return
        method = request_line[0].decode("latin-1")
        fault = self.proxy.decide(method, request_line[1].decode("latin-1"))
        self.head_only = method == "HEAD"
        # A response fault forwards the request; requests are not pipelined, so the next
        # response from the server is this request's.
        self.cutter, self.hold_s = None, None
        stall_s = self.proxy.policy.config.stall_s
        if fault == "stall" and stall_s is not None:
            self.hold_s, fault = stall_s, None
        elif fault in RESPONSE_FAULTS:
            self.cutter, fault = ResponseCutter(fault, head_only=self.head_only), None
        self.fault = fault
        self._take(out, head, now)
        if self.fault == "reset":
            self.down.push(Action.RESET, 0, self.up.last, now)
            self.state = _DEAD
        elif self.fault is not None and b"100-continue" in _header(lower, b"expect"):
            self._respond(now, close=True)  # the client may never send the body
        elif b"chunked" in _header(lower, b"transfer-encoding"):
            self.state = _CHUNK_SIZE
        elif length:
            self.state, self.remaining = _BODY, length
        else:
            self._request_done(now)

    def _request_done(self, now: float) -> None:
        self.state = _HEAD
        if self.fault is not None:
            self._respond(now, close=False)
            self.fault = None

    def _respond(self, now: float, *, close: bool) -> None:
        response = error_response(
            self.fault or "503",
            retry_after_s=self.proxy.policy.config.retry_after_s,
            close=close,
            head_only=self.head_only,
        )
        # It leaves one RTT after the request did: half to reach the server, half to return.
        self.down.push(response, len(response), self.up.last, now)
        if close:
            self.down.push(Action.CLOSE, 0, self.up.last, now)
            self.state = _DEAD

    def _lost_framing(self, now: float) -> None:
        _log.debug("netproxy: lost HTTP/1.1 request framing; passing the connection through")
        if self.fault is not None:
            self._respond(now, close=True)
        else:
            self.state = _RAW

    async def _connect(self) -> None:
        host, port = self.proxy.upstream
        try:
            await self.loop.create_connection(lambda: _Upstream(self), host, port)
        except OSError as exc:
            _log.warning("netproxy: cannot connect to upstream %s:%d: %s", host, port, exc)
            self.close(reset=True)

    def upstream_made(self, transport: asyncio.Transport) -> None:
        if self.closed:
            transport.abort()
            return
        _nodelay(transport)
        self.upstream = self.up.dst = self.down.src = transport
        if self.down.paused:
            transport.pause_reading()
        if self.up.timer is None:
            self.up.flush()

    def response_received(self, data: bytes) -> None:
        now = self.loop.time()
        if self.hold_s is not None:  # deadlines never go backwards: all of it waits
            self.held_until = now + self.hold_s
            self.down.last = max(self.down.last, self.held_until)
            self.hold_s = None
        cutter = self.cutter
        if cutter is None:
            self.down.feed(data, now)
            return
        if cutter.cut:
            return  # after the cut point, the server's bytes go nowhere
        data = cutter.feed(data)
        if data:
            self.down.feed(data, now)
        if not cutter.cut:
            return
        if cutter.kind == "stall":
            self.stalled = True
            self.up.stop()  # the client waits for this response: it sends nothing more
        else:
            action = Action.RESET if cutter.kind == "body_reset" else Action.CLOSE
            self.down.push(action, 0, now, now)

    def upstream_lost(self) -> None:
        if self.stalled:
            return  # the client still waits; it must see nothing before its timeout
        if not self.closed:  # deliver what the server sent, then close the client
            now = self.loop.time()
            self.up.stop()
            self.down.push(Action.CLOSE, 0, now, now)

    def act(self, channel: Channel, action: Action) -> None:
        if action is not Action.EOF:
            self.close(reset=action is Action.RESET)
            return
        channel.done = True
        if channel.dst is not None and channel.dst.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                channel.dst.write_eof()
        if self.up.done and self.down.done:
            self.close()

    def close(self, *, reset: bool = False, abort: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.proxy.relays.discard(self)
        self.up.stop()
        self.down.stop()
        if self.connecting is not None:
            self.connecting.cancel()
        sock = self.client.get_extra_info("socket")
        if reset and sock is not None:  # linger 0: close() sends an RST
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for transport in (self.client, self.upstream):
            if transport is not None and (reset or abort):
                transport.abort()
            elif transport is not None:
                transport.close()


class _Upstream(asyncio.Protocol):
    """The server side of one connection; its `Relay` does the work."""

    def __init__(self, conn: Relay) -> None:
        self.conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn.upstream_made(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self.conn.proxy.stats.bytes_down += len(data)
        self.conn.response_received(data)

    def eof_received(self) -> bool:
        if not self.conn.stalled:
            now = self.conn.loop.time()
            self.conn.down.push(Action.EOF, 0, now, now)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.upstream_lost()

    def pause_writing(self) -> None:
        self.conn.up.pause("write")

    def resume_writing(self) -> None:
        self.conn.up.resume("write")


def _header(lower_head: bytes, name: bytes) -> bytes:
    start = lower_head.find(b"\r\n" + name + b":")
    if start < 0:
        return b""
    start += len(name) + 3
    return lower_head[start : lower_head.find(b"\r\n", start)]


def _nodelay(transport: asyncio.Transport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
