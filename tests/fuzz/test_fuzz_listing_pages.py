"""Fuzzing listing pages: whatever a server answers, the fallback listing ends and says why.

The page parser (storage/listpage.py) gets random bytes, S3 pages with random bytes changed,
inserted or cut, and pages built from hostile pieces (keys, sizes, tokens, dates, DTDs, XML
declarations) in several encodings. It returns a sane page or raises StorageError, never
anything else; a body with a DTD, or not in UTF-8, never parses.

The pager is fuzzed through a real store: a loopback `ListingServer` answers the fallback
listing with a random script of pages (repeating the last one forever), and a recursive and a
one-level listing each end, listing or raising StorageError, within a bounded number of
requests.
"""

from __future__ import annotations

import datetime
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.errors import StokerError, StorageError
from stoker.storage import open_store
from stoker.storage.listpage import RawPage, key_bytes, parse_page
from stoker.testing.listing import ListingServer, listing_page

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

NS = "http://s3.amazonaws.com/doc/2006-03-01/"

hostile_text = st.one_of(
    st.sampled_from(["", " ", "a", "p/a", "..", "%FF%FE", "%00", "+", "%2B", "&amp;", "&lt;"]),
    st.text(max_size=12),
)
sizes = st.one_of(
    st.integers(min_value=0, max_value=2**40).map(str),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["", " 7 ", "+3", "1_000", "1e3", "0x10", "٣", "NaN", "-0"]),
    st.text(max_size=6),
)
dates = st.one_of(
    st.just("2024-01-01T00:00:00.000Z"),
    st.sampled_from(["", "9999-99-99", "x"]),
    st.text(max_size=8),
)
tokens = st.one_of(st.none(), st.sampled_from(["", " ", "t1", "t2"]), st.text(max_size=8))


def _escape(text: str, raw: bool) -> str:
    return text if raw else text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@st.composite
def built_pages(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A page body from hostile pieces, and whether it carries a DTD."""
    raw = draw(st.booleans())  # leave markup characters unescaped (often not XML then)
    entries = draw(
        st.lists(
            st.tuples(hostile_text, st.one_of(st.none(), sizes), dates, hostile_text), max_size=4
        )
    )
    contents = "".join(
        "<Contents>"
        f"<Key>{_escape(key, raw)}</Key>"
        + ("" if size is None else f"<Size>{_escape(size, raw)}</Size>")
        + f"<LastModified>{_escape(date, raw)}</LastModified><ETag>{_escape(etag, raw)}</ETag>"
        "</Contents>"
        for key, size, date, etag in entries
    )
    prefixes = "".join(
        f"<CommonPrefixes><Prefix>{_escape(p, raw)}</Prefix></CommonPrefixes>"
        for p in draw(st.lists(hostile_text, max_size=2))
    )
    token = draw(tokens)
    truncated = draw(st.sampled_from(["true", "false", "TRUE", "", "yes"]))
    encoding_type = draw(st.sampled_from(["url", "URL", "", None]))
    dtd = draw(
        st.sampled_from(
            [
                "",
                "",
                "",
                '<!DOCTYPE ListBucketResult [<!ENTITY e "p/secret">]>',
                "<!DOCTYPE ListBucketResult>",
                '<!DOCTYPE r SYSTEM "file:///etc/passwd">',
            ]
        )
    )
    if dtd and draw(st.booleans()):
        contents += "<Contents><Key>&e;</Key><Size>1</Size></Contents>"
    declared = draw(
        st.sampled_from(["UTF-8", "utf-8", None, None, "UTF-16", "ISO-8859-1", "ascii"])
    )
    declaration = "" if declared is None else f'<?xml version="1.0" encoding="{declared}"?>'
    text = (
        f'{declaration}{dtd}<ListBucketResult xmlns="{NS}">'
        f"<IsTruncated>{truncated}</IsTruncated>"
        + (
            ""
            if token is None
            else f"<NextContinuationToken>{_escape(token, raw)}</NextContinuationToken>"
        )
        + ("" if encoding_type is None else f"<EncodingType>{encoding_type}</EncodingType>")
        + f"{contents}{prefixes}</ListBucketResult>"
    )
    codec = draw(
        st.sampled_from(["utf-8"] * 4 + ["utf-8-sig", "utf-16", "utf-16-be", "utf-32", "latin-1"])
    )
    return text.encode(codec, errors="xmlcharrefreplace"), bool(dtd)


@st.composite
def mutated_pages(draw: st.DrawFn) -> bytes:
    """A sound S3 page with a few bytes changed, inserted or cut."""
    keys = draw(st.lists(st.text(min_size=1, max_size=6), max_size=4))
    body = bytearray(
        listing_page(
            [f"p/{k}" for k in keys],
            truncated=draw(st.booleans()),
            token=draw(st.sampled_from([None, "t1"])),
        )
    )
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(body)))
        what = draw(st.sampled_from(["flip", "insert", "cut"]))
        if what == "flip" and at < len(body):
            body[at] = draw(st.integers(0, 255))
        elif what == "insert":
            body[at:at] = draw(
                st.one_of(
                    st.binary(min_size=1, max_size=8),
                    st.text(min_size=1, max_size=8).map(str.encode),
                )
            )
        else:
            body[at : at + draw(st.integers(1, 16))] = b""
    return bytes(body)


def _check_sane(page: RawPage) -> None:
    for meta in page.objects:
        assert isinstance(meta.key, str)
        assert isinstance(meta.size, int)
        assert 0 <= meta.size < 2**63
        assert meta.etag is None or isinstance(meta.etag, str)
        assert meta.last_modified is None or isinstance(meta.last_modified, datetime.datetime)
    assert all(isinstance(p, str) for p in page.prefixes)
    keys = page.keys
    assert page.last == (max(keys, key=key_bytes) if keys else None)
    assert isinstance(page.truncated, bool)
    assert page.token is None or (isinstance(page.token, str) and page.token.strip())


def _parse_or_refuse(body: bytes) -> RawPage | None:
    try:
        page = parse_page(body)
    except (StorageError, ValueError):
        return None
    _check_sane(page)
    return page


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in body


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_parse_or_are_refused(body: bytes) -> None:
    _parse_or_refuse(body)


@FUZZ
@given(mutated_pages())
def test_damaged_pages_parse_or_are_refused(body: bytes) -> None:
    _parse_or_refuse(body)


@FUZZ
@given(built_pages())
def test_built_pages_parse_or_are_refused_and_no_dtd_or_other_encoding_passes(
    built: tuple[bytes, bool],
) -> None:
    body, has_dtd = built
    page = _parse_or_refuse(body)
    if page is not None:
        assert not has_dtd
        assert _is_utf8(body.removeprefix(b"\xef\xbb\xbf"))
        assert all("secret" not in k for k in page.keys)


# -- the pager ------------------------------------------------------------------------------

KEYS = ["p/a", "p/b", "p/b/c", "p/c", "p/d", "p/z", "p/", "other/x", "p/a b", "p/é"]


@st.composite
def scripted_page(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([b"", b"<x/>", b"not xml", listing_page([("p/a", "-1")])]))
    keys = draw(st.lists(st.sampled_from(KEYS), max_size=4))
    if draw(st.booleans()):
        keys = sorted(keys)
    body = listing_page(
        keys,
        truncated=draw(st.booleans()),
        token=draw(st.sampled_from([None, "t1", "t2", "t3"])),
        prefixes=draw(st.lists(st.sampled_from(["p/b/", "p/c/", "p/q/"]), max_size=2)),
    )
    if draw(st.integers(0, 9)) == 0:  # a key that is not UTF-8
        body = body.replace(b"<Key>p/", b"<Key>p/%FF", 1)
    return body


@pytest.fixture(scope="module")
def server() -> Iterator[ListingServer]:
    with ListingServer([listing_page([])], max_requests=1000) as running:
        yield running


def _options(endpoint: str) -> dict[str, Any]:
    return {
        "endpoint_url": endpoint,
        "access_key_id": "fuzz-key",
        "secret_access_key": "fuzz-secret",
        "region": "us-east-1",
        "retry": {"max_attempts": 1},
        "timeout_s": 10.0,
    }


@FUZZ
@given(st.lists(scripted_page(), min_size=1, max_size=6))
def test_no_script_of_pages_makes_the_lister_ask_forever(
    server: ListingServer, pages: list[bytes]
) -> None:
    """Each listing asks at most once per scripted page, plus twice for the last one
    repeated (once to read it, once to find that it repeats)."""
    store = open_store("s3://bucket/p", storage_options=_options(server.endpoint))
    bound = len(pages) + 2
    for listing in ("recursive", "level"):
        server.script(pages)
        try:
            if listing == "recursive":
                for _ in store.list():
                    pass
            else:
                store.list_dir("")
        except StokerError:
            pass
        assert len(server.queries) <= bound, f"{listing}: {len(server.queries)} requests"


def test_the_pager_fuzzer_sees_listings_end_both_ways(server: ListingServer) -> None:
    """The property above is not vacuous: a sound script lists, a looping one raises."""
    store = open_store("s3://bucket/p", storage_options=_options(server.endpoint))
    server.script([listing_page(["p/a"], truncated=True, token="t1"), listing_page(["p/b"])])
    assert [m.key for m in store.list()] == ["a", "b"]
    server.script([listing_page(["p/a"], truncated=True, token="t1")])
    with pytest.raises(StorageError, match="sent back a continuation token"):
        store.list_dir("")
    assert len(server.queries) == 2
    assert urllib.parse.unquote("p%2F") == "p/"  # the prefix the fallback asks for
