"""A server that pages LIST badly ends every listing with a named error (issue 32.1).

A `ListingServer` on loopback answers every listing, obstore's own included, with pages
that never end: the same continuation token again, new tokens over the same keys, or
truncated pages with no keys. Every command that lists (and the folder `Loader`) ends with
a `ListingStalledError` naming the listing and what the server did, well before the server
stops answering (its request cap: a listing that ran into it never stopped by itself, and
the cap bounds what a listing could have gathered in memory). Before, obstore followed the
tokens until the cap, and without one, for ever.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stoker import Loader
from stoker.cli.main import cli
from stoker.errors import ListingStalledError, StorageError
from stoker.storage import listguard, obstorelist, open_store
from stoker.storage.rawlist import RawLister, RootedLister
from stoker.testing.listing import ListingServer, Script, listing_page

# Requests the server answers; a listing that meets the cap never stopped itself. obstore
# pages a looping server at 1,000-3,000 LISTs a second while the probe reads its 102 pages
# one connection at a time, so on a loaded machine a listing that stops itself may have
# sent a few thousand (the empty pages failed at 3,000 in a full run beside other work).
CAP = 30_000


def _same_token(n: int, query: dict[str, str]) -> bytes:
    return listing_page(["p/a"], truncated=True, token="SAME")


def _new_tokens(n: int, query: dict[str, str]) -> bytes:
    return listing_page(["p/a"], truncated=True, token=f"t{n}")


def _empty_pages(n: int, query: dict[str, str]) -> bytes:
    return listing_page([], truncated=True, token=f"e{n}")


BEHAVIOURS: dict[str, tuple[Script, str]] = {
    "same-token": (_same_token, "the server (sent back a continuation token|listed 'a' again)"),
    "new-tokens": (_new_tokens, "the server (listed no key past|listed 'a' again)"),
    "empty-pages": (_empty_pages, "the server sent 101 truncated pages in a row with no keys"),
}

ENV = {
    "AWS_ACCESS_KEY_ID": "test-key",
    "AWS_SECRET_ACCESS_KEY": "test-secret",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture(params=sorted(BEHAVIOURS))
def server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(listguard, "PROBE_AFTER_S", 0.05)  # seconds here, not the default 1
    script, message = BEHAVIOURS[request.param]
    with ListingServer(script, bait=False, max_requests=CAP) as running:
        running.expected = message  # type: ignore[attr-defined]
        yield running


def _options(endpoint: str, **more: Any) -> dict[str, Any]:
    # ENV's credentials, as storage_options.
    return {
        "endpoint_url": endpoint,
        "access_key_id": "test-key",
        "secret_access_key": "test-secret",
        "region": "us-east-1",
        **more,
    }


def _command(name: str, tmp: Path) -> list[str]:
    src = tmp / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    url = "s3://bucket/p"
    return {
        "ls": ["ls", url],
        "ls -r": ["ls", "-r", url],
        "download": ["download", url, str(tmp / "dst")],
        "upload": ["upload", str(src), url],
        "pack": ["pack", url, str(tmp / "packed")],
        "index": ["index", url],
        "show": ["show", url, "--out", str(tmp / "grid.png")],
        "bench": ["bench", url, "--batches", "1"],
        "doctor": ["doctor", url],
    }[name]


def _check(server: Any, text: str) -> None:
    assert "listing s3://bucket/p/: " in text, text
    assert "RequestCapReached" not in text, text
    match = re.search(server.expected, text)
    assert match is not None, text
    assert len(server.queries) < CAP


@pytest.mark.parametrize(
    "command", ["ls", "ls -r", "download", "upload", "pack", "index", "show", "bench", "doctor"]
)
def test_a_command_ends_with_a_named_error(server: Any, command: str, tmp_path: Path) -> None:
    args = _command(command, tmp_path)
    result = CliRunner(env={**ENV, "AWS_ENDPOINT_URL": server.endpoint}).invoke(cli, args)
    assert result.exit_code not in (0, None), result.output
    _check(server, result.output)


def test_the_folder_loader_ends_with_a_named_error(server: Any) -> None:
    options = _options(server.endpoint)
    with pytest.raises(ListingStalledError) as info:
        Loader("s3://bucket/p", batch_size=2, storage_options=options)
    _check(server, str(info.value))


@pytest.mark.parametrize("level", [False, True], ids=["keys", "level"])
def test_without_a_probe_a_listing_ends_at_its_deadline(
    level: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the store cannot sign requests of its own (credentials only obstore resolves),
    nothing can say what the server does: the listing ends at its deadline, a few request
    timeouts."""
    monkeypatch.setattr(listguard, "PROBE_AFTER_S", 0.05)
    monkeypatch.setattr(RawLister, "for_store", classmethod(lambda cls, native, **kw: None))
    with ListingServer(_empty_pages, bait=False, max_requests=100_000) as running:
        options = _options(running.endpoint, timeout_s=0.2)
        store = open_store("s3://bucket/p", storage_options=options)
        with pytest.raises(ListingStalledError, match=r"sent no new keys within (0.4|1) s"):
            store.list_dir("") if level else list(store.list())
        assert "RequestCapReached" not in str(running.queries[-1:])


def test_a_chunk_out_of_order_is_named_when_no_probe_can_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(RawLister, "for_store", classmethod(lambda cls, native, **kw: None))
    page = listing_page([f"p/{i % 7:03d}" for i in range(1000)], truncated=True, token="t")
    with ListingServer([page], bait=False) as running:
        options = _options(running.endpoint)
        store = open_store("s3://bucket/p", storage_options=options)
        with pytest.raises(StorageError, match=r"listed '000' after '006', out of order"):
            list(store.list())
        assert len(running.queries) == 1


def test_a_listing_that_moves_on_slowly_is_listed_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A legitimate listing slower than the probe's delay is not taken for a loop."""
    monkeypatch.setattr(listguard, "PROBE_AFTER_S", 0.0)
    keys = [f"p/{i:04d}" for i in range(2000)] + ["p/9999", "p/sub/x"]

    def script(n: int, query: dict[str, str]) -> bytes:
        level = "delimiter" in query
        listed = [k for k in keys if not (level and k.startswith("p/sub/"))]
        token, after = query.get("continuation-token"), query.get("start-after")
        start = int(token) if token else sum(k <= after for k in listed) if after else 0
        more = start + 500 < len(listed)
        return listing_page(
            listed[start : start + 500],
            truncated=more,
            token=str(start + 500) if more else None,
            prefixes=["p/sub/"] if level and not more else (),
        )

    with ListingServer(script, bait=False) as running:
        options = _options(running.endpoint)
        store = open_store("s3://bucket/p", storage_options=options)
        listed = [m.key for m in store.list()]
        level = store.list_dir("")
    assert listed == [k.removeprefix("p/") for k in keys]
    assert [m.key for m in level.objects] == listed[:-1]
    assert level.prefixes == ["sub"]


def test_a_filer_listing_folder_by_folder_is_not_taken_for_a_loop(
    s3_bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SeaweedFS lists folder by folder ('data/b' before 'data#x/c'), not in S3's byte
    order: obstore's chunks of two keys, each probed, and the raw lister's pages of two
    keys (as a probe reads them) accept it."""
    monkeypatch.setattr(listguard, "PROBE_AFTER_S", 0.0)
    monkeypatch.setattr(obstorelist, "_LIST_PAGE", 2)
    store = s3_bucket.store("p")
    keys = ["data/a", "data/b", "data#x/c", "data.y", "data-z/d", "data/sub/e", "e"]
    for key in keys:
        store.put(key, b"x")
    listed = [m.key for m in store.list()]
    level = store.list_dir("")
    assert sorted(listed) == sorted(keys)
    assert listed != sorted(listed)  # the server's own order: folder by folder
    assert sorted(level.prefixes) == ["data", "data#x", "data-z"]
    assert sorted(m.key for m in level.objects) == ["data.y", "e"]

    lister = RawLister.for_store(s3_bucket.store()._native, timeout_s=5.0)
    assert lister is not None
    rooted = RootedLister(replace(lister, max_keys=2), "p")
    asyncio.run(rooted.probe("", start_after="data/b", delimiter=False))
    asyncio.run(rooted.probe("", start_after=None, delimiter=True))
    raw_level = asyncio.run(rooted.level(""))
    assert (raw_level.prefixes, raw_level.objects) == (level.prefixes, level.objects)
