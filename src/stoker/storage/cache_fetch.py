"""Missing cache pages fetched once per node: claim a page and fetch it, or wait for the
process that claimed it to store it in the cache.

:class:`~stoker.storage.cached.CachedStore` hands a :class:`NodeFetch` the pages of one
read that neither the cache nor another read of this process has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from stoker.storage.cache import DiskCache
from stoker.storage.cache_claims import Claim, poll_pauses
from stoker.storage.cache_pages import PageBytes

logger = logging.getLogger(__name__)

#: Fetch these pages from the store, store them and release their claims.
FetchPages = Callable[[list[int], dict[int, Claim]], Awaitable[dict[int, PageBytes]]]
#: Read these pages from the cache into ``got``; return the pages not there.
TakeCached = Callable[[list[int], dict[int, PageBytes]], Awaitable[list[int]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFetch:
    """The missing pages of one read of ``where``, keyed in ``cache`` by ``keys``."""

    cache: DiskCache
    keys: dict[int, str]
    where: str
    claim_wait_s: float
    fetch: FetchPages
    take_cached: TakeCached

    async def get(self, missing: list[int]) -> dict[int, PageBytes]:
        """The pages this process claims (:meth:`DiskCache.claim`) it fetches; those another
        process is fetching it waits for in the cache, polling with a growing pause, and
        fetches itself after ``claim_wait_s`` or when that process gave up."""
        claims, busy, ready = await asyncio.to_thread(self._claim, missing)
        try:
            fetched, waited = await asyncio.gather(
                self.fetch(sorted(claims), claims), self._wait_for_others(busy, ready, claims)
            )
        finally:
            for claim in claims.values():
                claim.release()
        return {**fetched, **waited}

    def _claim(self, pages: list[int]) -> tuple[dict[int, Claim], list[int], list[int]]:
        """Try to claim each page: (claimed, held by another process, in the cache now)."""
        claims: dict[int, Claim] = {}
        busy: list[int] = []
        ready: list[int] = []
        for page in pages:
            claim = self.cache.claim(self.keys[page])
            if claim is None:
                busy.append(page)
            elif claim.exclusive and self.cache.contains(self.keys[page]):
                claim.release()  # its owner stored it between our read and our claim
                ready.append(page)
            else:
                claims[page] = claim
        return claims, busy, ready

    async def _wait_for_others(
        self, busy: list[int], ready: list[int], claims: dict[int, Claim]
    ) -> dict[int, PageBytes]:
        got: dict[int, PageBytes] = {}
        if busy:
            self.cache.counters.add("cache.waits", len(busy))
        deadline = time.monotonic() + self.claim_wait_s
        pauses = poll_pauses()
        while True:
            if ready:
                lost = await self.take_cached(ready, got)  # gone again (evicted, or damaged)
                got.update(await self.fetch(lost, claims))
            if not busy:
                return got
            if time.monotonic() >= deadline:
                self.cache.counters.add("cache.wait_timeouts", len(busy))
                logger.warning(
                    "disk cache %s: %d page(s) of %s still being fetched by another "
                    "process after %.1f s; fetching them here",
                    self.cache.directory,
                    len(busy),
                    self.where,
                    self.claim_wait_s,
                )
                got.update(await self.fetch(busy, claims))
                return got
            await asyncio.sleep(next(pauses))
            claimed, busy, ready = await asyncio.to_thread(self._poll, busy)
            claims.update(claimed)
            got.update(await self.fetch(sorted(claimed), claims))

    def _poll(self, pages: list[int]) -> tuple[dict[int, Claim], list[int], list[int]]:
        """Pages waited for that are in the cache now, or that this process now claims."""
        stored = [page for page in pages if self.cache.contains(self.keys[page])]
        claims, busy, ready = self._claim([p for p in pages if p not in stored])
        return claims, busy, sorted(stored + ready)
