"""The proxy's per-prefix rate limit: S3's 503 SlowDown beyond N requests/s per prefix."""

from __future__ import annotations

import http.client

import pytest

from stoker.testing.netproxy import NetProxy, RateLimitConfig, main
from stoker.testing.ratelimit import PrefixRateLimiter, request_prefix


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("target", "depth", "expected"),
    [
        ("/b/dl/obj-1", 1, "b/dl"),
        ("/b/dl/x/y/obj?partNumber=1&uploadId=u", 1, "b/dl"),
        ("/b/dl/x/y/obj", 2, "b/dl/x"),
        ("/b/obj", 1, "b"),
        ("/b?list-type=2&prefix=dl%2Fsub%2F", 1, "b/dl"),
        ("/b?list-type=2&prefix=dl/sub/", 2, "b/dl/sub"),
        ("/b/", 1, "b"),
    ],
)
def test_request_prefix(target: str, depth: int, expected: str) -> None:
    assert request_prefix(target, depth) == expected


def test_admits_the_rate_per_prefix_with_a_burst() -> None:
    clock = FakeClock()
    limiter = PrefixRateLimiter(RateLimitConfig(requests_per_s=100, burst_s=0.1), clock=clock)
    # A burst of 10, then nothing until a token refills.
    assert [limiter.admit("/b/p/k") for _ in range(12)] == [True] * 10 + [False] * 2
    assert limiter.admit("/b/q/k")  # another prefix has its own bucket
    admitted = 0
    for _ in range(1000):  # one second, a request every millisecond
        clock.now += 0.001
        admitted += limiter.admit("/b/p/k")
    assert admitted == pytest.approx(100, abs=1)
    counts = limiter.counts()["b/p"]
    assert (counts.admitted, counts.throttled) == (10 + admitted, 2 + 1000 - admitted)
    assert counts.seconds == pytest.approx(1.0)
    assert counts.admitted_per_s == pytest.approx(110, abs=1)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="requests_per_s"):
        RateLimitConfig(requests_per_s=0)
    with pytest.raises(ValueError, match="prefix_depth"):
        RateLimitConfig(requests_per_s=1, prefix_depth=0)


def _get(port: int, target: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_proxy_answers_slowdown_beyond_the_limit(s3_server) -> None:
    limit = RateLimitConfig(requests_per_s=1, burst_s=5.0)  # 5 at once, then one a second
    with NetProxy("127.0.0.1", s3_server.port, rate_limit=limit) as proxy:
        answers = [_get(proxy.port, "/bucket/p/key") for _ in range(7)]
        other = _get(proxy.port, "/bucket/q/key")
        stats, counts = proxy.stats(), proxy.prefix_counts()
        proxy.set_rate_limit(None)
        assert _get(proxy.port, "/bucket/p/key")[0] != 503
    throttled = [body for status, body in answers if status == 503]
    assert len(throttled) == 2
    assert all(b"<Code>SlowDown</Code>" in body for body in throttled)
    assert other[0] != 503  # the unsigned request reached the server, which refused it
    assert (stats.requests, stats.throttled, stats.forwarded) == (8, 2, 6)
    assert {k: (c.admitted, c.throttled) for k, c in counts.items()} == {
        "bucket/p": (5, 2),
        "bucket/q": (1, 0),
    }


def test_command_line_takes_a_prefix_rate() -> None:
    with pytest.raises(SystemExit):
        main(["--upstream", "127.0.0.1:1", "--prefix-rate", "0"])
