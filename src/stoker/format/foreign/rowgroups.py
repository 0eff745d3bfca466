"""A bounded cache of decoded Parquet row groups, shared by a reader's threads.

Packing reads samples in a shuffled order, so the rows of one row group are asked for
many times, far apart and from many threads at once. The cache decodes a row group once
while it is held (a thread that asks for one being decoded waits for it) and keeps the
most recently used ones up to a byte budget.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

#: What a reader keeps decoded, per process, unless told otherwise.
DEFAULT_CACHE_BYTES = 1 << 30


class RowGroupCache:
    """Decoded row groups by key, least recently used first out, up to ``max_bytes``.

    The newest entry is kept even when it alone passes the budget.

    Args:
        max_bytes: Budget for the decoded row groups held.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self._max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._loading: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self._bytes = 0
        #: Row groups decoded so far (a miss each).
        self.loads = 0

    def get(self, key: Hashable, load: Callable[[], tuple[Any, int]]) -> Any:
        """The value of ``key``; on a miss ``load()`` gives it and its size in bytes.

        Raises:
            Whatever ``load`` raises (the next caller for the key tries again).
        """
        while True:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    return self._entries[key][0]
                event = self._loading.get(key)
                if event is None:
                    event = self._loading[key] = threading.Event()
                    break
            event.wait()  # another thread decodes it; then look again
        try:
            value, size = load()
        except BaseException:
            with self._lock:
                del self._loading[key]
            event.set()
            raise
        with self._lock:
            self.loads += 1
            self._entries[key] = (value, size)
            self._bytes += size
            while self._bytes > self._max_bytes and len(self._entries) > 1:
                _, (_, freed) = self._entries.popitem(last=False)
                self._bytes -= freed
            del self._loading[key]
        event.set()
        return value
