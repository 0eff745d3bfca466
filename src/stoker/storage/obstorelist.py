"""Listing an obstore store: its keys page by page, and one level, each watched.

:class:`ObstoreListing` is how :class:`~stoker.storage.remote.ObstoreStore` lists. The keys
under a prefix come as obstore's chunks (up to 1,000 keys), each one request of the store
(paced, retried, counted); one level is obstore's ``list_with_delimiter``. Both are watched
(:mod:`stoker.storage.listguard`) so that a server that pages in a loop ends the listing
with a :class:`~stoker.errors.ListingStalledError` naming what it did, which is
not retried: asking again would loop again. A chunk must move on; one that has not come
after :data:`~stoker.storage.listguard.PROBE_AFTER_S` is checked by a probe of the same
pages, and must come within :data:`CHUNK_DEADLINE_TIMEOUTS` request timeouts
(``timeout_s``). A level is listed by both obstore and the raw lister, when slow, the first
answer winning; without a raw lister it must end within :data:`LEVEL_DEADLINE_TIMEOUTS`
request timeouts. The probe needs an S3 store whose credentials we can sign with
(:meth:`stoker.storage.rawlist.RawLister.for_store`); local folders are not watched.

When obstore refuses a page (a key it cannot parse), the listing goes on through the raw
lister from the last key listed (:mod:`stoker.storage.rawlist`), or names the key.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from stoker.errors import ListingStalledError, StorageError
from stoker.storage.base import Listing, ObjectMeta
from stoker.storage.listguard import ChunkOrder, watched
from stoker.storage.native import native
from stoker.storage.options import StorageOptions
from stoker.storage.url import StorageUrl

if TYPE_CHECKING:
    from stoker.storage.rawlist import RootedLister

__all__ = ["CHUNK_DEADLINE_TIMEOUTS", "LEVEL_DEADLINE_TIMEOUTS", "ObstoreListing", "meta_of"]

logger = logging.getLogger(__name__)

_LIST_PAGE = 1000
#: A chunk of keys must come within this many request timeouts (``timeout_s``).
CHUNK_DEADLINE_TIMEOUTS = 2
#: A level no probe can check must be listed within this many request timeouts.
LEVEL_DEADLINE_TIMEOUTS = 5

Request = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]


def meta_of(raw: Any, key: str | None = None) -> ObjectMeta:
    """An :class:`ObjectMeta` from obstore's dictionary of one object."""
    etag = raw.get("e_tag")
    return ObjectMeta(
        key=key if key is not None else raw["path"],
        size=int(raw["size"]),
        etag=etag.strip('"') if etag else None,
        last_modified=raw.get("last_modified"),
    )


class ObstoreListing:
    """The listings of one store in one process.

    Args:
        url: The store's root.
        options: Its options (``timeout_s`` sets the deadlines).
        client: This process's obstore client of the store.
        request: Sends one listing request of the store's (``request(prefix, attempt)``):
            paced, retried and counted; a :class:`~stoker.errors.ListingStalledError` is
            neither retried (asking again would loop again) nor reworded.
    """

    def __init__(
        self,
        *,
        url: StorageUrl,
        options: StorageOptions,
        client: Callable[[], Any],
        request: Request,
    ) -> None:
        self._url = url
        self._options = options
        self._client = client
        self._request = request
        self._watch = url.scheme != "file"  # a local folder cannot page in a loop

    def _where(self, prefix: str) -> str:
        folder = prefix.strip("/")
        return self._url.child(f"{folder}/" if folder else "")

    def rooted(self) -> RootedLister | None:
        """The raw lister of this store (keys relative to its root), if it can sign."""
        if self._url.scheme != "s3":
            return None
        # Imported only now: its XML and HTTP modules are a tenth of remote's import.
        from stoker.storage.rawlist import RawLister, RootedLister

        lister = RawLister.for_store(self._client(), timeout_s=self._options.timeout_s)
        return None if lister is None else RootedLister(lister, self._url.prefix)

    def _fallback(self, exc: Exception) -> RootedLister:
        # obstore refused a listing page over one key it cannot parse: list past it with
        # signed requests of our own, or re-raise (naming the key) if we cannot sign.
        from stoker.storage.rawlist import invalid_key_in

        key = invalid_key_in(exc)
        if key is None:
            raise exc
        rooted = self.rooted()
        if rooted is None:
            raise StorageError(
                f"the listing holds a key that cannot be read, {key!r}; listing past it needs "
                f"an S3 store with credentials from storage_options, the environment or a "
                f"profile"
            ) from exc
        return rooted

    async def _probe(self, prefix: str, after: str | None) -> None:
        rooted = self.rooted()
        if rooted is not None:
            await rooted.probe(prefix, start_after=after, delimiter=False)

    async def _explain(self, prefix: str, after: str | None) -> None:
        # A chunk that did not move on: let the probe say what the server does, if it can.
        try:
            await self._probe(prefix, after)
        except ListingStalledError:
            raise
        except Exception as exc:  # the probe could not run: the chunk's own finding stands
            logger.debug("listing %s: the probe failed: %r", self._where(prefix), exc)

    async def pages(self, prefix: str) -> AsyncIterator[list[ObjectMeta]]:
        """The keys under ``prefix``, a page at a time (see the module docstring)."""
        state = _Pages(prefix)
        while (page := await self._request(prefix, lambda: self._next_page(state))) is not None:
            if page:
                state.last = page[-1].key
                yield page

    async def _next_page(self, state: _Pages) -> list[ObjectMeta] | None:
        prefix = state.prefix
        if state.raw is not None:  # read past a key obstore cannot parse: every key as is
            if state.done:
                return None
            page = await state.raw.page(prefix, start_after=state.last, delimiter=False)
            state.done = not page.truncated
            return page.objects if page.objects or page.truncated else None
        # A failed page restarts the listing after the last key already yielded.
        if state.stream is None:
            stream = native().functions.list(
                self._client(), prefix.strip("/") or None, offset=state.last, chunk_size=_LIST_PAGE
            )
            state.stream = stream.__aiter__()
            if self._url.scheme == "s3":  # the orders ChunkOrder knows are S3's and a filer's
                state.order = ChunkOrder(self._where(prefix), prefix, state.last)
        try:
            chunk = await self._chunk(state)
        except ListingStalledError:
            raise
        except Exception as exc:
            state.stream = None
            state.raw = self._fallback(exc)
            return await self._next_page(state)
        if chunk is None:
            return None
        metas = [meta_of(m) for m in chunk]
        if state.order is not None:
            try:
                state.order.check([m.key for m in metas])
            except ListingStalledError:
                await self._explain(prefix, state.last)
                raise
        return metas

    async def _chunk(self, state: _Pages) -> list[Any] | None:
        stream = state.stream

        async def one() -> list[Any] | None:
            try:
                chunk: list[Any] = await stream.__anext__()
            except StopAsyncIteration:
                return None
            return chunk

        if not self._watch:
            return await one()
        return await watched(
            one(),
            probe=lambda: self._probe(state.prefix, state.last),
            deadline_s=CHUNK_DEADLINE_TIMEOUTS * self._options.timeout_s,
            where=self._where(state.prefix),
        )

    async def level(self, prefix: str) -> Listing:
        """One level under ``prefix`` (see the module docstring)."""

        async def obstore_level() -> Listing:
            raw = await native().functions.list_with_delimiter_async(
                self._client(), prefix.strip("/") or None
            )
            return Listing(
                prefixes=[p.rstrip("/") for p in raw["common_prefixes"]],
                objects=[meta_of(m) for m in raw["objects"]],
            )

        async def raw_level() -> Listing | None:
            rooted = self.rooted()
            return None if rooted is None else await rooted.level(prefix)

        async def attempt() -> Listing:
            try:
                if not self._watch:
                    return await obstore_level()
                return await watched(
                    obstore_level(),
                    probe=raw_level,
                    deadline_s=LEVEL_DEADLINE_TIMEOUTS * self._options.timeout_s,
                    where=self._where(prefix),
                )
            except ListingStalledError:
                raise
            except Exception as exc:
                return await self._fallback(exc).level(prefix)

        listing: Listing = await self._request(prefix, attempt)
        return listing


class _Pages:
    """Where one listing of keys stands."""

    __slots__ = ("done", "last", "order", "prefix", "raw", "stream")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.last: str | None = None  # the last key yielded
        self.stream: Any = None  # obstore's chunks, until a page fails
        self.order: ChunkOrder | None = None  # None: chunks not checked (not S3)
        self.raw: RootedLister | None = None  # once obstore refused a page
        self.done = False  # the raw listing's last page was read
