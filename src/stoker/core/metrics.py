"""Thread-safe counters that every stage and store records into."""

from __future__ import annotations

import threading
from collections import Counter


class Counters:
    """A named set of monotonically increasing integer counters.

    Safe to update from any thread. Keys are dotted names such as ``"requests.get"`` or
    ``"errors.timeout"``; :meth:`snapshot` returns a plain dict for reports and JSON.
    """

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, value: int = 1) -> None:
        """Add ``value`` to counter ``name``."""
        with self._lock:
            self._counts[name] += value

    def get(self, name: str) -> int:
        """Return the current value of ``name`` (0 if never recorded)."""
        with self._lock:
            return self._counts.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """Return a sorted copy of all counters."""
        with self._lock:
            return dict(sorted(self._counts.items()))

    def __repr__(self) -> str:
        return f"Counters({self.snapshot()})"
