"""S3 listings that obstore refuses: one hostile key must not hide the rest of a bucket.

obstore parses every key of a listing page into its own path type and refuses the whole
page when one key does not parse (a newline or another control character, a ``..`` or ``.``
segment, an empty segment). :class:`RawLister` then reads the same ListObjectsV2 pages
itself, signed with the store's own credentials (AWS Signature V4), with the keys
URL-encoded by the server (``encoding-type=url``, so any byte survives the XML) and returns
every key as it is; the caller names the ones it cannot use as failures.

It needs the credentials in the store's configuration (keys given, from the environment or
a profile) or an anonymous store; with credentials that only obstore can resolve (instance
metadata, web identity) it is not available and the listing error names the key instead.

The server is not trusted to page sensibly. One request, connection to last byte, is cut at
``timeout_s`` however slowly the bytes come. A listing that makes no progress (a
continuation token sent back, keys not past ``start-after`` or the previous page, a
truncated page with no keys and nothing to go on, a key outside the prefix) ends with a
:class:`~stoker.errors.StorageError` naming the bucket, the prefix and what the server did,
instead of asking again forever (a :class:`~stoker.errors.ListingStalledError`).
:meth:`RootedLister.probe` reads the first pages of a listing only to check them: how
:mod:`stoker.storage.listguard` finds out what a server does when obstore's listing of it
does not move on. Pages are parsed by :mod:`stoker.storage.listpage`.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field, replace
from typing import Any

from stoker.errors import ListingStalledError
from stoker.storage.base import Listing, ObjectMeta
from stoker.storage.listguard import KeyOrders, key_bytes, short, stalled
from stoker.storage.listpage import RawPage, parse_page
from stoker.storage.sigv4 import sigv4_headers

__all__ = ["RawLister", "RawPage", "RootedLister", "invalid_key_in"]

_MAX_BODY = 64 << 20  # a listing page of 1000 keys is well under 1 MB
#: Truncated pages with no keys in a row, each with a new token, before the listing gives up.
MAX_EMPTY_PAGES = 100


def invalid_key_in(exc: BaseException) -> str | None:
    """The key named by obstore's refusal of a listing page, or None for other errors."""
    text = str(exc)
    marker = 'Encountered object with invalid path: Error parsing Path "'
    start = text.find(marker)
    if start < 0:
        return None
    start += len(marker)
    end = text.find('": ', start)
    return text[start:end] if end > start else text[start : start + 200]


@dataclass(frozen=True, slots=True, kw_only=True)
class RawLister:
    """Signed ListObjectsV2 requests for one bucket; blocking (run it in a thread).

    Build one with :meth:`for_store`. Keys and prefixes are full keys in the bucket.
    """

    endpoint: str
    bucket: str
    region: str
    access_key_id: str | None
    secret_access_key: str | None = field(repr=False)  # never shown
    session_token: str | None = field(repr=False)
    virtual_hosted: bool
    verify_ssl: bool
    timeout_s: float
    max_keys: int = 1000

    @classmethod
    def for_store(cls, native: Any, *, timeout_s: float) -> RawLister | None:
        """A lister with the credentials of obstore's ``S3Store``, or None if it has none
        we can sign with (or is not an S3 store)."""
        config = getattr(native, "config", None)
        if not isinstance(config, dict) or "bucket" not in config:
            return None
        anonymous = str(config.get("skip_signature", "")).lower() in ("true", "1")
        if not anonymous and not config.get("secret_access_key"):
            return None
        region = str(config.get("region") or "us-east-1")
        options = getattr(native, "client_options", None) or {}
        insecure = str(options.get("allow_invalid_certificates", "")).lower() == "true"
        return cls(
            endpoint=str(config.get("endpoint") or f"https://s3.{region}.amazonaws.com"),
            bucket=str(config["bucket"]),
            region=region,
            access_key_id=None if anonymous else str(config.get("access_key_id", "")),
            secret_access_key=None if anonymous else str(config["secret_access_key"]),
            session_token=None if anonymous else config.get("session_token"),
            virtual_hosted=str(config.get("virtual_hosted_style_request", "")).lower() == "true",
            verify_ssl=not insecure,
            timeout_s=timeout_s,
        )

    def page(
        self, prefix: str, *, start_after: str | None, delimiter: bool, token: str | None = None
    ) -> RawPage:
        """One page (up to ``max_keys``) of the keys under ``prefix`` after ``start_after``."""
        query = {
            "list-type": "2",
            "encoding-type": "url",
            "prefix": prefix,
            "max-keys": str(self.max_keys),
        }
        if delimiter:
            query["delimiter"] = "/"
        if token:
            query["continuation-token"] = token
        elif start_after:
            query["start-after"] = start_after
        return parse_page(self._get(query))

    def _get(self, query: dict[str, str]) -> bytes:
        url = urllib.parse.urlsplit(self.endpoint)
        host = url.netloc
        path = "/"
        if self.virtual_hosted:
            host = f"{self.bucket}.{host}"
        else:
            path = f"{url.path.rstrip('/')}/{_quote(self.bucket)}"
        canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))
        headers = self._sign(host, path, canonical_query)
        if url.scheme == "https":
            context = ssl.create_default_context()
            if not self.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, timeout=self.timeout_s, context=context
            )
        else:
            connection = http.client.HTTPConnection(host, timeout=self.timeout_s)
        # The socket's timeout bounds each read; this bounds the whole request, so a server
        # that sends a byte now and then cannot hold the listing past timeout_s.
        expired = threading.Event()
        timer = threading.Timer(self.timeout_s, _cut, (connection, expired))
        timer.daemon = True
        timer.start()
        try:
            connection.connect()
            if expired.is_set():
                raise TimeoutError
            connection.request("GET", f"{path}?{canonical_query}", headers=headers)
            response = connection.getresponse()
            body = response.read(_MAX_BODY + 1)
            if expired.is_set():
                raise TimeoutError
            if len(body) > _MAX_BODY:
                raise OSError(f"raw listing: a page of more than {_MAX_BODY} bytes")
            if response.length:  # what Content-Length announced did not all come
                raise http.client.IncompleteRead(body, response.length)
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set():
                raise TimeoutError(
                    f"raw listing: no complete answer within timeout_s={self.timeout_s:g}"
                ) from None
            if isinstance(exc, OSError):
                raise
            # The words retry.classify reads: a connection broken mid-answer is retried.
            raise ConnectionError(f"raw listing: connection reset mid-answer: {exc!r}") from None
        finally:
            timer.cancel()
            connection.close()
        if response.status != 200:
            # The words retry.classify and remote's error mapping read, and the server's
            # Retry-After, which retry.retry_after_s reads (obstore's errors lack it).
            after = response.getheader("Retry-After")
            wait = f" (Retry-After: {after.strip()})" if after and after.strip() else ""
            raise OSError(f"raw listing: status code: {response.status}{wait}: {body[:2000]!r}")
        return body

    def _sign(self, host: str, path: str, canonical_query: str) -> dict[str, str]:
        return sigv4_headers(
            "GET",
            host,
            path,
            canonical_query,
            access_key=self.access_key_id,
            secret_key=self.secret_access_key,
            region=self.region,
            session_token=self.session_token,
        )


def _quote(text: str) -> str:
    # A key's own bytes: one that is not UTF-8 came back as lone surrogates (listpage).
    return urllib.parse.quote(key_bytes(text), safe="-_.~")


def _cut(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    # Past the deadline: wake the reading thread (its recv returns at once) and say why.
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)


class _Progress:
    """Checks that the pages of one listing move on, and says what the server did if not."""

    def __init__(self, lister: RawLister, prefix: str, start_after: str | None) -> None:
        self._where = f"s3://{lister.bucket}/{prefix}"
        self._prefix = prefix
        self._after = key_bytes(start_after) if start_after is not None else None
        self._start_after = start_after
        self._orders = KeyOrders(self._after)  # S3's, or a filer's (SeaweedFS)
        self._tokens: set[str] = set()
        self._empty = 0

    def _fail(self, what: str) -> ListingStalledError:
        return stalled(self._where, what)

    def check(self, page: RawPage, *, sent: str | None, needs_token: bool) -> None:
        """Raise StorageError if ``page`` (the answer to ``sent``) makes no progress; a
        truncated page must carry a token when ``needs_token`` or it has no keys."""
        if sent is not None:
            if page.truncated and page.token in (self._tokens | {sent}):
                raise self._fail(
                    f"sent back a continuation token it had sent before ({short(page.token)})"
                )
            self._tokens.add(sent)
        keys = page.keys
        outside = next((k for k in keys if not k.startswith(self._prefix)), None)
        if outside is not None:
            raise self._fail(f"listed {short(outside)}, which is not under the prefix")
        if keys:
            order = [key_bytes(k) for k in keys]
            if self._after is not None and not self._orders.past(order, self._after):
                early = keys[order.index(min(order))]
                raise self._fail(
                    f"ignored start-after: after {short(self._start_after)} it listed "
                    f"{short(early)}"
                )
            if not self._orders.advance(order):
                raise self._fail(f"listed no key past {short(page.last)} on the next page")
            self._empty = 0
        elif page.truncated:
            self._empty += 1
            if self._empty > MAX_EMPTY_PAGES:
                raise self._fail(f"sent {self._empty} truncated pages in a row with no keys")
        if page.truncated and (needs_token or not keys) and not page.token:
            raise self._fail(
                "said the listing is truncated but sent no continuation token"
                + ("" if keys else " and no keys")
            )


def _last(objects: list[ObjectMeta]) -> str | None:
    return max((meta.key for meta in objects), key=key_bytes, default=None)


@dataclass(frozen=True, slots=True)
class RootedLister:
    """A :class:`RawLister` for a store rooted at ``root`` (its prefix in the bucket): keys
    and prefixes in and out are relative to the root, as the store's own are.

    A listing that makes no progress raises :class:`~stoker.errors.StorageError` (see the
    module docstring)."""

    lister: RawLister
    root: str

    def _full(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _folder(self, prefix: str) -> str:
        folder = self._full(prefix.strip("/")) if prefix.strip("/") else self.root
        return f"{folder}/" if folder else ""

    async def _fetch(
        self, full: str, after: str | None, delimiter: bool, token: str | None
    ) -> RawPage:
        return await asyncio.to_thread(
            self.lister.page, full, start_after=after, delimiter=delimiter, token=token
        )

    def _relative(self, page: RawPage) -> RawPage:
        cut = len(self.root) + 1 if self.root else 0
        return replace(
            page,
            objects=[replace(meta, key=meta.key[cut:]) for meta in page.objects],
            prefixes=[p[cut:].rstrip("/") for p in page.prefixes],
            last=page.last[cut:] if page.last is not None else None,
        )

    async def page(
        self, prefix: str, *, start_after: str | None, delimiter: bool, token: str | None = None
    ) -> RawPage:
        """The next page under ``prefix`` (a folder of the store) after ``start_after``
        that holds keys, or the last one: truncated pages with no keys are read past by
        their continuation tokens."""
        full = self._folder(prefix)
        after = self._full(start_after) if start_after is not None else None
        progress = _Progress(self.lister, full, after)
        while True:
            page = await self._fetch(full, after, delimiter, token)
            if not delimiter:  # no common prefixes without one: keys only move a listing on
                page = replace(page, prefixes=[], last=_last(page.objects))
            progress.check(page, sent=token, needs_token=False)
            if page.keys or not page.truncated:
                return self._relative(page)
            token = page.token

    async def probe(self, prefix: str, *, start_after: str | None, delimiter: bool) -> None:
        """Read the first pages of a listing by their tokens, only to check them: raise
        :class:`~stoker.errors.ListingStalledError` where the listing itself
        would (see the module docstring); return once two pages with keys moved on, the
        listing ended, or a page gave no token to follow. At most ``MAX_EMPTY_PAGES + 2``
        requests; nothing is kept but what the checks need."""
        full = self._folder(prefix)
        after = self._full(start_after) if start_after is not None else None
        progress = _Progress(self.lister, full, after)
        token: str | None = None
        moved = 0
        for _ in range(MAX_EMPTY_PAGES + 2):
            page = await self._fetch(full, after, delimiter, token)
            if not delimiter:
                page = replace(page, prefixes=[], last=_last(page.objects))
            progress.check(page, sent=token, needs_token=False)
            moved += bool(page.keys)
            if not page.truncated or not page.token or moved >= 2:
                return
            token = page.token

    async def level(self, prefix: str) -> Listing:
        """One level (delimiter ``/``) under ``prefix``, every page of it."""
        full = self._folder(prefix)
        progress = _Progress(self.lister, full, None)
        listing = Listing(prefixes=[], objects=[])
        token: str | None = None
        while True:
            page = await self._fetch(full, None, True, token)
            progress.check(page, sent=token, needs_token=True)
            relative = self._relative(page)
            listing.prefixes.extend(relative.prefixes)
            listing.objects.extend(relative.objects)
            if not page.truncated:
                return listing
            token = page.token
