"""Retries with exponential backoff and full jitter, and the classification they rely on.

obstore's own retries are switched off so that every attempt is counted here. An error is
classified from obstore's exception type and message into a small set of kinds; the
retryable ones (server errors, throttling, timeouts, resets, short bodies, refused
connections) are retried until the policy's attempts or time run out.

Throttling (503 SlowDown, 429) backs off from a longer base delay than other errors, and never
for less than half of its backoff. A ``Retry-After`` the server gave is honoured up to
``max_retry_after_s`` when the error carries it, as an exception attribute ``retry_after_s``
or as ``Retry-After: N`` in its message (the raw listing's errors do,
:mod:`stoker.storage.rawlist`); obstore's errors carry neither (it does not expose the
response headers of a failed request), so for its requests the throttle backoff applies.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from stoker.core.metrics import Counters
from stoker.errors import ListingStalledError

logger = logging.getLogger(__name__)

T = TypeVar("T")

ErrorKind = Literal[
    "not_found",
    "auth",
    "throttle",
    "server",
    "timeout",
    "connect",
    "reset",
    "short_body",
    "client",
    "other",
]

RETRYABLE: frozenset[ErrorKind] = frozenset(
    {"throttle", "server", "timeout", "connect", "reset", "short_body"}
)


class ShortBodyError(Exception):
    """A response carried fewer bytes than it announced (raised by our own checks)."""


_RETRY_AFTER = re.compile(r"retry-after:\s*(\d+(?:\.\d+)?)")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently to retry a failed request.

    Attributes:
        max_attempts: Attempts in all, the first included.
        base_delay_s: Backoff before the second attempt; it doubles each time.
        max_delay_s: Cap on one backoff.
        max_elapsed_s: Give up rather than wait past this much time since the first attempt.
        connect_attempts: Attempts for a refused or failed connection, which rarely heals.
        throttle_base_delay_s: Backoff before the second attempt of a throttled request
            (503 SlowDown, 429); it doubles each time, capped by ``max_delay_s``.
        max_retry_after_s: Cap on a server's ``Retry-After`` (it is honoured up to this).
    """

    max_attempts: int = 10
    base_delay_s: float = 0.05
    max_delay_s: float = 5.0
    max_elapsed_s: float = 120.0
    connect_attempts: int = 3
    throttle_base_delay_s: float = 0.5
    max_retry_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.connect_attempts < 1:
            raise ValueError(f"connect_attempts must be >= 1, got {self.connect_attempts}")
        delays = (
            self.base_delay_s,
            self.max_delay_s,
            self.max_elapsed_s,
            self.throttle_base_delay_s,
            self.max_retry_after_s,
        )
        if any(d < 0 for d in delays):
            raise ValueError(f"retry delays must be >= 0, got {self}")

    def backoff_s(self, attempt: int, rng: random.Random, *, throttled: bool = False) -> float:
        """Backoff before attempt ``attempt + 1`` (``attempt`` starts at 1).

        Full jitter in [0, ceiling]; a throttled request waits at least half the ceiling, so
        that many clients throttled at once really slow down.
        """
        base = self.throttle_base_delay_s if throttled else self.base_delay_s
        ceiling = min(self.max_delay_s, base * (2 ** (attempt - 1)))
        return rng.uniform(ceiling / 2 if throttled else 0.0, ceiling)


_STATUS = re.compile(r"status code: (\d{3})")
_RESET_MARKERS = (
    "connection reset",
    "connectionreset",
    "broken pipe",
    "incompletemessage",
    "unexpected eof",
    "unexpectedeof",
    "kind: body",
    "kind: decode",
    "error decoding response body",
    "connection closed before message completed",
    "connectionaborted",
)


def classify(exc: BaseException) -> ErrorKind:
    """Sort an exception from obstore (or our own checks) into an :data:`ErrorKind`."""
    if isinstance(exc, ShortBodyError):
        return "short_body"
    if isinstance(exc, ListingStalledError):  # the server pages in a loop: asking again loops
        return "other"
    if isinstance(exc, FileNotFoundError):
        return "not_found"
    if isinstance(exc, TimeoutError):
        return "timeout"
    name = type(exc).__name__
    if name in ("PermissionDeniedError", "UnauthenticatedError"):
        return "auth"
    if isinstance(exc, ConnectionError):
        return "reset"
    text = str(exc).lower()
    match = _STATUS.search(text)
    if match:
        status = int(match.group(1))
        if status in (429, 503) or "slowdown" in text:
            return "throttle"
        if status >= 500 or status == 408:
            return "server"
        if status in (401, 403):
            return "auth"
        if status == 404:
            return "not_found"
        return "client"
    if "timed out" in text or "timedout" in text or "kind: timeout" in text:
        return "timeout"
    if any(marker in text for marker in _RESET_MARKERS):
        return "reset"
    if "kind: connect" in text or "tcp connect error" in text or "dns error" in text:
        return "connect"
    if "error sending request" in text:
        return "reset"
    return "other"


_XML_CODE = re.compile(r"<Code>([^<]+)</Code>")
_XML_MESSAGE = re.compile(r"<Message>([^<]+)</Message>")
_XML_REQUEST_ID = re.compile(r"<RequestId>([^<]+)</RequestId>")
_HTTP_STATUS = re.compile(r"status code: (\d{3}[^:<]*)")


def summarise_error(text: str) -> str:
    """One line for an S3 error: the HTTP status, the XML error's code, message and request
    id where the body has them (obstore's first line ends just before the body), else the
    first line of the text."""
    status = _HTTP_STATUS.search(text)
    code = _XML_CODE.search(text)
    if status is None or code is None:
        return text.split("\n", 1)[0][:300]
    message = _XML_MESSAGE.search(text)
    request_id = _XML_REQUEST_ID.search(text)
    line = f"HTTP {status.group(1).strip()}: {code.group(1)}"
    if message:
        line += f": {message.group(1)}"
    if request_id:
        line += f" (request id {request_id.group(1)})"
    return line[:400]


def error_code(text: str) -> str | None:
    """The ``<Code>`` of an S3 XML error in ``text``, if it has one."""
    match = _XML_CODE.search(text)
    return match.group(1) if match else None


def retry_after_s(exc: BaseException) -> float | None:
    """The server's ``Retry-After`` in seconds, if the error carries one."""
    value = getattr(exc, "retry_after_s", None)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    match = _RETRY_AFTER.search(str(exc).lower())
    return float(match.group(1)) if match else None


async def call_with_retries(
    request: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    counters: Counters,
    what: str,
    rng: random.Random | None = None,
) -> T:
    """Run ``request`` until it succeeds, a non-retryable error occurs, or the policy gives up.

    Every attempt after the first counts as ``retries``; throttling also counts as
    ``throttles``; each failure counts as ``errors.<kind>``. The wait before a retry is the
    policy's backoff, or the error's ``Retry-After`` (capped) if that is longer; a retry
    that would start after ``max_elapsed_s`` is not made. The last exception is re-raised
    unchanged, so the caller can map it to a stoker error.

    Args:
        request: Makes one attempt; called anew for every attempt.
        policy: Attempts, backoff and time limits.
        counters: Where attempts, retries and errors are counted.
        what: Short description for log messages, e.g. ``"GET s3://b/k"``.
        rng: Jitter source (tests pass a seeded one).
    """
    rng = rng or random.Random()
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await request()
        except Exception as exc:
            kind = classify(exc)
            counters.add(f"errors.{kind}")
            if kind == "throttle":
                counters.add("throttles")
            limit = policy.connect_attempts if kind == "connect" else policy.max_attempts
            if kind not in RETRYABLE or attempt >= limit:
                raise
            delay = policy.backoff_s(attempt, rng, throttled=kind == "throttle")
            after = retry_after_s(exc)
            if after is not None:
                delay = max(delay, min(after, policy.max_retry_after_s))
            if time.monotonic() - started + delay > policy.max_elapsed_s:
                raise
            logger.debug("%s: %s (attempt %d), retrying in %.3fs", what, kind, attempt, delay)
            counters.add("retries")
            await asyncio.sleep(delay)
