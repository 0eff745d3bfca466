"""Listings that must move on: obstore's listings watched for a server that pages in a loop.

obstore follows a listing's continuation tokens itself, inside one request of ours: a chunk
of :func:`obstore.list` (up to 1,000 keys, however many pages that takes) or a whole
one-level listing (:func:`obstore.list_with_delimiter_async`, every page kept until the
last). A server that pages badly (the same continuation token again, new tokens over the
same keys, truncated pages with no keys and no end) keeps it asking, thousands of times a
second, and a one-level listing growing, for ever. So:

* Every chunk must move on (:class:`ChunkOrder`): its keys under the prefix, each past the
  one before it and past the last key of the chunk before, in the order the listing keeps
  (S3 lists in the order of the keys' UTF-8 bytes, a filer such as SeaweedFS folder by
  folder: :data:`ORDERS`).
* A chunk or a one-level listing that has not come within :data:`PROBE_AFTER_S` is read
  again alongside by a *probe* (:mod:`stoker.storage.rawlist`: our own signed requests,
  which check every page and say what the server did), when the store can sign them. A
  probe that finds the listing stalled ends it at once with its finding; a one-level probe
  that lists the whole level first answers in obstore's place.
* Past a deadline without an answer (:func:`watched`'s ``deadline_s``), the listing ends.

Cancelling obstore's future stops its requests. Each way ends with a
:class:`~stoker.errors.ListingStalledError` (a :class:`~stoker.errors.StorageError`) naming
the listing, what the server did, and no request more: a listing keeps at most one chunk,
or what a level gathered before its probe answered, in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from stoker.errors import ListingStalledError

__all__ = [
    "ORDERS",
    "PROBE_AFTER_S",
    "ChunkOrder",
    "KeyOrders",
    "key_bytes",
    "watched",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a chunk or a one-level listing may take before a probe checks its pages.
PROBE_AFTER_S = 1.0


def key_bytes(key: str) -> bytes:
    """The bytes of a key as the server has them (lone surrogates are the bytes that were
    not UTF-8); listings are in this order."""
    try:
        return key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no undecodable byte made
        return key.encode("utf-8", "surrogatepass")


def short(text: str | None) -> str:
    """``text`` for a message: its repr, cut at 80 characters."""
    return repr(text) if text is None or len(text) <= 80 else repr(text[:80]) + "..."


def stalled(where: str, what: str) -> ListingStalledError:
    """The error for listing ``where`` (a URL) whose server did ``what``."""
    return ListingStalledError(f"listing {where}: the server {what}; stopped rather than ask again")


def _segments(key: str) -> str:
    # A filer's order as string order: '/' below every other character.
    return key.replace("/", "\0")


#: The orders a listing may come in, over its keys as obstore returns them (valid Unicode,
#: whose code point order is its UTF-8 byte order): S3's (the keys' bytes), and a filer's
#: (SeaweedFS lists folder by folder, the keys' path segments in order: 'a/b' before 'a.c').
ORDERS: dict[str, Callable[[str], str]] = {"bytes": str, "segments": _segments}


def _increasing(keys: Sequence[str], sort: Callable[[str], str]) -> bool:
    ordered = keys if sort is str else [sort(k) for k in keys]
    return all(map(operator.lt, ordered, itertools.islice(ordered, 1, None)))


class KeyOrders:
    """Which of the orders a listing may come in (:data:`ORDERS`, over the keys' bytes) the
    pages of one listing have kept so far, and the highest key in each."""

    def __init__(self, after: bytes | None) -> None:
        self._highest: dict[str, bytes | None] = {
            name: None if after is None else _sort_bytes(name, after) for name in ORDERS
        }

    def past(self, keys: Sequence[bytes], after: bytes) -> bool:
        """Keep the orders in which every one of ``keys`` (one page's) is past ``after``;
        whether one is left."""
        kept = {
            name: high
            for name, high in self._highest.items()
            if min(_sort_bytes(name, key) for key in keys) > _sort_bytes(name, after)
        }
        self._highest = kept or self._highest
        return bool(kept)

    def advance(self, keys: Sequence[bytes]) -> bool:
        """Keep the orders in which some of ``keys`` (one page's) is past the highest key
        so far, and move the highest on; whether one is left."""
        moved: dict[str, bytes | None] = {}
        for name, high in self._highest.items():
            top = max(_sort_bytes(name, key) for key in keys)
            if high is None or top > high:
                moved[name] = top
        self._highest = moved or self._highest
        return bool(moved)


def _sort_bytes(name: str, key: bytes) -> bytes:
    return key.replace(b"/", b"\0") if name == "segments" else key


class ChunkOrder:
    """Checks that the chunks of one obstore listing under ``prefix`` move on: their keys
    under the prefix and increasing, from chunk to chunk, in one of :data:`ORDERS`.

    Args:
        where: The listing's URL, for messages.
        prefix: The listing's prefix (keys are under ``prefix/``), relative to the store.
        after: The key the listing starts after, if any.
    """

    def __init__(self, where: str, prefix: str, after: str | None) -> None:
        self._where = where
        self._under = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self._last = after
        self._kept = tuple(ORDERS)

    def check(self, keys: Sequence[str]) -> None:
        """Raise :class:`ListingStalledError` unless ``keys`` (one chunk) move on."""
        if not keys:
            return
        seq = keys if self._last is None else [self._last, *keys]
        kept = tuple(name for name in self._kept if _increasing(seq, ORDERS[name]))
        if not kept:
            raise self._back(seq)
        self._kept = kept
        under = self._under
        if under:
            outside = next((k for k in keys if not k.startswith(under) and k != under[:-1]), None)
            if outside is not None:
                raise stalled(
                    self._where, f"listed {short(outside)}, which is not under the prefix"
                )
        self._last = keys[-1]

    def _back(self, seq: Sequence[str]) -> ListingStalledError:
        # The first step back in every order kept, else the first in S3's.
        sorts = [ORDERS[name] for name in self._kept]
        pairs = list(itertools.pairwise(seq))
        before, key = next(
            ((a, b) for a, b in pairs if all(sort(b) <= sort(a) for sort in sorts)),
            next((a, b) for a, b in pairs if b <= a),
        )
        if key == before:
            return stalled(self._where, f"listed {short(key)} again (pages in a loop)")
        return stalled(self._where, f"listed {short(key)} after {short(before)}, out of order")


async def watched(
    work: Awaitable[T],
    *,
    probe: Callable[[], Awaitable[T | None]],
    deadline_s: float,
    where: str,
) -> T:
    """``work`` (a chunk or a level of obstore's listing at ``where``), watched.

    After :data:`PROBE_AFTER_S` without an answer, ``probe()`` runs alongside: its
    :class:`ListingStalledError` ends the listing at once (``work`` cancelled), a result
    answers in place of ``work``'s, and None or another error (the probe could not run)
    leaves ``work`` to answer within ``deadline_s`` of the start.

    Raises:
        ListingStalledError: The probe found the listing stalled, or ``deadline_s`` passed.
    """
    started = time.monotonic()
    task = asyncio.ensure_future(work)
    checker: asyncio.Future[T | None] | None = None
    try:
        await asyncio.wait({task}, timeout=min(PROBE_AFTER_S, deadline_s))
        if not task.done():
            checker = asyncio.ensure_future(probe())
            await asyncio.wait({task, checker}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and checker is not None:
            found = _verdict(checker, where)
            if found is not None:
                return found
            left = deadline_s - (time.monotonic() - started)
            if left > 0:
                await asyncio.wait({task}, timeout=left)
        if not task.done():
            raise stalled(
                where, f"sent no new keys within {deadline_s:g} s (pages without end or a stall)"
            )
        return task.result()
    finally:
        for pending in (task, checker):
            if pending is not None and not pending.done():
                pending.cancel()
        if checker is not None and checker.done() and not checker.cancelled():
            checker.exception()  # retrieved: a probe's own failure is not an error here


def _verdict(checker: asyncio.Future[T | None], where: str) -> T | None:
    # What a finished probe found: its result, its ListingStalledError raised, or None.
    if not checker.done():
        return None
    with contextlib.suppress(asyncio.CancelledError):
        error = checker.exception()
        if isinstance(error, ListingStalledError):
            raise error
        if error is not None:
            logger.debug("listing %s: the probe could not check the pages: %r", where, error)
            return None
        return checker.result()
    return None
