"""One bad key must not stop a listing (issue 15.4).

S3 takes any bytes as a key; obstore refuses a whole listing page when one key does not
parse as its path (a newline, a ``..`` segment). The store then lists the rest itself, and
ls and download name that key as a failure while listing and downloading every other.
A key with a newline is put on the real SeaweedFS server directly; a ``..`` key, which
SeaweedFS refuses to store, is made by a relay that rewrites the server's listing.
"""

from __future__ import annotations

import asyncio
import http.client
import http.server
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.storage import open_store
from stoker.storage.rawlist import RawLister, RootedLister
from stoker.testing.sigv4 import signed_request


def _put_raw(s3_bucket, key_path: str, body: bytes) -> None:
    """PUT an object by its URL-encoded path, which obstore would refuse to send."""
    options = s3_bucket.options()
    status = signed_request(
        "PUT",
        "127.0.0.1",
        s3_bucket.server.port,
        f"/{s3_bucket.name}/{key_path}",
        access_key=options["access_key_id"],
        secret_key=options["secret_access_key"],
        region="us-east-1",
        body=body,
    )
    assert status == 200


def _env(options: dict[str, str], endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }


@pytest.fixture
def with_newline_key(s3_bucket) -> str:
    store = s3_bucket.store("p")
    for i in range(30):  # keys before and after the bad one, in one listing page
        store.put(f"a/{i:02d}.txt", f"a{i}".encode())
        store.put(f"z/{i:02d}.txt", f"z{i}".encode())
    _put_raw(s3_bucket, "p/m%0Akey.txt", b"bad")
    return f"{s3_bucket.url}/p"


def test_the_store_lists_past_a_key_obstore_refuses(s3_bucket, with_newline_key) -> None:
    store = s3_bucket.store("p")
    keys = [meta.key for meta in store.list()]
    assert keys == (
        [f"a/{i:02d}.txt" for i in range(30)]
        + ["m\nkey.txt"]
        + [f"z/{i:02d}.txt" for i in range(30)]
    )
    level = store.list_dir("")
    assert level.prefixes == ["a", "z"]
    assert [meta.key for meta in level.objects] == ["m\nkey.txt"]
    assert [meta.key for meta in store.list("a")][:2] == ["a/00.txt", "a/01.txt"]


def test_ls_and_download_name_the_key_and_do_the_rest(
    s3_bucket, with_newline_key, tmp_path: Path
) -> None:
    runner = CliRunner(env=_env(s3_bucket.options(), s3_bucket.options()["endpoint_url"]))
    listing = runner.invoke(cli, ["ls", "-r", with_newline_key])
    assert listing.exit_code == 1
    lines = listing.output.splitlines()
    assert sum(line.endswith(".txt") and "/" in line for line in lines) == 60
    assert any(line.endswith(" m\\nkey.txt") for line in lines)  # escaped: one line
    assert "stoker: failed: m\\nkey.txt: unusable key (control character '\\n')" in lines
    assert "1 keys cannot be read or downloaded; the others were listed" in listing.output

    done = runner.invoke(cli, ["download", with_newline_key, str(tmp_path / "out")])
    assert done.exit_code == 1
    assert "stoker: failed: m\\nkey.txt: object key 'm\\nkey.txt' cannot be" in done.output
    assert "1 of 61 files failed to download; rerun the same command" in done.output
    downloaded = sorted(
        p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.txt")
    )
    assert downloaded == [f"a/{i:02d}.txt" for i in range(30)] + [
        f"z/{i:02d}.txt" for i in range(30)
    ]
    assert (tmp_path / "out" / "z" / "29.txt").read_bytes() == b"z29"


class _Rewriter(http.server.BaseHTTPRequestHandler):
    """Forwards every request to the server; rewrites listing answers' keys."""

    protocol_version = "HTTP/1.1"
    upstream = ("127.0.0.1", 0)
    rewrite: tuple[bytes, bytes] = (b"", b"")

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        upstream = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                upstream.putheader(name, value)
            upstream.endheaders(body)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        if self.command == "GET" and "list-type=2" in self.path:
            data = data.replace(*self.rewrite)
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def rewriting_relay(s3_server) -> Iterator[str]:
    handler = type(
        "Relay",
        (_Rewriter,),
        {"upstream": ("127.0.0.1", s3_server.port), "rewrite": (b"p/m.txt", b"p/m/../x")},
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_listed_dot_dot_key_is_named_and_the_rest_downloaded(
    s3_bucket, rewriting_relay: str, tmp_path: Path
) -> None:
    store = s3_bucket.store("p")
    for key in ("a.txt", "m.txt", "z/c.txt"):
        store.put(key, key.encode())
    through = open_store(f"{s3_bucket.url}/p", storage_options=s3_bucket.options(rewriting_relay))
    assert [meta.key for meta in through.list()] == ["a.txt", "m/../x", "z/c.txt"]

    runner = CliRunner(env=_env(s3_bucket.options(), rewriting_relay))
    listing = runner.invoke(cli, ["ls", "-r", f"{s3_bucket.url}/p"])
    assert listing.exit_code == 1
    assert "stoker: failed: m/../x: unusable key ('..' segment)" in listing.output
    done = runner.invoke(cli, ["download", f"{s3_bucket.url}/p", str(tmp_path / "out")])
    assert done.exit_code == 1
    assert "stoker: failed: m/../x: object key 'm/../x' cannot be a local file name" in done.output
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.txt", "c.txt"]
    assert not (tmp_path / "x").exists()


def test_the_raw_lister_never_shows_the_secret(s3_bucket) -> None:
    store = s3_bucket.store()
    lister = RawLister.for_store(store._native, timeout_s=5.0)  # type: ignore[attr-defined]
    assert lister is not None
    assert s3_bucket.options()["secret_access_key"] not in repr(lister)


def test_the_fallback_listing_pages_through(s3_bucket, with_newline_key) -> None:
    """Pages of 7 keys: by start-after (as list() reads on) and by continuation token (as a
    one-level listing does) give every key once, in order."""
    lister = RawLister.for_store(s3_bucket.store()._native, timeout_s=5.0)  # type: ignore[attr-defined]
    assert lister is not None
    rooted = RootedLister(replace(lister, max_keys=7), "p")
    expected = (
        [f"a/{i:02d}.txt" for i in range(30)]
        + ["m\nkey.txt"]
        + [f"z/{i:02d}.txt" for i in range(30)]
    )

    async def every_page() -> list[str]:
        keys: list[str] = []
        while True:
            page = await rooted.page("", start_after=keys[-1] if keys else None, delimiter=False)
            assert len(page.objects) <= 7
            keys.extend(meta.key for meta in page.objects)
            if not page.truncated:
                return keys

    assert asyncio.run(every_page()) == expected
    level = asyncio.run(rooted.level("a"))
    assert [meta.key for meta in level.objects] == expected[:30]
