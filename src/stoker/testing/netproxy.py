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
describes each kind).  A per-prefix rate limit can throttle as S3 does: requests beyond
N per second and prefix are answered ``503 SlowDown`` (:mod:`stoker.testing.ratelimit`).

The link lives in :mod:`stoker.testing.link`, each connection in :mod:`stoker.testing.relay`.
Run it as ``python -m stoker.testing.netproxy --upstream 127.0.0.1:8333 --rtt-ms 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import signal
import threading
from dataclasses import replace
from types import FrameType

from stoker.testing.faults import FAULT_KINDS, FaultConfig, FaultPolicy
from stoker.testing.link import Link, LinkConfig, parse_rate
from stoker.testing.proxystate import ProxyState, ProxyStats
from stoker.testing.ratelimit import PrefixCounts, PrefixRateLimiter, RateLimitConfig
from stoker.testing.relay import Relay

__all__ = [
    "FAULT_KINDS",
    "FaultConfig",
    "LinkConfig",
    "NetProxy",
    "PrefixCounts",
    "ProxyStats",
    "RateLimitConfig",
    "main",
    "parse_rate",
]

_log = logging.getLogger(__name__)


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
        rate_limit: Requests admitted per second and prefix, if limited; change it with
            `set_rate_limit`.
        listen_host: Address to listen on.
        listen_port: Port to listen on; 0 picks a free one (see `port`).
        record_requests: Keep each request's method, target and answer (`requests_seen`).

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
        rate_limit: RateLimitConfig | None = None,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        record_requests: bool = False,
    ) -> None:
        if not _is_loopback(upstream_host):
            raise ValueError(f"upstream host {upstream_host!r} is not a loopback address")
        if not 0 < upstream_port < 65536 or not 0 <= listen_port < 65536:
            raise ValueError(f"bad port: upstream {upstream_port}, listen {listen_port}")
        self._listen = (listen_host, listen_port)
        self._state = ProxyState(
            upstream=(upstream_host, upstream_port),
            link=link,
            up_link=Link(link.bandwidth_bytes_s),
            down_link=Link(link.bandwidth_bytes_s),
            policy=FaultPolicy(faults),
            limiter=PrefixRateLimiter(rate_limit) if rate_limit is not None else None,
            seen=[] if record_requests else None,
        )
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
        state = self._state
        with state.lock:
            return replace(state.stats, faults=dict(state.stats.faults))

    def requests_seen(self) -> list[tuple[str, str, str]]:
        """Each request so far as (method, target, answer): ``"forwarded"``, or the fault
        (``"503"`` for a throttle); empty unless made with ``record_requests=True``."""
        state = self._state
        with state.lock:
            return list(state.seen or [])

    def held_responses(self) -> int:
        """Open connections whose response a timed stall (``FaultConfig.stall_s``) still
        holds back: a client that gave up on one closes it, and it is no longer counted."""
        loop = self._loop
        if loop is None:
            return 0
        now = loop.time()
        while True:
            try:  # the proxy's thread may open or close a connection meanwhile
                relays = list(self._state.relays)
            except RuntimeError:
                continue
            return sum(1 for relay in relays if relay.held_until > now)

    def set_faults(self, faults: FaultConfig) -> None:
        """Replace the fault injection, from any thread, for request heads read from now on.

        The random generator restarts from faults.seed.
        """
        self._state.policy = FaultPolicy(faults)  # one reference swap: atomic

    def set_rate_limit(self, rate_limit: RateLimitConfig | None) -> None:
        """Replace the per-prefix rate limit (None: none), from any thread; its buckets and
        per-prefix counts start afresh."""
        self._state.limiter = PrefixRateLimiter(rate_limit) if rate_limit is not None else None

    def prefix_counts(self) -> dict[str, PrefixCounts]:
        """What the rate limit did, per ``BUCKET/PREFIX`` (empty without one)."""
        limiter = self._state.limiter
        return {} if limiter is None else limiter.counts()

    def __enter__(self) -> NetProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._serve(ready))
        except Exception as exc:
            _log.exception("netproxy: event loop failed")
            self._error = exc
        finally:
            ready.set()

    async def _serve(self, ready: threading.Event) -> None:
        loop, stop, state = asyncio.get_running_loop(), asyncio.Event(), self._state
        try:
            server = await loop.create_server(lambda: Relay(state), *self._listen, backlog=1024)
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
            relays = self._state.relays
            tasks = [relay.connecting for relay in relays if relay.connecting is not None]
            for relay in list(relays):
                relay.close(abort=True)
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()
            for _ in range(3):  # let the aborted transports run connection_lost and close
                await asyncio.sleep(0)


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
    add("--prefix-rate", type=float, help="admit this many requests/s per prefix, 503 beyond")
    add("--prefix-depth", type=int, default=1, help="key path segments that make a prefix")
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
        rate_limit = (
            RateLimitConfig(requests_per_s=args.prefix_rate, prefix_depth=args.prefix_depth)
            if args.prefix_rate is not None
            else None
        )
        proxy = NetProxy(host, port, link=link, faults=faults, rate_limit=rate_limit, **listen)
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
