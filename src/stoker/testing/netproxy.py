"""Loopback TCP proxy that makes a local S3-compatible server look like a remote bucket.

Each chunk that passes through is held back as a wide-area link would hold it: half the
round-trip time on each direction, applied to each chunk in order (streamed data is delayed,
not throttled), extra round trips before the first bytes of a new connection (the TCP
handshake), and a bandwidth cap per direction that all connections share, kept as a virtual
clock of when the link is next free.  Reads stop while more than 50 ms of data waits for the
link, so senders feel backpressure.  Loopback TCP itself never sees the delay: this is not
packet-level emulation (no slow start, no loss).

Client-to-server bytes are HTTP/1.1 requests, not pipelined.  Only their heads are parsed
(bodies are counted by ``Content-Length`` or chunked framing), so that a request can be
answered with an S3 ``503 SlowDown``, a ``500 InternalError`` or a TCP reset instead, or
forwarded with its response reset, truncated or stalled part-way (:mod:`stoker.testing.faults`
describes each kind).

Run it as ``python -m stoker.testing.netproxy --upstream 127.0.0.1:8333 --rtt-ms 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import enum
import ipaddress
import logging
import math
import re
import signal
import socket
import struct
import threading
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import cast

from stoker.testing.faults import (
    FAULT_KINDS,
    RESPONSE_FAULTS,
    FaultConfig,
    FaultPolicy,
    ResponseCutter,
    error_response,
)

__all__ = [
    "FAULT_KINDS",
    "FaultConfig",
    "LinkConfig",
    "NetProxy",
    "ProxyStats",
    "main",
    "parse_rate",
]

_log = logging.getLogger(__name__)

_TIMER_SLACK = 0.0005  # event-loop timers fire late (epoll rounds up to 1 ms): aim a bit early
_QUEUE_MAX_S = 0.05  # like a router buffer: stop reading while more than this waits for the link
_QUEUE_MAX_BYTES = 8 << 20  # per connection and direction: bounds memory on uncapped links
_HEAD_MAX = 64 << 10  # a longer request head is not HTTP we understand: pass the rest through
# Request parser states; _RAW passes bytes through unparsed, _DEAD drops them.
_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _RAW, _DEAD = range(7)


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


@dataclass(slots=True, kw_only=True)
class ProxyStats:
    """Counters of one proxy; `NetProxy.stats` returns a snapshot copy.

    Attributes:
        connections: Client connections accepted.
        requests: HTTP requests seen from clients: forwarded plus faulted.
        forwarded: Requests forwarded to the upstream server untouched.
        faults: Requests faulted, by fault kind (response faults are forwarded too, but
            counted here and not in ``forwarded``).
        bytes_up: Bytes read from clients.
        bytes_down: Bytes read from the upstream server.
    """

    connections: int = 0
    requests: int = 0
    forwarded: int = 0
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 0))
    bytes_up: int = 0
    bytes_down: int = 0

    @property
    def faulted(self) -> int:
        """Requests faulted, all kinds together."""
        return sum(self.faults.values())


class _Act(enum.Enum):
    EOF = enum.auto()  # half-close the destination
    RESET = enum.auto()  # reset the client, close the server connection
    CLOSE = enum.auto()  # close both connections once written


class _Link:
    """One direction of the shared path: when it is next free."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.free_at = 0.0


class _Channel:
    """One direction of one connection: holds chunks until their deadline, in order."""

    def __init__(self, conn: _Conn, link: _Link, one_way: float, extra: float) -> None:
        self.conn, self.loop, self.link = conn, conn.loop, link
        self.one_way = one_way
        self.extra = extra  # charged once, on the first bytes
        self.last = 0.0  # deadline of the last byte charged: deadlines never go backwards
        self.queue: collections.deque[tuple[float, bytes | _Act]] = collections.deque()
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

    def push(self, item: bytes | _Act, size: int, t0: float, now: float) -> float:
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


class _Conn(asyncio.Protocol):
    """One proxied connection: the client-side protocol, both channels, the request parser."""

    client: asyncio.Transport
    connecting: asyncio.Task[None] | None = None
    upstream: asyncio.Transport | None = None

    def __init__(self, proxy: NetProxy) -> None:
        self.proxy, self.loop = proxy, asyncio.get_running_loop()
        rtt, half = proxy._link.rtt_s, proxy._link.rtt_s / 2
        self.up = _Channel(self, proxy._up_link, half, proxy._link.connect_rtts * rtt)
        self.down = _Channel(self, proxy._down_link, half, 0.0)
        self.closed = False
        self.state, self.buf, self.remaining = _HEAD, b"", 0
        self.fault: str | None = None  # the request fault chosen for the request being read
        self.head_only = False  # that request is a HEAD: its error response has no body
        self.cutter: ResponseCutter | None = None  # spoils the response being received
        self.stalled = False  # a "stall" cut its response: hold the client until it gives up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = self.up.src = self.down.dst = cast(asyncio.Transport, transport)
        _nodelay(self.client)
        self.proxy._conns.add(self)
        with self.proxy._lock:
            self.proxy._stats.connections += 1
        self.connecting = self.loop.create_task(self._connect())

    def data_received(self, data: bytes) -> None:
        self.proxy._stats.bytes_up += len(data)
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
        self.up.push(_Act.EOF, 0, now, now)
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
        fault = self.proxy._decide(method, request_line[1].decode("latin-1"))
        self.head_only = method == "HEAD"
        # A response fault forwards the request; requests are not pipelined, so the next
        # response from the server is this request's.
        self.cutter = None
        if fault in RESPONSE_FAULTS:
            self.cutter, fault = ResponseCutter(fault, head_only=self.head_only), None
        self.fault = fault
        self._take(out, head, now)
        if self.fault == "reset":
            self.down.push(_Act.RESET, 0, self.up.last, now)
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
            retry_after_s=self.proxy._policy.config.retry_after_s,
            close=close,
            head_only=self.head_only,
        )
        # It leaves one RTT after the request did: half to reach the server, half to return.
        self.down.push(response, len(response), self.up.last, now)
        if close:
            self.down.push(_Act.CLOSE, 0, self.up.last, now)
            self.state = _DEAD

    def _lost_framing(self, now: float) -> None:
        _log.debug("netproxy: lost HTTP/1.1 request framing; passing the connection through")
        if self.fault is not None:
            self._respond(now, close=True)
        else:
            self.state = _RAW

    async def _connect(self) -> None:
        host, port = self.proxy._upstream
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
            self.down.push(_Act.RESET if cutter.kind == "body_reset" else _Act.CLOSE, 0, now, now)

    def upstream_lost(self) -> None:
        if self.stalled:
            return  # the client still waits; it must see nothing before its timeout
        if not self.closed:  # deliver what the server sent, then close the client
            now = self.loop.time()
            self.up.stop()
            self.down.push(_Act.CLOSE, 0, now, now)

    def act(self, channel: _Channel, action: _Act) -> None:
        if action is not _Act.EOF:
            self.close(reset=action is _Act.RESET)
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
        self.proxy._conns.discard(self)
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
    """The server side of one connection; its `_Conn` does the work."""

    def __init__(self, conn: _Conn) -> None:
        self.conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn.upstream_made(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self.conn.proxy._stats.bytes_down += len(data)
        self.conn.response_received(data)

    def eof_received(self) -> bool:
        if not self.conn.stalled:
            now = self.conn.loop.time()
            self.conn.down.push(_Act.EOF, 0, now, now)
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


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_DEFAULT_LINK = LinkConfig()
_DEFAULT_FAULTS = FaultConfig()


class NetProxy:
    """A loopback TCP proxy with wide-area delay, a bandwidth cap and HTTP fault injection.

    It runs its own event loop in a daemon thread, so blocking clients (botocore,
    http.client) and async ones (obstore) can use it alike::

        with NetProxy("127.0.0.1", s3_port, link=LinkConfig(rtt_s=0.02)) as proxy:
            s3 = boto3.client("s3", endpoint_url=proxy.endpoint)

    Args:
        upstream_host: Address of the real server; must be a loopback address.
        upstream_port: Port of the real server.
        link: Delay and bandwidth of the emulated link.
        faults: Initial fault injection; change it with `set_faults`.
        listen_host: Address to listen on.
        listen_port: Port to listen on; 0 picks a free one (see `port`).

    Raises:
        ValueError: If upstream_host is not a loopback address or a port is out of range.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        link: LinkConfig = _DEFAULT_LINK,
        faults: FaultConfig = _DEFAULT_FAULTS,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        if not _is_loopback(upstream_host):
            raise ValueError(f"upstream host {upstream_host!r} is not a loopback address")
        if not 0 < upstream_port < 65536 or not 0 <= listen_port < 65536:
            raise ValueError(f"bad port: upstream {upstream_port}, listen {listen_port}")
        self._upstream, self._listen = (upstream_host, upstream_port), (listen_host, listen_port)
        self._link = link
        self._up_link, self._down_link = (
            _Link(link.bandwidth_bytes_s),
            _Link(link.bandwidth_bytes_s),
        )
        self._policy = FaultPolicy(faults)
        self._stats = ProxyStats()
        self._lock = threading.Lock()  # guards the request counters in _stats
        self._conns: set[_Conn] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._port: int | None = None
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        """The port the proxy listens on; RuntimeError if it was never started."""
        if self._port is None:
            raise RuntimeError("NetProxy is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        """The proxy's URL, such as ``http://127.0.0.1:40123``, to use as an S3 endpoint."""
        host = self._listen[0]
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def start(self) -> None:
        """Start serving in a background thread; return once the proxy is listening.

        Raises:
            RuntimeError: If the proxy is already running.
            OSError: If it cannot listen on listen_host:listen_port.
        """
        if self._thread is not None:
            raise RuntimeError("NetProxy is already running")
        ready, self._error = threading.Event(), None
        thread = threading.Thread(target=self._run, args=(ready,), name="netproxy", daemon=True)
        thread.start()
        ready.wait()
        if self._error is not None:
            thread.join()
            raise self._error
        self._thread = thread

    def stop(self) -> None:
        """Close the listener and every connection, and join the thread; idempotent."""
        thread, loop, event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if thread is threading.current_thread():
            raise RuntimeError("NetProxy.stop() called from the proxy's own thread")
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(event.set)
        thread.join()
        self._thread = self._loop = self._stop_event = None

    def stats(self) -> ProxyStats:
        """Return a snapshot copy of the counters."""
        with self._lock:
            return replace(self._stats, faults=dict(self._stats.faults))

    def set_faults(self, faults: FaultConfig) -> None:
        """Replace the fault injection, from any thread, for request heads read from now on.

        The random generator restarts from faults.seed.
        """
        self._policy = FaultPolicy(faults)  # one reference swap: atomic

    def __enter__(self) -> NetProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _decide(self, method: str, target: str) -> str | None:
        kind = self._policy.choose(method, target)
        with self._lock:
            self._stats.requests += 1
            if kind is None:
                self._stats.forwarded += 1
            else:
                self._stats.faults[kind] += 1
        return kind

    def _run(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._serve(ready))
        except Exception as exc:
            _log.exception("netproxy: event loop failed")
            self._error = exc
        finally:
            ready.set()

    async def _serve(self, ready: threading.Event) -> None:
        loop, stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            server = await loop.create_server(lambda: _Conn(self), *self._listen, backlog=1024)
        except OSError as exc:
            self._error = exc
            return
        self._port = server.sockets[0].getsockname()[1]
        self._loop, self._stop_event = loop, stop
        ready.set()
        try:
            await stop.wait()
        finally:
            server.close()
            tasks = [conn.connecting for conn in self._conns if conn.connecting is not None]
            for conn in list(self._conns):
                conn.close(abort=True)
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()
            for _ in range(3):  # let the aborted transports run connection_lost and close
                await asyncio.sleep(0)


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


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def main(argv: list[str] | None = None) -> int:
    """Run the proxy from the command line until SIGINT or SIGTERM.

    Args:
        argv: Command-line arguments; None reads sys.argv.

    Returns:
        The exit status.
    """
    link, faults = _DEFAULT_LINK, _DEFAULT_FAULTS
    parser = argparse.ArgumentParser(
        prog="python -m stoker.testing.netproxy",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--upstream", type=_hostport, required=True, metavar="HOST:PORT", help="on loopback")
    add("--listen", type=_hostport, metavar="HOST:PORT", help="127.0.0.1 and a free port if unset")
    add("--rtt-ms", type=float, default=link.rtt_s * 1e3, help="round-trip time to add, ms")
    add("--rate", type=parse_rate, default=link.bandwidth_bytes_s, help="e.g. 1gbit, 0: no cap")
    add("--connect-rtts", type=float, default=link.connect_rtts, help="RTTs of a handshake")
    add("--fault-rate", type=float, default=faults.fault_rate, help="probability of a fault")
    add("--fault-kinds", type=_names, default=faults.kinds, help=f"among {FAULT_KINDS}")
    add("--fault-seed", type=int, default=faults.seed, help="seed of the fault decisions")
    add("--fault-paths", help="fault only request-targets that contain this")
    add("--fault-methods", type=_names, help="fault only these methods, e.g. GET,PUT")
    add("--retry-after", type=int, default=faults.retry_after_s, help="Retry-After of 503/500, s")
    args = parser.parse_args(argv)
    host, port = args.upstream
    listen = {"listen_host": args.listen[0], "listen_port": args.listen[1]} if args.listen else {}
    try:
        link = LinkConfig(
            rtt_s=args.rtt_ms / 1e3, bandwidth_bytes_s=args.rate, connect_rtts=args.connect_rtts
        )
        methods = None if args.fault_methods is None else frozenset(args.fault_methods)
        faults = FaultConfig(
            fault_rate=args.fault_rate,
            kinds=args.fault_kinds,
            seed=args.fault_seed,
            fault_paths=args.fault_paths,
            fault_methods=methods,
            retry_after_s=args.retry_after,
        )
        proxy = NetProxy(host, port, link=link, faults=faults, **listen)
    except ValueError as exc:
        parser.error(str(exc))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with proxy:
            print(f"netproxy: {proxy.endpoint} -> {host}:{port}, {link}, {faults}", flush=True)
            while not stop.wait(0.5):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    print(f"netproxy stopped: {proxy.stats()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
