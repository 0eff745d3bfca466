"""The cache pages this process is getting, so that concurrent reads of one page share one
get: the first read of a page owns it; the others wait for what it settles."""

from __future__ import annotations

import asyncio

from stoker.core.perprocess import ForkSafeLock
from stoker.storage.cache_pages import Page


class PagesInFlight:
    """Futures of the pages being got in this process, by cache key."""

    def __init__(self) -> None:
        self._lock = ForkSafeLock()
        self._futures: dict[str, asyncio.Future[Page | None]] = {}

    def take(
        self, keys: dict[int, str]
    ) -> tuple[list[int], dict[int, asyncio.Future[Page | None]]]:
        """Own the pages of ``keys`` nobody is getting; return them, and the futures of the
        others to wait for (a page's bytes, or None: read it from the cache)."""
        owned: list[int] = []
        waits: dict[int, asyncio.Future[Page | None]] = {}
        loop = asyncio.get_running_loop()
        with self._lock:
            for page, key in keys.items():
                pending = self._futures.get(key)
                if pending is None:
                    self._futures[key] = loop.create_future()
                    owned.append(page)
                else:
                    waits[page] = pending
        return owned, waits

    def settle(self, key: str, whole: Page | None, error: BaseException | None = None) -> None:
        """Hand this process's reads waiting for a page its bytes (or None: read it from
        the cache), or the error that stopped it."""
        with self._lock:
            future = self._futures.pop(key, None)
        if future is None or future.done():
            return
        if error is not None:
            future.set_exception(error)
            future.exception()  # marked retrieved: the waiter (if any) re-raises it
        else:
            future.set_result(whole)
