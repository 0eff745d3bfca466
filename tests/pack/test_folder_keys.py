"""Packing a bucket folder reads every key as itself (issue 22.4).

Keys with ``#`` or ``?`` were read through a URL that cut them there, and keys with a tab
or a newline through one that dropped the character: ``dog/hash#frag.jpg`` was packed with
the bytes of ``dog/hash``. The objects are on the real SeaweedFS server; a key with a
control character, which obstore cannot send, is put by its URL-encoded path.
"""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.format.reader import open_dataset
from stoker.testing.images import make_jpeg, with_comment
from stoker.testing.sigv4 import signed_request

RNG = np.random.default_rng(22)
BASE = make_jpeg(RNG, width=24, height=16)


def _jpeg(tag: str) -> bytes:
    return with_comment(BASE, tag.encode())


def _put_raw(s3_bucket, key_path: str, body: bytes) -> None:
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


def _env(s3_bucket) -> dict[str, str]:
    options = s3_bucket.options()
    return {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }


def _folder(s3_bucket) -> str:
    store = s3_bucket.store("src")
    # Each key with '#' or '?' beside the object that a URL cut there would name.
    for key in ("dog/hash#frag.jpg", "dog/hash", "dog/q?v=1.jpg", "dog/q", "cat/plain.jpg"):
        store.put(key, _jpeg(key))
    # A tab and a newline beside the keys that dropping them would name.
    for key in ("dog/tabkey.jpg", "dog/nlkey.jpg"):
        store.put(key, _jpeg(key))
    _put_raw(s3_bucket, "src/dog/tab%09key.jpg", _jpeg("dog/tab\tkey.jpg"))
    _put_raw(s3_bucket, "src/dog/nl%0Akey.jpg", _jpeg("dog/nl\nkey.jpg"))
    return f"{s3_bucket.url}/src"


def test_pack_reads_every_key_of_a_bucket_folder_as_itself(s3_bucket) -> None:
    source = _folder(s3_bucket)
    runner = CliRunner(env=_env(s3_bucket))

    refused = runner.invoke(cli, ["pack", source, f"{s3_bucket.url}/refused"])
    assert refused.exit_code == 1
    assert "unusable key 'dog/nl\\nkey.jpg' (control character '\\n')" in refused.output
    assert "\t" not in refused.output
    assert "nl\nkey" not in refused.output

    done = runner.invoke(cli, ["pack", source, f"{s3_bucket.url}/ds", "--on-error", "skip"])
    assert done.exit_code == 0, done.output
    assert "Skipped 2 inputs" in done.output
    assert "unusable key 'dog/tab\\tkey.jpg' (control character '\\t')" in done.output
    dataset = open_dataset(f"{s3_bucket.url}/ds", storage_options=s3_bucket.options())
    samples = {s["key"]: s["jpg"] for s in dataset.read_many(range(len(dataset)))}
    assert samples == {
        "cat/plain": _jpeg("cat/plain.jpg"),
        "dog/hash#frag": _jpeg("dog/hash#frag.jpg"),
        "dog/q?v=1": _jpeg("dog/q?v=1.jpg"),
        "dog/nlkey": _jpeg("dog/nlkey.jpg"),
        "dog/tabkey": _jpeg("dog/tabkey.jpg"),
    }
