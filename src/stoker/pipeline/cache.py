"""An in-memory LRU cache of fetched samples, bounded in bytes."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from stoker.core.perprocess import ForkSafeLock


def sample_bytes(sample: dict[str, Any]) -> int:
    """Bytes a fetched sample holds (its byte fields)."""
    return sum(len(v) for v in sample.values() if isinstance(v, bytes | bytearray | memoryview))


class SampleCache:
    """Thread-safe LRU of ``sample id -> fetched sample``, at most ``max_bytes`` in all.

    With a budget at least the dataset's size, every epoch after the first is served from
    memory, without a request.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._items: OrderedDict[int, tuple[dict[str, Any], int]] = OrderedDict()
        self._bytes = 0
        self._lock = ForkSafeLock()
        self.hits = 0
        self.misses = 0

    @property
    def bytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: int) -> dict[str, Any] | None:
        """The cached sample, or None (and counts the hit or miss)."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: int, sample: dict[str, Any]) -> None:
        """Keep ``sample``, evicting the least recently used beyond the budget."""
        size = sample_bytes(sample)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (sample, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._items.popitem(last=False)
                self._bytes -= evicted
