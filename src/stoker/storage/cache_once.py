"""One fetch per node for a whole disk-cache entry: the processes of a node that miss one
entry at once (ranks and loader workers listing one image folder) let one of them fetch it,
and the others wait for it in the cache.

The claim is the cache's own (:meth:`~stoker.storage.cache.DiskCache.claim`, the one
:class:`~stoker.storage.cached.CachedStore` takes for pages): a process that dies holding it
lets the next one take it over, and a wait longer than ``wait_s`` fetches anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from stoker.storage.cache import DiskCache
from stoker.storage.cache_claims import CLAIM_WAIT_S, poll_pauses

logger = logging.getLogger(__name__)


def fetch_once(
    cache: DiskCache, key: str, fetch: Callable[[], bytes], *, wait_s: float = CLAIM_WAIT_S
) -> bytes:
    """The entry for ``key``: from ``cache``, or made by ``fetch`` in one process of the node
    and stored there while the others wait for it.

    Args:
        cache: The node's disk cache.
        key: The entry's key.
        fetch: Makes the entry (a listing, an object); an error it raises is raised here,
            and a process waiting for it then fetches itself.
        wait_s: Longest wait for another process's fetch before fetching here too.
    """
    deadline = time.monotonic() + wait_s
    pauses = poll_pauses()
    waiting = False
    while True:
        if not waiting or cache.contains(key):  # a miss is counted once, not every look
            found = cache.get(key)
            if found is not None:
                return found
        claim = cache.claim(key)
        if claim is not None:
            try:
                if claim.exclusive and cache.contains(key):  # stored since our look
                    found = cache.get(key)
                    if found is not None:
                        return found
                data = fetch()
                cache.put(key, data)
                return data
            finally:
                claim.release()
        if not waiting:
            waiting = True
            cache.counters.add("cache.waits")
        if time.monotonic() >= deadline:
            logger.warning(
                "disk cache %s: an entry still being fetched by another process after %.1f s; "
                "fetching it here",
                cache.directory,
                wait_s,
            )
            cache.counters.add("cache.wait_timeouts")
            return fetch()
        time.sleep(next(pauses))
