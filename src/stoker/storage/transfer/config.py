"""What a transfer is asked to do (:class:`TransferConfig`), whom it tells how far it got
(:class:`ProgressSink`) and what it reports (:class:`TransferReport`)."""

from __future__ import annotations

import builtins
import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from stoker.errors import StokerError, TransferError

DEFAULT_WORKERS = 64
DEFAULT_LIST_AHEAD = 10_000
#: Seconds of nothing but throttles (503 SlowDown, 429) before a download gives up.
DEFAULT_MAX_THROTTLED_S = 180.0
#: Open files a worker may hold at once: its local file and two connections.
FILES_PER_WORKER = 3
#: Open files the process needs besides the workers' (interpreter, libraries, the engine).
BASE_OPEN_FILES = 64


def bound_workers(workers: int, open_files_limit: int) -> tuple[int, int]:
    """The most workers, up to ``workers``, that fit in ``open_files_limit`` descriptors, and
    the requests in flight to allow them (each needs a connection).

    Returns:
        ``(workers, max_in_flight)``.

    Raises:
        ValueError: Not even one worker fits; the message names the limit.
    """
    room = open_files_limit - BASE_OPEN_FILES
    fits = room // FILES_PER_WORKER
    if fits < 1:
        raise ValueError(
            f"the open-file limit of {open_files_limit} (ulimit -n) leaves no room for a "
            f"transfer, which needs at least {BASE_OPEN_FILES + FILES_PER_WORKER}; raise it"
        )
    workers = min(workers, fits)
    return workers, min(max(128, 2 * workers), room - workers)


def check_glob(name: str, pattern: str) -> None:
    """Refuse a glob pattern that matches otherwise than it reads: empty, or with a ``[``
    that no ``]`` closes (fnmatch then takes the ``[`` literally, so ``--include '['``
    selected nothing, silently).

    Raises:
        ValueError: Such a pattern, named with ``name``.
    """
    if not pattern:
        raise ValueError(f"{name} pattern is empty: it would match no key")
    i = 0
    while i < len(pattern):
        if pattern[i] == "[":  # a set runs to the next "]", a "]" first in it included
            j = i + 1 + (pattern[i + 1 : i + 2] == "!")
            j += pattern[j : j + 1] == "]"
            end = pattern.find("]", j)
            if end < 0:
                raise ValueError(
                    f"{name} pattern {pattern!r} has a '[' at {i} that no ']' closes; "
                    "to match a '[' itself, write [[]"
                )
            i = end
        i += 1


class ProgressSink(Protocol):
    """Receives progress from a transfer (a progress bar, a logger, a test)."""

    def start(self, *, files: int, total_bytes: int) -> None:
        """Called once, when the work is known: before any `advance`, except for a download
        whose listing is longer than ``list_ahead``, where it comes when the listing ends
        (the advances before it are then reported together, just after it)."""

    def advance(self, *, files: int, nbytes: int) -> None:
        """Called as files finish (or are skipped)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferConfig:
    """How a download or upload runs.

    Attributes:
        workers: Files in flight at once. The default hides a 20 ms round trip on small
            files; large files also move several parts at once.
        include: Glob patterns (on the key relative to the source root); a file must match
            one of them if any are given.
        exclude: Glob patterns; a file that matches one is left out.
        resume: Skip files that are already complete at the destination.
        verify: Check each downloaded file against the object's ETag where it is an MD5
            (single-part uploads). A multipart ETag is not checked: it depends on a part
            size the listing does not say, and a wrong guess would fail a good file.
        list_ahead: Most objects a download lists ahead of the files it has started; bounds
            its memory on buckets of millions of objects.
        max_throttled_s: A download gives up once the store has answered every request
            with a throttle (503 SlowDown, 429) for this many seconds, serving none: it
            stops the files in flight (leaving no partial file) and raises
            :class:`~stoker.errors.RetriesExhaustedError` saying that the store is
            throttling. Any request served starts the count again, so a store that only
            slows the transfer down never stops it. The first throttle is logged as a
            warning, with the request rate reached.
    """

    workers: int = DEFAULT_WORKERS
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    resume: bool = True
    verify: bool = True
    list_ahead: int = DEFAULT_LIST_AHEAD
    max_throttled_s: float = DEFAULT_MAX_THROTTLED_S

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.list_ahead < 1:
            raise ValueError(f"list_ahead must be >= 1, got {self.list_ahead}")
        throttled = self.max_throttled_s
        if isinstance(throttled, bool) or not isinstance(throttled, int | float):
            raise TypeError(f"max_throttled_s must be a number of seconds, got {throttled!r}")
        if not 0 < throttled < math.inf:
            raise ValueError(
                f"max_throttled_s must be a number of seconds > 0, got {self.max_throttled_s!r}"
            )
        for name in ("include", "exclude"):
            patterns = getattr(self, name)
            if isinstance(patterns, str):  # would be read as one pattern per character
                raise TypeError(f"{name} must be a tuple of patterns, got {patterns!r}")
            for pattern in patterns:
                check_glob(name, pattern)

    def selects(self, key: str) -> bool:
        """Whether ``key`` passes the include and exclude patterns."""
        if self.include and not any(fnmatch.fnmatchcase(key, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(key, p) for p in self.exclude)


@dataclass(slots=True, kw_only=True)
class TransferReport:
    """What a download or upload did.

    Attributes:
        direction: ``"download"`` or ``"upload"``.
        source: Source URL or directory.
        destination: Destination URL or directory.
        files_total: Files selected for transfer (skipped ones included).
        files_transferred: Files moved in this run.
        files_skipped: Files already complete at the destination.
        bytes_transferred: Bytes moved in this run.
        seconds: Wall time of the run, listing included.
        failures: ``(key, reason)`` for every file that failed.
        not_regular: ``(key, what it is)`` for every entry skipped because it is not a
            regular file (a FIFO, socket or device: reading it would block); uploads only.
        requests: The store's request counters after the run.
    """

    direction: Literal["download", "upload"]
    source: str
    destination: str
    files_total: int = 0
    files_transferred: int = 0
    files_skipped: int = 0
    bytes_transferred: int = 0
    seconds: float = 0.0
    failures: builtins.list[tuple[str, str]] = field(default_factory=list)
    not_regular: builtins.list[tuple[str, str]] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)

    @property
    def files_per_s(self) -> float:
        """Transferred files per second of wall time."""
        return self.files_transferred / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        """Transferred bytes per second of wall time."""
        return self.bytes_transferred / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "direction": self.direction,
            "source": self.source,
            "destination": self.destination,
            "files_total": self.files_total,
            "files_transferred": self.files_transferred,
            "files_skipped": self.files_skipped,
            "files_failed": len(self.failures),
            "bytes_transferred": self.bytes_transferred,
            "seconds": round(self.seconds, 3),
            "files_per_s": round(self.files_per_s, 1),
            "bytes_per_s": round(self.bytes_per_s, 1),
            "failures": [{"key": k, "error": e} for k, e in self.failures],
            "not_regular": [{"key": k, "what": w} for k, w in self.not_regular],
            "requests": self.requests,
        }


class NoProgress:
    """A sink that ignores progress."""

    def start(self, *, files: int, total_bytes: int) -> None:
        pass

    def advance(self, *, files: int, nbytes: int) -> None:
        pass


class LateProgress:
    """Holds advances back until `start` has been called, then passes everything on."""

    def __init__(self, sink: ProgressSink) -> None:
        self._sink = sink
        self._started = False
        self._files = self._bytes = 0

    def start(self, *, files: int, total_bytes: int) -> None:
        self._sink.start(files=files, total_bytes=total_bytes)
        self._started = True
        if self._files:
            self._sink.advance(files=self._files, nbytes=self._bytes)

    def advance(self, *, files: int, nbytes: int) -> None:
        if self._started:
            self._sink.advance(files=files, nbytes=nbytes)
        else:
            self._files += files
            self._bytes += nbytes


def error_text(exc: BaseException) -> str:
    """A failure's reason for the report: the message, with the type where it is not ours."""
    if isinstance(exc, StokerError | OSError | ValueError):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


def raise_failures(report: TransferReport) -> None:
    """Raise TransferError listing the report's failures, if there are any."""
    if report.failures:
        report.failures.sort()
        shown = "\n".join(f"  {key}: {reason}" for key, reason in report.failures[:20])
        more = len(report.failures) - 20
        tail = f"\n  ... and {more} more" if more > 0 else ""
        raise TransferError(
            f"{len(report.failures)} of {report.files_total} files failed to "
            f"{report.direction}:\n{shown}{tail}",
            report.failures,
        )
