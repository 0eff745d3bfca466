"""Tests of the loopback WAN/fault proxy against a tiny threaded HTTP/1.1 server."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from stoker.testing.faults import ResponseCutter
from stoker.testing.netproxy import (
    FAULT_KINDS,
    FaultConfig,
    LinkConfig,
    NetProxy,
    main,
    parse_rate,
)

NO_DELAY = LinkConfig(rtt_s=0.0, connect_rtts=0.0)


def payload(path: str, size: int) -> bytes:
    """Deterministic bytes for GET path?size=N."""
    seed = hashlib.sha256(path.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


@dataclass
class Upstream:
    port: int
    seen: list[tuple[str, str, bytes]] = field(default_factory=list)
    peers: set[tuple[str, int]] = field(default_factory=set)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10
    disable_nagle_algorithm = True  # else a small body waits for a delayed ACK (40 ms)
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def _handle(self, *, send_body: bool = True) -> None:
        body = self._read_body()
        self.server.upstream.seen.append((self.command, self.path, body))
        self.server.upstream.peers.add(self.client_address)
        if self.command == "PUT":
            reply = body  # echo
        else:
            size = int(self.path.partition("size=")[2] or "100")
            reply = payload(self.path.partition("?")[0], size)
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        if send_body:
            self.wfile.write(reply)

    def do_GET(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle(send_body=False)


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handler threads
    upstream: Upstream

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exception(), ConnectionError):  # faults reset connections
            super().handle_error(request, client_address)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.upstream = Upstream(port=server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server.upstream
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def make_proxy(upstream: Upstream) -> Iterator[Callable[..., NetProxy]]:
    proxies: list[NetProxy] = []

    def make(*, link: LinkConfig = NO_DELAY, faults: FaultConfig | None = None) -> NetProxy:
        proxy = NetProxy("127.0.0.1", upstream.port, link=link, faults=faults or FaultConfig())
        proxies.append(proxy)
        proxy.start()
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()


@contextlib.contextmanager
def connect(port: int) -> Iterator[http.client.HTTPConnection]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        yield conn
    finally:
        conn.close()


def request(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn.request(method, path, body=body)
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def test_bytes_pass_through_unchanged_on_one_keepalive_connection(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    proxy = make_proxy()
    big = bytes(range(256)) * 1000
    with connect(proxy.port) as conn:
        assert request(conn, "GET", "/a?size=5000")[::2] == (200, payload("/a", 5000))
        assert request(conn, "PUT", "/b", big)[::2] == (200, big)
        assert request(conn, "GET", "/c?size=300000")[::2] == (200, payload("/c", 300000))
        assert request(conn, "HEAD", "/d")[::2] == (200, b"")
    assert [(m, p) for m, p, _ in upstream.seen] == [
        ("GET", "/a?size=5000"),
        ("PUT", "/b"),
        ("GET", "/c?size=300000"),
        ("HEAD", "/d"),
    ]
    assert upstream.seen[1][2] == big
    assert len(upstream.peers) == 1  # one upstream connection carried them all
    stats = proxy.stats()
    assert (stats.connections, stats.requests, stats.forwarded, stats.faulted) == (1, 4, 4, 0)
    assert stats.bytes_up > len(big)
    assert stats.bytes_down > 305000


def test_chunked_request_bodies_keep_request_boundaries(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    proxy = make_proxy(faults=FaultConfig(fault_rate=1.0, fault_paths="/victim"))
    chunks = [b"x" * 10, b"y" * 70000, b"z"]
    with connect(proxy.port) as conn:
        conn.request("PUT", "/up", body=iter(chunks), encode_chunked=True)
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"".join(chunks))
        assert request(conn, "GET", "/victim")[0] == 503
        conn.request("PUT", "/victim/chunked", body=iter(chunks), encode_chunked=True)
        response = conn.getresponse()
        assert (response.status, b"SlowDown" in response.read()) == (503, True)
        assert request(conn, "GET", "/after?size=10")[::2] == (200, payload("/after", 10))
    assert [p for _, p, _ in upstream.seen] == ["/up", "/after?size=10"]
    assert proxy.stats().faults["503"] == 2


def test_requests_go_through_a_delayed_link(make_proxy: Callable[..., NetProxy]) -> None:
    # The delays themselves are the link's deadlines, checked on a driven clock in
    # tests/testing/test_link.py; here, that requests and answers pass through it whole.
    proxy = make_proxy(link=LinkConfig(rtt_s=0.1, connect_rtts=1.0))
    with connect(proxy.port) as conn:
        assert request(conn, "GET", "/first?size=10")[::2] == (200, payload("/first", 10))
        assert request(conn, "GET", "/second?size=10")[::2] == (200, payload("/second", 10))
    assert (proxy.stats().connections, proxy.stats().forwarded) == (1, 2)


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_bandwidth_cap(make_proxy: Callable[..., NetProxy], method: str) -> None:
    proxy = make_proxy(link=LinkConfig(rtt_s=0.0, bandwidth_bytes_s=2e6, connect_rtts=0.0))
    body = b"u" * 1_000_000 if method == "PUT" else None
    with connect(proxy.port) as conn:
        status, _, reply = request(conn, method, "/big?size=1000000", body)
    assert (status, len(reply)) == (200, 1_000_000)  # whole through the capped link
    stats = proxy.stats()
    assert stats.bytes_up >= (1_000_000 if method == "PUT" else 0)
    assert stats.bytes_down >= (1_000_000 if method == "GET" else 0)


@pytest.mark.parametrize(
    ("kind", "status", "code"), [("503", 503, "SlowDown"), ("500", 500, "InternalError")]
)
def test_error_fault_is_not_forwarded_and_keeps_the_connection(
    make_proxy: Callable[..., NetProxy], upstream: Upstream, kind: str, status: int, code: str
) -> None:
    proxy = make_proxy(faults=FaultConfig(fault_rate=1.0, kinds=(kind,)))
    with connect(proxy.port) as conn:
        got_status, headers, body = request(conn, "PUT", "/obj", b"b" * 100_000)
        assert got_status == status
        assert headers["Content-Type"] == "application/xml"
        assert headers["Retry-After"] == "0"
        assert int(headers["Content-Length"]) == len(body)
        assert f"<Error><Code>{code}</Code><Message>".encode() in body
        assert request(conn, "HEAD", "/obj")[::2] == (status, b"")  # no body after HEAD
        proxy.set_faults(FaultConfig())
        assert request(conn, "GET", "/obj?size=10")[::2] == (200, payload("/obj", 10))
    assert [p for _, p, _ in upstream.seen] == ["/obj?size=10"]
    stats = proxy.stats()
    assert (stats.requests, stats.forwarded, stats.faults[kind], stats.faulted) == (3, 1, 2, 2)


def test_503_comes_back_over_the_delayed_link(make_proxy: Callable[..., NetProxy]) -> None:
    link = LinkConfig(rtt_s=0.1, connect_rtts=0.0)
    proxy = make_proxy(link=link, faults=FaultConfig(fault_rate=1.0))
    with connect(proxy.port) as conn:
        assert request(conn, "GET", "/slow")[0] == 503
    assert (proxy.stats().faults["503"], proxy.stats().forwarded) == (1, 0)


def test_reset_fault_breaks_the_client_connection(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    proxy = make_proxy(faults=FaultConfig(fault_rate=1.0, kinds=("reset",)))
    with connect(proxy.port) as conn, pytest.raises(ConnectionError):
        request(conn, "PUT", "/obj", b"x" * 1000)
    proxy.set_faults(FaultConfig())
    with connect(proxy.port) as conn:
        assert request(conn, "GET", "/obj")[0] == 200
    assert [p for _, p, _ in upstream.seen] == ["/obj"]
    assert proxy.stats().faults == {**dict.fromkeys(FAULT_KINDS, 0), "reset": 1}


def test_fault_rate_is_seeded_and_counted_exactly(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    faults = FaultConfig(fault_rate=0.5, kinds=("503", "500"), seed=7)
    outcomes = []
    for proxy in (make_proxy(faults=faults), make_proxy(faults=faults)):
        with connect(proxy.port) as conn:
            outcomes.append([request(conn, "GET", f"/o{i}")[0] for i in range(200)])
        stats = proxy.stats()
        assert stats.requests == 200
        assert stats.faults["503"] == outcomes[-1].count(503)
        assert stats.faults["500"] == outcomes[-1].count(500)
        assert stats.forwarded == outcomes[-1].count(200)
        assert stats.faulted + stats.forwarded == stats.requests
    assert outcomes[0] == outcomes[1]  # same seed, same decisions
    assert 60 <= outcomes[0].count(200) <= 140
    assert outcomes[0].count(503) > 10
    assert outcomes[0].count(500) > 10
    assert len(upstream.seen) == 2 * outcomes[0].count(200)


def test_fault_paths_and_methods_filter(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    faults = FaultConfig(fault_rate=1.0, fault_paths="/victim", fault_methods=frozenset({"get"}))
    proxy = make_proxy(faults=faults)
    with connect(proxy.port) as conn:
        assert request(conn, "PUT", "/victim", b"setup")[0] == 200
        assert request(conn, "GET", "/other")[0] == 200
        assert request(conn, "GET", "/bucket/victim?x=1")[0] == 503
        assert request(conn, "HEAD", "/victim")[0] == 200
    assert [(m, p) for m, p, _ in upstream.seen] == [
        ("PUT", "/victim"),
        ("GET", "/other"),
        ("HEAD", "/victim"),
    ]


def test_concurrent_connections(make_proxy: Callable[..., NetProxy]) -> None:
    proxy = make_proxy(link=LinkConfig(rtt_s=0.01), faults=FaultConfig(fault_rate=0.2))
    statuses: list[int] = []

    def client(n: int) -> None:
        with connect(proxy.port) as conn:
            for i in range(20):
                status, _, body = request(conn, "GET", f"/c{n}/{i}?size=20000")
                assert status == 503 or body == payload(f"/c{n}/{i}", 20000)
                statuses.append(status)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = proxy.stats()
    assert len(statuses) == stats.requests == 160
    assert stats.faulted == statuses.count(503)
    assert stats.connections == 8


def test_upstream_closing_the_connection_reaches_the_client(
    make_proxy: Callable[..., NetProxy],
) -> None:
    proxy = make_proxy()
    with connect(proxy.port) as conn:
        conn.request("GET", "/x", headers={"Connection": "close"})
        response = conn.getresponse()
        assert response.status == 200
        response.read()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"GET /y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200")
    assert data.endswith(payload("/y", 100))


def test_upstream_down_resets_the_client() -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]  # nothing listens here
        with (
            NetProxy("127.0.0.1", port, link=NO_DELAY) as proxy,
            connect(proxy.port) as conn,
            pytest.raises(ConnectionError),
        ):
            request(conn, "GET", "/")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0.0),
        ("1gbit", 125e6),
        ("800mbit", 100e6),
        ("1Gbps", 125e6),
        ("100MB", 100e6),
        ("100 MB/s", 100e6),
        ("50MiB", 50 * 2**20),
        ("2.5e3", 2500.0),
        ("1024", 1024.0),
    ],
)
def test_parse_rate(text: str, expected: float) -> None:
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "fast", "-1MB", "10M", "10mb", "5Xbit", "1 gigabit"])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


NOT_LOOPBACK = ["10.0.0.1", "192.168.1.2", "example.com", "0.0.0.0", "", "::"]  # noqa: S104


@pytest.mark.parametrize("host", NOT_LOOPBACK)
def test_non_loopback_upstream_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        NetProxy(host, 80)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "localhost"])
def test_loopback_upstreams_are_accepted(host: str) -> None:
    NetProxy(host, 80)


@pytest.mark.parametrize(
    "make",
    [
        lambda: FaultConfig(fault_rate=1.5),
        lambda: FaultConfig(fault_rate=float("nan")),
        lambda: FaultConfig(kinds=()),
        lambda: FaultConfig(kinds=("418",)),
        lambda: FaultConfig(kinds="503"),  # type: ignore[arg-type]  # the mistake under test
        lambda: FaultConfig(fault_methods=frozenset()),
        lambda: LinkConfig(rtt_s=-0.1),
        lambda: LinkConfig(bandwidth_bytes_s=float("inf")),
        lambda: LinkConfig(connect_rtts=-1),
    ],
)
def test_config_validation(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="Config"):
        make()


def test_stop_is_idempotent_and_joins_the_thread(upstream: Upstream) -> None:
    proxy = NetProxy("127.0.0.1", upstream.port, link=NO_DELAY)
    proxy.stop()  # never started: a no-op
    with pytest.raises(RuntimeError):
        _ = proxy.port
    proxy.start()
    with pytest.raises(RuntimeError):
        proxy.start()
    assert proxy.endpoint == f"http://127.0.0.1:{proxy.port}"
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    assert request(conn, "GET", "/")[0] == 200  # leaves a keep-alive connection open
    proxy.stop()
    proxy.stop()
    conn.close()
    assert not [t for t in threading.enumerate() if t.name == "netproxy"]
    with proxy, connect(proxy.port) as conn:  # restartable
        assert request(conn, "GET", "/")[0] == 200
    assert not [t for t in threading.enumerate() if t.name == "netproxy"]


def test_listen_port_in_use_raises(upstream: Upstream) -> None:
    with NetProxy("127.0.0.1", upstream.port) as first:
        second = NetProxy("127.0.0.1", upstream.port, listen_port=first.port)
        with pytest.raises(OSError, match="ddress already in use"):
            second.start()
        second.stop()


def test_cli_runs_until_sigterm(upstream: Upstream) -> None:
    command = [sys.executable, "-m", "stoker.testing.netproxy", "--upstream"]
    command += [f"127.0.0.1:{upstream.port}", "--rtt-ms", "0", "--rate", "1gbit"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.split(" -> ")[0].rpartition(":")[2])
        with connect(port) as conn:
            assert request(conn, "GET", "/cli?size=10")[::2] == (200, payload("/cli", 10))
        proc.terminate()
        rest = proc.stdout.read()
        assert proc.wait(timeout=10) == 0
    assert "requests=1" in rest


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(["--upstream", "10.1.1.1:80"])
    assert excinfo.value.code == 2
    assert "loopback" in capsys.readouterr().err


# -- response faults: the request is forwarded, its response spoiled -----------------------


def raw_exchange(port: int, request_bytes: bytes, *, timeout_s: float = 5.0) -> tuple[bytes, str]:
    """Send one raw request; read until the connection ends. Returns (bytes, how it ended)."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request_bytes)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            return received, "reset"
        except TimeoutError:
            return received, "timeout"
    return received, "eof"


def split_response(data: bytes) -> tuple[bytes, bytes]:
    end = data.find(b"\r\n\r\n")
    assert end > 0, data[:200]
    return data[: end + 4], data[end + 4 :]


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def test_truncate_delivers_half_the_body_then_closes_cleanly(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    proxy = make_proxy(faults=FaultConfig(fault_rate=1.0, kinds=("truncate",)))
    data, ended = raw_exchange(proxy.port, get("/t?size=100001"))
    head, body = split_response(data)
    assert ended == "eof"
    assert head.startswith(b"HTTP/1.1 200")
    assert b"Content-Length: 100001" in head
    assert body == payload("/t", 100001)[:50000]  # exactly half, then FIN
    assert [p for _, p, _ in upstream.seen] == ["/t?size=100001"]  # it was forwarded
    stats = proxy.stats()
    assert (stats.requests, stats.forwarded, stats.faults["truncate"]) == (1, 0, 1)


def test_body_reset_delivers_at_most_half_the_body_then_resets(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    proxy = make_proxy(faults=FaultConfig(fault_rate=1.0, kinds=("body_reset",)))
    with connect(proxy.port) as conn:
        conn.request("GET", "/r?size=200000")
        response = conn.getresponse()
        assert response.status == 200  # the head arrived
        with pytest.raises((ConnectionError, http.client.IncompleteRead)):
            response.read()
    data, ended = raw_exchange(proxy.port, get("/r?size=200000"))
    assert ended == "reset"
    body = data[data.find(b"\r\n\r\n") + 4 :] if b"\r\n\r\n" in data else b""
    assert len(body) <= 100000
    assert body == payload("/r", 200000)[: len(body)]
    assert len(upstream.seen) == 2
    assert proxy.stats().faults["body_reset"] == 2


def test_a_response_without_a_body_is_cut_in_its_head(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    proxy = make_proxy(faults=FaultConfig(fault_rate=1.0, kinds=("truncate",)))
    for request_bytes in (get("/empty?size=0"), b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n"):
        data, ended = raw_exchange(proxy.port, request_bytes)
        assert ended == "eof"
        assert data.startswith(b"HTTP/1.")
        assert b"\r\n\r\n" not in data  # the head itself is incomplete
    assert len(upstream.seen) == 2


def test_stall_holds_the_response_until_the_client_gives_up(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    proxy = make_proxy(faults=FaultConfig(fault_rate=1.0, kinds=("stall",)))
    data, ended = raw_exchange(proxy.port, get("/s?size=30000"), timeout_s=0.5)
    assert ended == "timeout"  # no EOF, no reset: the connection just stops
    head, body = split_response(data)
    assert b"200" in head.split(b"\r\n")[0]
    assert body == payload("/s", 30000)[:15000]
    proxy.set_faults(FaultConfig())
    with connect(proxy.port) as conn:  # the proxy still serves other connections
        assert request(conn, "GET", "/after?size=10")[::2] == (200, payload("/after", 10))
    assert [p for _, p, _ in upstream.seen] == ["/s?size=30000", "/after?size=10"]


def test_stopping_the_proxy_ends_a_stalled_connection(upstream: Upstream) -> None:
    proxy = NetProxy(
        "127.0.0.1",
        upstream.port,
        link=NO_DELAY,
        faults=FaultConfig(fault_rate=1.0, kinds=("stall",)),
    )
    proxy.start()
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    try:
        sock.sendall(get("/held?size=1000"))
        received = b""
        while b"\r\n\r\n" not in received or len(split_response(received)[1]) < 500:
            received += sock.recv(65536)  # up to the cut point: head and half the body
        proxy.stop()
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
        assert len(split_response(received)[1]) == 500  # then the connection ended
    finally:
        sock.close()
        proxy.stop()


def test_503_carries_the_configured_retry_after(make_proxy: Callable[..., NetProxy]) -> None:
    proxy = make_proxy(faults=FaultConfig(fault_rate=1.0, kinds=("503",), retry_after_s=7))
    with connect(proxy.port) as conn:
        status, headers, _ = request(conn, "GET", "/busy")
    assert (status, headers["Retry-After"]) == (503, "7")


def test_mixed_kinds_are_all_drawn_and_counted(
    make_proxy: Callable[..., NetProxy], upstream: Upstream
) -> None:
    faults = FaultConfig(fault_rate=0.5, kinds=FAULT_KINDS, seed=11)
    proxy = make_proxy(faults=faults)
    for i in range(120):
        raw_exchange(proxy.port, get(f"/m{i}?size=2000"), timeout_s=0.05)
    stats = proxy.stats()
    assert stats.requests == 120
    assert all(stats.faults[kind] > 0 for kind in FAULT_KINDS), stats.faults
    assert stats.faulted + stats.forwarded == stats.requests
    response_faults = sum(stats.faults[k] for k in ("body_reset", "truncate", "stall"))
    assert len(upstream.seen) == stats.forwarded + response_faults


_OK10 = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_OK4 = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n"
_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("kind", "head_only", "response", "expected"),
    [
        # Content-Length: half the body.
        ("truncate", False, _OK10 + b"0123456789", _OK10 + b"01234"),
        # An interim 100 Continue passes whole; the final response is cut.
        ("body_reset", False, _CONTINUE + _OK4 + b"abcd", _CONTINUE + _OK4 + b"ab"),
        # Chunked (no length announced): the head passes, none of the body.
        ("stall", False, _CHUNKED + b"4\r\nabcd\r\n0\r\n\r\n", _CHUNKED),
        # The answer to a HEAD has no body, whatever it announces: half its head passes.
        ("truncate", True, _OK10, _OK10[: len(_OK10) // 2]),
    ],
)
@pytest.mark.parametrize("step", [1, 7, 1000])
def test_response_cutter(
    kind: str, head_only: bool, response: bytes, expected: bytes, step: int
) -> None:
    cutter = ResponseCutter(kind, head_only=head_only)
    out = b"".join(cutter.feed(response[i : i + step]) for i in range(0, len(response), step))
    assert (out, cutter.cut) == (expected, True)
    assert cutter.feed(b"more") == b""


def test_response_cutter_rejects_request_faults() -> None:
    with pytest.raises(ValueError, match="not a response fault"):
        ResponseCutter("503", head_only=False)


def test_cli_passes_retry_after(upstream: Upstream) -> None:
    command = [sys.executable, "-m", "stoker.testing.netproxy", "--upstream"]
    command += [f"127.0.0.1:{upstream.port}", "--rtt-ms", "0", "--fault-rate", "1"]
    command += ["--fault-kinds", "503", "--retry-after", "9"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split(" -> ")[0].rpartition(":")[2])
        with connect(port) as conn:
            status, headers, _ = request(conn, "GET", "/x")
        proc.terminate()
        proc.stdout.read()
        assert proc.wait(timeout=10) == 0
    assert (status, headers["Retry-After"]) == (503, "9")
