"""Error classification and the retry loop, without a network."""

from __future__ import annotations

import asyncio
import random

import pytest

from stoker.core.metrics import Counters
from stoker.storage import retry
from stoker.storage.retry import (
    RetryPolicy,
    ShortBodyError,
    call_with_retries,
    classify,
    retry_after_s,
)


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
        # What obstore says when the proxy truncates, resets or stalls a response body.
        (
            "HTTP error: request or response body error  Debug source: HttpError { kind: "
            "Interrupted, source: reqwest::Error { kind: Body, source: hyper::Error(Body, "
            "Custom { kind: UnexpectedEof, error: IncompleteBody }) } }",
            "reset",
        ),
        (
            "HTTP error: request or response body error  Debug source: HttpError { kind: "
            "Timeout, source: reqwest::Error { kind: Body, source: TimedOut } }",
            "timeout",
        ),
        ("Error performing HEAD http://h/b/k in 1.0s - HTTP error: error sending request", "reset"),
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


class Throttled(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        if retry_after is not None:
            self.retry_after_s = retry_after


def _delays(
    monkeypatch: pytest.MonkeyPatch, failures: list[Exception], policy: RetryPolicy
) -> tuple[list[float], Counters]:
    """Run a request that fails with ``failures`` in turn; return the waits between tries."""
    waits: list[float] = []

    async def no_sleep(delay: float) -> None:
        waits.append(delay)

    monkeypatch.setattr(retry.asyncio, "sleep", no_sleep)
    pending = list(failures)

    async def request() -> str:
        if pending:
            raise pending.pop(0)
        return "ok"

    counters = Counters()
    result = _run(
        call_with_retries(request, policy=policy, counters=counters, what="x", rng=random.Random(5))
    )
    assert result == "ok"
    return waits, counters


def test_retry_after_is_honoured_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = RetryPolicy(base_delay_s=0.001, max_delay_s=0.01, max_retry_after_s=3.0)
    waits, counters = _delays(
        monkeypatch,
        [
            Throttled("status code: 503 SlowDown", retry_after=2),
            Throttled("status code: 503 SlowDown", retry_after=60),  # capped
            Throttled("status code: 500 ... Retry-After: 1.5"),  # from the message
            Throttled("status code: 500"),  # none: the backoff
        ],
        policy,
    )
    assert waits[:3] == [2.0, 3.0, 1.5]
    assert waits[3] <= 0.01
    assert counters.get("retries") == 4
    assert counters.get("throttles") == 2


def test_throttles_back_off_longer_and_never_to_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = RetryPolicy(base_delay_s=0.001, throttle_base_delay_s=0.4, max_delay_s=1.0)
    waits, _ = _delays(monkeypatch, [Throttled("status code: 503 SlowDown")] * 4, policy)
    ceilings = [0.4, 0.8, 1.0, 1.0]
    assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings, strict=True)), waits
    plain, _ = _delays(monkeypatch, [Throttled("status code: 500")] * 4, policy)
    assert all(w <= 0.008 for w in plain)


def test_a_retry_that_would_start_too_late_is_not_made(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_sleep(delay: float) -> None:
        pass

    monkeypatch.setattr(retry.asyncio, "sleep", no_sleep)
    calls = []

    async def request() -> None:
        calls.append(1)
        raise Throttled("status code: 503 SlowDown", retry_after=10)

    policy = RetryPolicy(max_elapsed_s=5.0)
    with pytest.raises(Throttled):
        _run(call_with_retries(request, policy=policy, counters=Counters(), what="x"))
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (Throttled("x", retry_after=4), 4.0),
        (Throttled("Retry-After: 12"), 12.0),
        (Throttled("retry-after:0.25 more"), 0.25),
        (Throttled("no header"), None),
    ],
)
def test_retry_after_s(exc: Exception, expected: float | None) -> None:
    assert retry_after_s(exc) == expected


def test_policy_rejects_negative_delays() -> None:
    with pytest.raises(ValueError, match="delays"):
        RetryPolicy(throttle_base_delay_s=-1)
