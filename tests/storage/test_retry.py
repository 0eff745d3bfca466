"""Error classification and the retry loop, without a network."""

from __future__ import annotations

import asyncio
import random

import pytest

from stoker.core.metrics import Counters
from stoker.storage.retry import RetryPolicy, ShortBodyError, call_with_retries, classify


class FakeObstoreError(Exception):
    pass


class PermissionDeniedError(Exception):
    pass


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (
            "Server returned non-2xx status code: 503 Service Unavailable: <Code>SlowDown</Code>",
            "throttle",
        ),
        ("Server returned non-2xx status code: 429 Too Many Requests", "throttle"),
        ("Server returned non-2xx status code: 500 Internal Server Error", "server"),
        ("Server returned non-2xx status code: 404 Not Found", "not_found"),
        ("Server returned non-2xx status code: 400 Bad Request", "client"),
        ("HTTP error: error sending request ... kind: Connect ... tcp connect error", "connect"),
        ("error decoding response body ... kind: Body ... connection reset", "reset"),
        ("operation timed out", "timeout"),
        ("something nobody has seen", "other"),
    ],
)
def test_classify_messages(message: str, kind: str) -> None:
    assert classify(FakeObstoreError(message)) == kind


def test_classify_types() -> None:
    assert classify(FileNotFoundError("x")) == "not_found"
    assert classify(PermissionDeniedError("x")) == "auth"
    assert classify(ShortBodyError("x")) == "short_body"
    assert classify(TimeoutError()) == "timeout"
    assert classify(ConnectionResetError()) == "reset"


def _run(coro):
    return asyncio.run(coro)


def test_retries_until_success_and_counts() -> None:
    failures = ["503 SlowDown status code: 503", "status code: 500", "connection reset"]
    calls = []

    async def request() -> str:
        calls.append(1)
        if failures:
            raise FakeObstoreError(failures.pop(0))
        return "ok"

    counters = Counters()
    policy = RetryPolicy(base_delay_s=0.001, max_delay_s=0.002)
    result = _run(
        call_with_retries(
            request, policy=policy, counters=counters, what="GET x", rng=random.Random(0)
        )
    )
    assert result == "ok"
    assert len(calls) == 4
    assert counters.get("retries") == 3
    assert counters.get("throttles") == 1
    assert counters.get("errors.server") == 1
    assert counters.get("errors.reset") == 1


def test_non_retryable_error_is_raised_at_once() -> None:
    calls = []

    async def request() -> None:
        calls.append(1)
        raise FileNotFoundError("missing")

    with pytest.raises(FileNotFoundError):
        _run(call_with_retries(request, policy=RetryPolicy(), counters=Counters(), what="x"))
    assert len(calls) == 1


def test_gives_up_after_max_attempts() -> None:
    calls = []

    async def request() -> None:
        calls.append(1)
        raise FakeObstoreError("status code: 503")

    counters = Counters()
    policy = RetryPolicy(max_attempts=4, base_delay_s=0.0)
    with pytest.raises(FakeObstoreError):
        _run(call_with_retries(request, policy=policy, counters=counters, what="x"))
    assert len(calls) == 4
    assert counters.get("retries") == 3


def test_connect_errors_get_fewer_attempts() -> None:
    calls = []

    async def request() -> None:
        calls.append(1)
        raise FakeObstoreError("kind: Connect, tcp connect error")

    policy = RetryPolicy(max_attempts=10, connect_attempts=2, base_delay_s=0.0)
    with pytest.raises(FakeObstoreError):
        _run(call_with_retries(request, policy=policy, counters=Counters(), what="x"))
    assert len(calls) == 2


def test_backoff_is_capped_full_jitter() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=1.0)
    rng = random.Random(1)
    delays = [policy.backoff_s(attempt, rng) for attempt in range(1, 20)]
    assert all(0 <= d <= 1.0 for d in delays)
    assert max(delays[:1]) <= 0.1


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
