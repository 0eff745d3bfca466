"""One ListObjectsV2 answer, read with suspicion: the page parser of the fallback listing.

The answer comes from a server that may be hostile or broken (:mod:`stoker.storage.rawlist`
reads it when obstore refused the listing). S3 writes its answers in UTF-8 and never with a
DTD, so anything else is refused before it reaches the XML parser: a body that is not UTF-8
(a UTF-16 or UTF-32 one, which would hide a ``<!DOCTYPE`` from a byte search, included), one
that declares another encoding, and one with a DTD (whose entities could be expanded into
keys); the parser refuses a DTD again, whatever it finds. A ``Size`` that is not a
non-negative decimal integer is refused naming its key. Keys come URL-decoded
(``encoding-type=url``): bytes that are not UTF-8 stay as lone surrogates (``surrogateescape``),
so that the key is listed and named as unusable rather than ending the listing.
"""

from __future__ import annotations

import datetime
import re
import urllib.parse
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

from stoker.errors import StorageError
from stoker.storage.base import ObjectMeta
from stoker.storage.listguard import key_bytes

__all__ = ["RawPage", "key_bytes", "parse_page"]

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_UTF8_BOM = b"\xef\xbb\xbf"
_DECLARED = re.compile(rb"<\?xml[^>]*?encoding\s*=\s*[\"']([^\"']*)[\"']")
_SIZE = re.compile(r"[0-9]{1,19}")
_MAX_SIZE = 2**63 - 1


@dataclass(frozen=True, slots=True)
class RawPage:
    """One page of a listing: objects, common prefixes, and the last key it held."""

    objects: list[ObjectMeta]
    prefixes: list[str]
    last: str | None
    truncated: bool
    token: str | None

    @property
    def keys(self) -> list[str]:
        """The page's object keys and common prefixes."""
        return [meta.key for meta in self.objects] + self.prefixes


class _RefuseDoctype(ElementTree.TreeBuilder):
    def doctype(self, name: str, pubid: str | None, system: str | None) -> None:
        raise StorageError("raw listing: an answer with a DTD is refused")


def parse_page(body: bytes) -> RawPage:
    """Read a ListObjectsV2 answer.

    Raises:
        StorageError: The body is not a ListObjectsV2 answer in UTF-8 without a DTD, or an
            entry is malformed (the message names its key and what it holds).
    """
    _check_encoding(body)
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        # A listing never declares a DTD: refusing one leaves no entity to expand.
        raise StorageError("raw listing: an answer with a DTD is refused")
    try:
        # UTF-8 only, and a DTD is refused twice: by the bytes above and by the parser.
        parser = ElementTree.XMLParser(target=_RefuseDoctype())  # noqa: S314
        root = ElementTree.fromstring(body, parser)  # noqa: S314
    except ElementTree.ParseError as exc:
        raise StorageError(f"raw listing: not a ListObjectsV2 answer: {exc}") from None
    encoded = (_text(root, "EncodingType") or "").strip().lower() == "url"
    objects: list[ObjectMeta] = []
    for item in _all(root, "Contents"):
        key_text = _text(item, "Key")
        if key_text is None:
            raise StorageError("raw listing: an object entry without a Key")
        key = _key(key_text, encoded=encoded)
        etag = _text(item, "ETag")
        objects.append(
            ObjectMeta(
                key=key,
                size=_size(key, _text(item, "Size")),
                etag=etag.strip().strip('"') if etag else None,
                last_modified=_when(_text(item, "LastModified")),
            )
        )
    prefixes = [
        _key(_text(item, "Prefix") or "", encoded=encoded) for item in _all(root, "CommonPrefixes")
    ]
    keys = [meta.key for meta in objects] + prefixes
    token = (_text(root, "NextContinuationToken") or "").strip()
    return RawPage(
        objects=objects,
        prefixes=prefixes,
        last=max(keys, key=key_bytes) if keys else None,
        truncated=(_text(root, "IsTruncated") or "").strip().lower() == "true",
        token=token or None,
    )


def _check_encoding(body: bytes) -> None:
    # S3 answers in UTF-8. Another encoding could spell '<!DOCTYPE' in other bytes (UTF-16
    # puts a NUL after each ASCII letter), so only UTF-8 reaches the parser.
    text = body.removeprefix(_UTF8_BOM)
    if b"\x00" in text:
        raise StorageError("raw listing: the answer is not UTF-8 (it holds NUL bytes: UTF-16?)")
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StorageError(f"raw listing: the answer is not UTF-8 (byte {exc.start})") from None
    declared = _DECLARED.match(text.lstrip())
    if declared and declared.group(1).lower() not in (b"utf-8", b"utf8"):
        name = declared.group(1)[:40].decode("ascii", "replace")
        raise StorageError(f"raw listing: the answer declares encoding {name!r}, not UTF-8")


def _all(root: ElementTree.Element, name: str) -> list[ElementTree.Element]:
    return [*root.findall(f"{_NS}{name}"), *root.findall(name)]


def _text(element: ElementTree.Element, name: str) -> str | None:
    found = element.find(f"{_NS}{name}")
    if found is None:
        found = element.find(name)
    return (found.text or "") if found is not None else None  # empty, or missing


def _key(text: str | None, *, encoded: bool) -> str:
    if not encoded:  # the server ignored encoding-type=url
        return text or ""
    # encoding-type=url: S3 writes a space as '+' and a '+' as %2B.
    return urllib.parse.unquote_plus(text or "", errors="surrogateescape")


def _size(key: str, text: str | None) -> int:
    value = (text or "").strip()
    if not _SIZE.fullmatch(value) or int(value) > _MAX_SIZE:
        found = "no Size" if text is None else f"Size {text[:40]!r}"
        raise StorageError(
            f"raw listing: object {key[:200]!r} has {found}, not a byte count (a "
            f"non-negative integer)"
        )
    return int(value)


def _when(stamp: str | None) -> datetime.datetime | None:
    if not stamp:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.strip().replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        return None
