"""The HTTP faults `NetProxy` injects: which requests, which kind, and how a response is cut.

Request faults answer the request in the proxy instead of forwarding it: ``"503"`` (an S3
``SlowDown`` with a ``Retry-After`` header), ``"500"`` (an S3 ``InternalError``) or ``"reset"``
(the client connection is reset before any response).

Response faults forward the request (so the server does the work, as when a real network
fails after a PUT was applied) and spoil the response, cut at a point half-way through its
body, or half-way through its head when it has no body, or just after the head when the body
length is not announced (chunked):

* ``"body_reset"``: what came before the cut arrives, then a TCP reset;
* ``"truncate"``: what came before the cut arrives, then a clean close (FIN), short of the
  announced ``Content-Length``;
* ``"stall"``: what came before the cut arrives, then nothing more, until the client gives up
  and closes the connection (its timeout) or the proxy stops; with ``stall_s``, the whole
  response is held back that long instead and then delivered (a slow read, not a dead one).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = [
    "FAULT_KINDS",
    "REQUEST_FAULTS",
    "RESPONSE_FAULTS",
    "FaultConfig",
    "FaultPolicy",
    "ResponseCutter",
    "error_response",
]

REQUEST_FAULTS = ("503", "500", "reset")
"""Faults that answer a request in place of the server."""
RESPONSE_FAULTS = ("body_reset", "truncate", "stall")
"""Faults that forward a request and spoil its response."""
FAULT_KINDS = REQUEST_FAULTS + RESPONSE_FAULTS
"""The fault kinds that `FaultConfig.kinds` may name."""

_HEAD_MAX = 64 << 10  # a longer response head is not HTTP we understand: stop cutting
_ERRORS = {
    "503": ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
    "500": ("500 Internal Server Error", "InternalError", "We encountered an internal error."),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultConfig:
    """Which HTTP requests the proxy faults, and how.

    Attributes:
        fault_rate: Probability in [0, 1] that an eligible request is faulted.
        kinds: Fault kinds to choose among, uniformly (see `FAULT_KINDS` and the module
            docstring).
        seed: Seed of the random generator that takes the decisions.
        fault_paths: Only requests whose request-target contains this substring are
            eligible; None means all.
        fault_methods: Only requests with one of these methods are eligible; None means all.
        retry_after_s: Value of the ``Retry-After`` header of "503" and "500" answers.
        stall_s: With a number, a "stall" holds its response back this many seconds, then
            delivers it whole; None: a stall lasts until the client gives up.
        max_faults: Fault at most this many requests, then forward the rest; None: no cap.
    """

    fault_rate: float = 0.0
    kinds: tuple[str, ...] = ("503",)
    seed: int = 0
    fault_paths: str | None = None
    fault_methods: frozenset[str] | None = None
    retry_after_s: int = 0
    stall_s: float | None = None
    max_faults: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError(f"FaultConfig.fault_rate must be in [0, 1], got {self.fault_rate!r}")
        kinds = self.kinds
        if isinstance(kinds, str) or not kinds or any(k not in FAULT_KINDS for k in kinds):
            raise ValueError(f"FaultConfig.kinds must name some of {FAULT_KINDS}, got {kinds!r}")
        object.__setattr__(self, "kinds", tuple(kinds))
        methods = self.fault_methods
        if methods is not None:
            if isinstance(methods, str) or not methods:
                raise ValueError(
                    "FaultConfig.fault_methods must be None (all methods) or a non-empty set "
                    f"of method names, got {methods!r}"
                )
            object.__setattr__(self, "fault_methods", frozenset(m.upper() for m in methods))
        after = self.retry_after_s
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"FaultConfig.retry_after_s must be an int >= 0, got {after!r}")
        if self.stall_s is not None and not self.stall_s >= 0:
            raise ValueError(f"FaultConfig.stall_s must be None or >= 0, got {self.stall_s!r}")
        if self.max_faults is not None and self.max_faults < 0:
            raise ValueError(f"FaultConfig.max_faults must be None or >= 0, got {self.max_faults}")


class FaultPolicy:
    """Takes the seeded fault decisions of one `FaultConfig`."""

    def __init__(self, config: FaultConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.faults_left = config.max_faults

    def choose(self, method: str, target: str) -> str | None:
        """The fault kind for this request, or None to forward it untouched."""
        cfg = self.config
        if (
            cfg.fault_rate <= 0.0
            or (cfg.fault_methods is not None and method not in cfg.fault_methods)
            or (cfg.fault_paths is not None and cfg.fault_paths not in target)
            or self.faults_left == 0
            or self.rng.random() >= cfg.fault_rate
        ):
            return None
        if self.faults_left is not None:
            self.faults_left -= 1
        return self.rng.choice(cfg.kinds)


def error_response(kind: str, *, retry_after_s: int, close: bool, head_only: bool) -> bytes:
    """The S3-style XML error response of a "503" or "500" fault."""
    status, code, message = _ERRORS[kind]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    ).encode()
    connection = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
        f"Retry-After: {retry_after_s}\r\nContent-Length: {len(body)}\r\n{connection}\r\n"
    ).encode()
    return head if head_only else head + body


class ResponseCutter:
    """Passes the bytes of one HTTP/1.1 response up to its cut point (see the module docstring).

    Interim ``1xx`` responses pass whole. Feed it the server's bytes in order; once `cut` is
    true, the proxy applies the fault and drops whatever the server sends after.

    Args:
        kind: The response fault (one of `RESPONSE_FAULTS`).
        head_only: The request was a HEAD: the response has no body whatever it announces.
    """

    def __init__(self, kind: str, *, head_only: bool) -> None:
        if kind not in RESPONSE_FAULTS:
            raise ValueError(f"not a response fault: {kind!r}")
        self.kind = kind
        self.head_only = head_only
        self.cut = False
        self._head = b""
        self._body_left: int | None = None  # body bytes still to pass; None: in the head

    def feed(self, data: bytes) -> bytes:
        """Return the part of ``data`` to pass on; check `cut` afterwards."""
        out: list[bytes] = []
        while data and not self.cut:
            if self._body_left is not None:
                out.append(data[: self._body_left])
                self._body_left -= len(out[-1])
                self.cut = self._body_left == 0
                break
            data = self._read_head(data, out)
        return b"".join(out)

    def _read_head(self, data: bytes, out: list[bytes]) -> bytes:
        buf = self._head + data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > _HEAD_MAX:  # not a response we understand: cut right here
                self.cut = True
            self._head = b"" if self.cut else buf
            return b""
        head, rest = buf[: end + 4], buf[end + 4 :]
        self._head = b""
        status_line = head[: head.find(b"\r\n")].split(b" ", 2)
        status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
        if 100 <= status < 200:
            out.append(head)
            return rest
        length = _content_length(head)
        if self.head_only or status in (204, 304) or length == 0:
            out.append(head[: len(head) // 2])
            self.cut = True
            return b""
        out.append(head)
        self._body_left = 0 if length is None else length // 2
        if self._body_left == 0:
            self.cut = True
        return rest


def _content_length(head: bytes) -> int | None:
    lower = head.lower()
    if b"\r\ntransfer-encoding:" in lower:
        return None
    start = lower.find(b"\r\ncontent-length:")
    if start < 0:
        return None
    start += len(b"\r\ncontent-length:")
    value = lower[start : lower.find(b"\r\n", start)].strip()
    return int(value) if value.isdigit() else None
