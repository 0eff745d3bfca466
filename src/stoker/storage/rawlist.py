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
"""

from __future__ import annotations

import asyncio
import datetime
import http.client
import ssl
import urllib.parse
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field, replace
from typing import Any

from stoker.storage.base import Listing, ObjectMeta
from stoker.storage.sigv4 import sigv4_headers

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_MAX_BODY = 64 << 20  # a listing page of 1000 keys is well under 1 MB


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


@dataclass(frozen=True, slots=True)
class RawPage:
    """One page of a listing: objects, common prefixes, and the last key it held."""

    objects: list[ObjectMeta]
    prefixes: list[str]
    last: str | None
    truncated: bool
    token: str | None


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
        body = self._get(query)
        return _parse(body)

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
        try:
            connection.request("GET", f"{path}?{canonical_query}", headers=headers)
            response = connection.getresponse()
            body = response.read(_MAX_BODY + 1)
        finally:
            connection.close()
        if response.status != 200:
            # The words retry.classify and remote's error mapping read.
            raise OSError(f"raw listing: status code: {response.status}: {body[:2000]!r}")
        if len(body) > _MAX_BODY:
            raise OSError(f"raw listing: a page of more than {_MAX_BODY} bytes")
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
    return urllib.parse.quote(text, safe="-_.~")


def _text(element: ElementTree.Element, name: str) -> str | None:
    found = element.find(f"{_NS}{name}")
    if found is None:
        found = element.find(name)
    return found.text if found is not None else None


def _key(text: str | None, *, encoded: bool) -> str:
    if not encoded:  # the server ignored encoding-type=url
        return text or ""
    # encoding-type=url: S3 writes a space as '+' and a '+' as %2B.
    return urllib.parse.unquote_plus(text or "", errors="surrogateescape")


def _parse(body: bytes) -> RawPage:
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        # A listing never declares a DTD: refusing one leaves no entity to expand.
        raise OSError("raw listing: an answer with a DTD is refused")
    try:
        root = ElementTree.fromstring(body)  # noqa: S314  # no DTD, so no entities (above)
    except ElementTree.ParseError as exc:
        raise OSError(f"raw listing: not a ListObjectsV2 answer: {exc}") from None
    encoded = (_text(root, "EncodingType") or "").lower() == "url"
    objects: list[ObjectMeta] = []
    for item in [*root.findall(f"{_NS}Contents"), *root.findall("Contents")]:
        stamp = _text(item, "LastModified")
        etag = _text(item, "ETag")
        objects.append(
            ObjectMeta(
                key=_key(_text(item, "Key"), encoded=encoded),
                size=int(_text(item, "Size") or 0),
                etag=etag.strip('"') if etag else None,
                last_modified=_when(stamp),
            )
        )
    prefixes = [
        _key(_text(item, "Prefix"), encoded=encoded)
        for item in [*root.findall(f"{_NS}CommonPrefixes"), *root.findall("CommonPrefixes")]
    ]
    keys = [meta.key for meta in objects] + prefixes
    return RawPage(
        objects=objects,
        prefixes=prefixes,
        last=max(keys) if keys else None,
        truncated=(_text(root, "IsTruncated") or "").lower() == "true",
        token=_text(root, "NextContinuationToken"),
    )


def _when(stamp: str | None) -> datetime.datetime | None:
    if not stamp:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class RootedLister:
    """A :class:`RawLister` for a store rooted at ``root`` (its prefix in the bucket): keys
    and prefixes in and out are relative to the root, as the store's own are."""

    lister: RawLister
    root: str

    def _full(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    async def page(
        self, prefix: str, *, start_after: str | None, delimiter: bool, token: str | None = None
    ) -> RawPage:
        """One page under ``prefix`` (a folder of the store) after ``start_after``."""
        folder = self._full(prefix.strip("/")) if prefix.strip("/") else self.root
        full = f"{folder}/" if folder else ""
        after = self._full(start_after) if start_after is not None else None
        page = await asyncio.to_thread(
            self.lister.page, full, start_after=after, delimiter=delimiter, token=token
        )
        cut = len(self.root) + 1 if self.root else 0
        return replace(
            page,
            objects=[replace(meta, key=meta.key[cut:]) for meta in page.objects],
            prefixes=[p[cut:].rstrip("/") for p in page.prefixes],
            last=page.last[cut:] if page.last is not None else None,
        )

    async def level(self, prefix: str) -> Listing:
        """One level (delimiter ``/``) under ``prefix``, every page of it."""
        listing = Listing(prefixes=[], objects=[])
        token: str | None = None
        while True:
            page = await self.page(prefix, start_after=None, delimiter=True, token=token)
            listing.prefixes.extend(page.prefixes)
            listing.objects.extend(page.objects)
            if not page.truncated or not page.token:
                return listing
            token = page.token
