"""A URL's key part is literal (issue 22.1): ``#``, ``?`` and ``%`` are characters of the key.

S3 keys may hold any of them; a URL cut at ``#`` or ``?`` named another location, so
``stoker rm -y 's3://b/data#x'`` removed the dataset at ``s3://b/data``. The commands here
run against the real SeaweedFS server and must act on exactly the prefix named.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.storage import parse_url
from stoker.testing.images import write_image_folder


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://b/data#x", "b", "data#x"),
        ("s3://b/data2#v2/", "b", "data2#v2"),
        ("s3://b/q?v=1&w=2", "b", "q?v=1&w=2"),
        ("s3://b/a%23b", "b", "a%23b"),  # never decoded: %23 is three characters
        ("s3://b/#", "b", "#"),
        ("s3://b/?", "b", "?"),
        ("gs://b/x y/z#1", "b", "x y/z#1"),
        ("az://c/dir?/f", "c", "dir?/f"),
    ],
)
def test_the_key_part_of_a_bucket_url_is_literal(url: str, bucket: str, prefix: str) -> None:
    parsed = parse_url(url)
    assert (parsed.bucket, parsed.prefix) == (bucket, prefix)
    assert str(parsed) == url.rstrip("/")


def test_a_file_url_is_literal_too(tmp_path: Path) -> None:
    assert parse_url(f"file://{tmp_path}/a#b").prefix == f"{tmp_path}/a#b"
    assert parse_url(f"file://{tmp_path}/a?b").prefix == f"{tmp_path}/a?b"
    assert parse_url(f"file://{tmp_path}/a%20b").prefix == f"{tmp_path}/a%20b"
    assert parse_url(f"{tmp_path}/a#b").prefix == f"{tmp_path}/a#b"


@pytest.mark.parametrize("url", ["s3://b#x/data", "s3://b?x", "s3://b%41/k", "gs://b c/k"])
def test_a_bucket_name_with_a_character_no_bucket_has_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="which no bucket name has"):
        parse_url(url)


@pytest.mark.parametrize(
    ("prefix", "problem"),
    [
        ("a//b", "empty segment"),
        ("a/../b", "'..' segment"),
        ("a/./b", "'.' segment"),
        ("a/\x1bb", "control character"),
    ],
)
def test_a_prefix_no_object_store_can_address_is_named(
    s3_bucket, env, tmp_path: Path, prefix: str, problem: str
) -> None:
    # obstore's words reached the user: "Could not parse path: Path "a//b" contained ...".
    url = f"{s3_bucket.url}/{prefix}"
    with pytest.raises(ValueError, match=f"the prefix {re.escape(repr(prefix))} .*{problem}"):
        parse_url(url)
    for command in (["ls", url], ["inspect", url], ["download", url, str(tmp_path / "dst")]):
        result = CliRunner(env=env).invoke(cli, command)
        assert result.exit_code == 1
        assert "Could not parse path" not in result.output
        assert f"the prefix {prefix!r} cannot be addressed" in result.output, result.output


@pytest.fixture
def env(s3_bucket) -> dict[str, str]:
    options = s3_bucket.options()
    return {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }


def _tops(s3_bucket) -> dict[str, int]:
    """Objects in the bucket by their first key segment."""
    counts: dict[str, int] = {}
    for meta in s3_bucket.store().list():
        top = meta.key.split("/", 1)[0]
        counts[top] = counts.get(top, 0) + 1
    return counts


def test_pack_and_rm_act_on_exactly_the_prefix_named(s3_bucket, env, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "images", files=8, classes=2, width=32, height=24)
    runner = CliRunner(env=env)
    for prefix in ("data", "data#x", "data?v=1"):
        done = runner.invoke(cli, ["pack", str(tmp_path / "images"), f"{s3_bucket.url}/{prefix}"])
        assert done.exit_code == 0, done.output
    tops = _tops(s3_bucket)
    assert set(tops) == {"data", "data#x", "data?v=1"}
    assert tops["data"] == tops["data#x"] == tops["data?v=1"]

    removed = runner.invoke(cli, ["rm", "-y", f"{s3_bucket.url}/data#x"])
    assert removed.exit_code == 0, removed.output
    assert f"Removed the dataset at {s3_bucket.url}/data#x" in removed.output
    assert set(_tops(s3_bucket)) == {"data", "data?v=1"}
    shown = runner.invoke(cli, ["inspect", f"{s3_bucket.url}/data"])
    assert shown.exit_code == 0, shown.output  # the other dataset is whole

    removed = runner.invoke(cli, ["rm", "-y", f"{s3_bucket.url}/data?v=1"])
    assert removed.exit_code == 0, removed.output
    assert set(_tops(s3_bucket)) == {"data"}


def test_upload_writes_under_the_literal_prefix(s3_bucket, env, tmp_path: Path) -> None:
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "a.txt").write_bytes(b"a")
    (tmp_path / "src" / "sub" / "b.txt").write_bytes(b"b")
    runner = CliRunner(env=env)
    done = runner.invoke(cli, ["upload", str(tmp_path / "src"), f"{s3_bucket.url}/data2#v2"])
    assert done.exit_code == 0, done.output
    keys = sorted(meta.key for meta in s3_bucket.store().list())
    assert keys == ["data2#v2/a.txt", "data2#v2/sub/b.txt"]

    back = runner.invoke(cli, ["download", f"{s3_bucket.url}/data2#v2", str(tmp_path / "out")])
    assert back.exit_code == 0, back.output
    assert (tmp_path / "out" / "sub" / "b.txt").read_bytes() == b"b"


def test_the_pack_hint_quotes_a_url_a_shell_would_change() -> None:
    from stoker.pipeline.folder import pack_command

    assert pack_command("s3://b/data#x?") == "stoker pack 's3://b/data#x?' 's3://b/data#x?-packed'"
    assert pack_command("s3://b/plain") == "stoker pack s3://b/plain s3://b/plain-packed"
