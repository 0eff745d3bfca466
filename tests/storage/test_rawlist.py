"""The fallback listing against servers that misbehave (issue 22.8, 22.13).

A `ListingServer` on loopback answers obstore's own listing with a key obstore refuses, so
the store reads the listing itself (storage/rawlist.py), and answers that with scripted
pages: a continuation token sent back, ``start-after`` ignored, a truncated page with
nothing in it, a body that trickles in, a key that is not UTF-8, a UTF-16 body with a DTD,
sizes that are not sizes. Each ends in bounded time, with an error that names the listing
and what the server did, or lists what it can and names the rest.
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.errors import StorageError
from stoker.storage import open_store
from stoker.storage.listpage import parse_page
from stoker.storage.rawlist import MAX_EMPTY_PAGES
from stoker.testing.listing import Answer, ListingServer, listing_page


def _env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test-key",
        "AWS_SECRET_ACCESS_KEY": "test-secret",
        "AWS_REGION": "us-east-1",
    }


def _options(endpoint: str, **extra: Any) -> dict[str, Any]:
    return {
        "endpoint_url": endpoint,
        "access_key_id": "test-key",
        "secret_access_key": "test-secret",
        "region": "us-east-1",
        **extra,
    }


def _ls(server: ListingServer, *args: str) -> Any:
    return CliRunner(env=_env(server.endpoint)).invoke(cli, ["ls", *args, "s3://bucket/p"])


def test_a_server_that_ignores_start_after_ends_the_listing() -> None:
    first = listing_page(["p/a", "p/b"], truncated=True, token="t1")
    with ListingServer([first]) as server:  # every request gets the first page again
        result = _ls(server, "-r")
        asked = len(server.queries)
    assert result.exit_code == 1
    assert "listing s3://bucket/p/: the server ignored start-after" in result.output
    assert "after 'p/b' it listed 'p/a'" in result.output
    assert asked == 2


def test_a_truncated_page_with_nothing_to_go_on_ends_the_listing() -> None:
    with ListingServer([listing_page([], truncated=True)]) as server:
        result = _ls(server, "-r")
        asked = len(server.queries)
    assert result.exit_code == 1
    assert (
        "listing s3://bucket/p/: the server said the listing is truncated but sent no "
        "continuation token and no keys"
    ) in result.output
    assert asked == 1


def test_truncated_pages_with_no_keys_are_read_past_by_their_tokens() -> None:
    pages = [
        listing_page([], truncated=True, token="e1"),
        listing_page([], truncated=True, token="e2"),
        listing_page(["p/a"], truncated=True, token="t"),
        listing_page(["p/b"]),
    ]
    with ListingServer(pages) as server:
        keys = [
            m.key
            for m in open_store("s3://bucket/p", storage_options=_options(server.endpoint)).list()
        ]
        sent = [(q.get("continuation-token"), q.get("start-after")) for q in server.queries]
    assert keys == ["a", "b"]
    assert sent == [(None, None), ("e1", None), ("e2", None), (None, "p/a")]


def test_endless_empty_pages_end_the_listing() -> None:
    pages = [listing_page([], truncated=True, token=f"e{i}") for i in range(MAX_EMPTY_PAGES + 5)]
    with ListingServer(pages, max_requests=2 * MAX_EMPTY_PAGES) as server:
        store = open_store("s3://bucket/p", storage_options=_options(server.endpoint))
        with pytest.raises(
            StorageError, match=f"sent {MAX_EMPTY_PAGES + 1} truncated pages in a row"
        ):
            list(store.list())
        assert len(server.queries) == MAX_EMPTY_PAGES + 1


def test_a_continuation_token_sent_back_ends_a_one_level_listing() -> None:
    pages = [
        listing_page(["p/a"], truncated=True, token="t1"),
        listing_page(["p/b"], truncated=True, token="t1"),
    ]
    with ListingServer(pages) as server:
        result = _ls(server)
        asked = len(server.queries)
    assert result.exit_code == 1
    assert (
        "listing s3://bucket/p/: the server sent back a continuation token it had sent "
        "before ('t1')"
    ) in result.output
    assert asked == 2


def test_a_token_cycle_and_pages_that_do_not_advance_end_a_one_level_listing() -> None:
    cycle = [
        listing_page(["p/a"], truncated=True, token="t1"),
        listing_page(["p/b"], truncated=True, token="t2"),
        listing_page(["p/c"], truncated=True, token="t1"),
    ]
    same = [listing_page(["p/a"], truncated=True, token=f"t{i}") for i in range(50)]
    with ListingServer(cycle) as server:
        store = open_store("s3://bucket/p", storage_options=_options(server.endpoint))
        with pytest.raises(StorageError, match="sent back a continuation token it had sent before"):
            store.list_dir("")
        assert len(server.queries) == 3
        server.script(same)  # a fresh token each time, the same keys
        with pytest.raises(StorageError, match="listed no key past 'p/a' on the next page"):
            store.list_dir("")
        assert len(server.queries) == 2


def test_a_truncated_level_without_a_token_is_not_taken_as_complete() -> None:
    with ListingServer([listing_page(["p/a"], truncated=True)]) as server:
        store = open_store("s3://bucket/p", storage_options=_options(server.endpoint))
        with pytest.raises(StorageError, match="truncated but sent no continuation token"):
            store.list_dir("")


def test_a_key_outside_the_prefix_ends_the_listing() -> None:
    with ListingServer([listing_page(["other/x"])]) as server:
        store = open_store("s3://bucket/p", storage_options=_options(server.endpoint))
        with pytest.raises(StorageError, match="listed 'other/x', which is not under the prefix"):
            list(store.list())


def test_a_trickling_answer_fails_at_timeout_s() -> None:
    """A byte every 0.3 s never trips a per-read timeout of 1 s; the whole request still
    ends at timeout_s=1 (once: the policy allows one attempt)."""
    trickle = Answer(body=listing_page(["p/a"]), trickle_s=0.3)
    with ListingServer([trickle], trickle_for_s=20.0) as server:
        options = _options(server.endpoint, timeout_s=1.0, retry={"max_attempts": 1})
        store = open_store("s3://bucket/p", storage_options=options)
        # The trickle goes on for 20 s: the listing ending with this error ended it first.
        with pytest.raises(StorageError, match="timeout_s=1") as info:
            list(store.list())
    assert "no complete" in str(info.value)


def test_a_key_that_is_not_utf8_is_named_and_the_rest_listed() -> None:
    first = listing_page(["p/a"], truncated=True, token="t").replace(
        b"<Key>p/a</Key>", b"<Key>p/b%FF%FE</Key>"
    )
    with ListingServer([first, listing_page(["p/c"])]) as server:
        result = _ls(server, "-r")
        sent = [q.get("start-after") for q in server.queries]
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert any(line.endswith(" b\\udcff\\udcfe") for line in lines)
    assert any(line.endswith(" c") for line in lines)
    assert "stoker: failed: b\\udcff\\udcfe: unusable key (bytes that are not UTF-8)" in lines
    assert "1 keys cannot be read or downloaded; the others were listed" in result.output
    assert sent[1] == "p/b\ufffd\ufffd"  # the key's own bytes went back (FF FE: not UTF-8)


def test_a_utf16_body_with_a_dtd_is_refused() -> None:
    hostile = (
        '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE r [<!ENTITY e "secret">]>'
        "<ListBucketResult><IsTruncated>false</IsTruncated>"
        "<Contents><Key>&e;</Key><Size>1</Size></Contents></ListBucketResult>"
    )
    for body in (hostile.encode("utf-16"), hostile.encode("utf-16-be"), hostile.encode("utf-32")):
        with pytest.raises(StorageError, match="not UTF-8"):
            parse_page(body)
    declared = hostile.replace('<!DOCTYPE r [<!ENTITY e "secret">]>', "").replace("&e;", "k")
    with pytest.raises(StorageError, match="declares encoding 'UTF-16', not UTF-8"):
        parse_page(declared.encode())
    with pytest.raises(StorageError, match="DTD"):
        parse_page(hostile.replace("UTF-16", "UTF-8").encode())


@pytest.mark.parametrize(
    ("size", "found"),
    [("12abc", "Size '12abc'"), ("-5", "Size '-5'"), ("1e3", "Size '1e3'"), (None, "no Size")],
)
def test_a_size_that_is_not_a_byte_count_is_named(size: str | None, found: str) -> None:
    body = listing_page([("p/k", size or "")])
    if size is None:
        body = body.replace(b"<Size></Size>", b"")
    with pytest.raises(StorageError, match=f"object 'p/k' has {found}, not a byte count"):
        parse_page(body)


def test_a_size_is_read_through_the_cli_listing() -> None:
    with ListingServer([listing_page([("p/k", "-5")])]) as server:
        result = _ls(server, "-r")
    assert result.exit_code == 1
    assert "object 'p/k' has Size '-5', not a byte count" in result.output
