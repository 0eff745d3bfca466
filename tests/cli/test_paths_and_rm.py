"""Paths and exits (issue 15.6, 15.7) and `stoker rm` / `ls` of what is not there (14.8).

Read-only commands never create the path they are given; a missing source, prefix or bucket
is an error naming it; `--workers` fits the open-file limit; `rm` removes a packed dataset
and nothing else.
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import stoker
from stoker.cli.main import cli
from stoker.storage.transfer import bound_workers
from stoker.testing.images import write_image_folder

_STOKER = (sys.executable, "-m", "stoker")


@pytest.fixture
def env(s3_bucket) -> dict[str, str]:
    options = s3_bucket.options()
    return {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "{typo}"],
        ["ls", "-r", "{typo}"],
        ["ls", "file://{typo}"],
        ["inspect", "{typo}"],
        ["verify", "{typo}"],
        ["show", "{typo}"],
        ["bench", "{typo}"],
        ["doctor", "{typo}"],
        ["rm", "--yes", "{typo}"],
        ["download", "{typo}", "{out}"],
        ["cache", "info", "{typo}"],
        ["cache", "verify", "{typo}"],
        ["cache", "clear", "{typo}"],
    ],
    ids=lambda argv: "-".join(a for a in argv if "{" not in a),
)
def test_a_mistyped_local_path_is_named_and_never_created(tmp_path: Path, argv) -> None:
    typo, out = tmp_path / "no" / "such-folder", tmp_path / "out"
    args = [a.format(typo=typo, out=out) for a in argv]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == (2 if argv[0] == "cache" else 1), result.output
    assert "such-folder" in result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made, out/ included


def test_download_of_a_missing_prefix_fails_naming_it(s3_bucket, env, tmp_path: Path) -> None:
    s3_bucket.store().put("there/x", b"x")
    result = CliRunner(env=env).invoke(
        cli, ["download", f"{s3_bucket.url}/not-there", str(tmp_path / "out")]
    )
    assert result.exit_code == 1
    assert f"nothing to download: no object under {s3_bucket.url}/not-there" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["show", "inspect", "verify", "bench", "rm", "ls", "download"])
def test_a_missing_bucket_is_named(env, tmp_path: Path, command: str) -> None:
    argv = [command, "s3://no-such-bucket-h15/data"]
    if command == "download":
        argv.append(str(tmp_path / "out"))
    result = CliRunner(env=env).invoke(cli, argv)
    assert result.exit_code == 1
    assert "bucket 'no-such-bucket-h15' does not exist" in result.output
    assert "no index" not in result.output


def test_ls_of_a_missing_prefix_says_so(s3_bucket, env) -> None:
    s3_bucket.store().put("there/x", b"x")
    runner = CliRunner(env=env)
    for argv in (["ls"], ["ls", "-r"], ["ls", "--json"]):
        result = runner.invoke(cli, [*argv, f"{s3_bucket.url}/missing"])
        assert result.exit_code == 1
        assert (
            f"nothing under {s3_bucket.url}/missing: no such prefix, folder or bucket"
            in result.output
        )
    assert runner.invoke(cli, ["ls", f"{s3_bucket.url}/there"]).exit_code == 0


def test_ls_json_carries_the_totals(s3_bucket, env) -> None:
    store = s3_bucket.store("d")
    store.put("a", b"x" * 10)
    store.put("sub/b", b"y" * 32)
    runner = CliRunner(env=env)
    level = [
        json.loads(line)
        for line in runner.invoke(cli, ["ls", "--json", f"{s3_bucket.url}/d"]).output.splitlines()
    ]
    assert level[-1] == {"total": {"objects": 1, "bytes": 10, "prefixes": 1}}
    every = [
        json.loads(line)
        for line in runner.invoke(
            cli, ["ls", "-r", "--json", f"{s3_bucket.url}/d"]
        ).output.splitlines()
    ]
    assert [row["key"] for row in every[:-1]] == ["a", "sub/b"]
    assert every[-1] == {"total": {"objects": 2, "bytes": 42}}


def _packed(s3_bucket, tmp_path: Path, prefix: str) -> str:
    write_image_folder(tmp_path / prefix, files=12, classes=2, width=32, height=24)
    url = f"{s3_bucket.url}/{prefix}"
    stoker.pack(str(tmp_path / prefix), url, storage_options=s3_bucket.options())
    return url


def test_rm_removes_the_dataset_and_nothing_else(s3_bucket, env, tmp_path: Path) -> None:
    url = _packed(s3_bucket, tmp_path, "ds")
    store = s3_bucket.store("ds")
    store.put("notes.txt", b"mine")  # not the dataset's: must stay
    store.put("other/shard-000000.tar", b"another dataset's")
    dataset = {m.key for m in store.list()} - {"notes.txt", "other/shard-000000.tar"}
    assert {"index.json", "index.bin"} <= dataset
    runner = CliRunner(env=env)

    refused = runner.invoke(cli, ["rm", url], input="n\n")
    assert refused.exit_code == 1
    assert "nothing was removed" in refused.output
    no_answer = runner.invoke(cli, ["rm", url], input="")
    assert no_answer.exit_code == 1
    assert {m.key for m in store.list()} >= dataset

    done = runner.invoke(cli, ["rm", url], input="y\n")
    assert done.exit_code == 0, done.output
    assert "Removed the dataset at" in done.output
    assert sorted(m.key for m in store.list()) == ["notes.txt", "other/shard-000000.tar"]

    again = runner.invoke(cli, ["rm", "--yes", url])
    assert again.exit_code == 1
    assert "has no index (index.json): not a packed dataset; nothing was removed" in again.output


def test_rm_deletes_the_index_first(s3_bucket, env, tmp_path: Path) -> None:
    """Through the library: the index goes before any shard, so a removal stopped half-way
    leaves no index that names a missing shard."""
    from stoker.format.remove import plan_removal, remove_dataset
    from stoker.storage import open_store

    url = _packed(s3_bucket, tmp_path, "ds2")
    store = open_store(url, storage_options=s3_bucket.options())
    plan = plan_removal(store)
    assert plan.objects[:2] == ("index.json", "index.bin")
    assert set(plan.shards) == {m.key for m in store.list() if m.key.endswith(".tar")}
    deleted: list[str] = []
    real_delete = store.delete

    def spy(key: str) -> None:
        deleted.append(key)
        real_delete(key)

    store.delete = spy  # type: ignore[method-assign]  # observe the order
    remove_dataset(store)
    assert deleted == list(plan.objects)
    assert list(store.list()) == []


def test_rm_counts_only_the_shards_that_were_there(s3_bucket, env, tmp_path: Path) -> None:
    # A DELETE of a missing object succeeds too: rm said "its index and 3 shards" here.
    write_image_folder(tmp_path / "src", files=12, classes=2, width=32, height=24)
    url = f"{s3_bucket.url}/gone"
    config = stoker.PackConfig(samples_per_shard=4)
    stoker.pack(str(tmp_path / "src"), url, storage_options=s3_bucket.options(), config=config)
    store = s3_bucket.store("gone")
    shards = sorted(m.key for m in store.list() if m.key.endswith(".tar"))
    assert len(shards) == 3
    store.delete(shards[1])
    result = CliRunner(env=env).invoke(cli, ["rm", "--yes", url])
    assert result.exit_code == 0, result.output
    assert f"its index and 2 of the 3 shards it lists; 1 was not there ({shards[1]})" in (
        result.output
    )
    assert list(store.list()) == []


def test_rm_refuses_a_prefix_without_an_index(s3_bucket, env) -> None:
    s3_bucket.store("raw").put("a.jpg", b"x")
    result = CliRunner(env=env).invoke(cli, ["rm", "--yes", f"{s3_bucket.url}/raw"])
    assert result.exit_code == 1
    assert "has no index" in result.output
    assert [m.key for m in s3_bucket.store("raw").list()] == ["a.jpg"]


def test_workers_fit_the_open_file_limit(tmp_path: Path) -> None:
    assert bound_workers(64, 1 << 20) == (64, 128)
    workers, in_flight = bound_workers(4096, 1024)
    assert 64 + 3 * workers <= 1024
    assert workers + in_flight <= 1024 - 64
    with pytest.raises(ValueError, match="open-file limit of 40"):
        bound_workers(8, 40)

    # Through the CLI, with a hard limit it cannot raise: fewer workers, and a warning.
    write_image_folder(tmp_path / "src", files=5, classes=1, width=16, height=16)

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    done = subprocess.run(
        [*_STOKER, "download", str(tmp_path / "src"), str(tmp_path / "dst"), "--workers", "1000"],
        capture_output=True,
        text=True,
        preexec_fn=low_limit,
        env={**os.environ},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--workers 1000 needs more open files than the limit of 256" in done.stderr
    assert "using 64 workers" in done.stderr
    assert len(list((tmp_path / "dst").rglob("*.jpg"))) == 5


def _wds_tar(keys: list[str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for key in keys:
            for ext, data in (("txt", key.encode()), ("cls", b"0")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_rm_of_a_dataset_indexed_in_place_keeps_the_users_tars(s3_bucket, env) -> None:
    """Issue 22.5: `stoker index` then `stoker rm -y` deleted the user's own tars."""
    store = s3_bucket.store("wds")
    tars = {"mydata-0000.tar": _wds_tar(["a", "b"]), "mydata-0001.tar": _wds_tar(["c"])}
    for name, data in tars.items():
        store.put(name, data)
    url = f"{s3_bucket.url}/wds"
    runner = CliRunner(env=env)
    assert runner.invoke(cli, ["index", url]).exit_code == 0

    kept = runner.invoke(cli, ["rm", "-y", url])
    assert kept.exit_code == 0, kept.output
    assert f"Removed the index of the dataset at {url}" in kept.output
    assert "Left its 2 shards" in kept.output
    assert "mydata-0000.tar" in kept.output
    assert "--shards" in kept.output
    assert {m.key: bytes(store.get(m.key)) for m in store.list()} == tars

    assert runner.invoke(cli, ["index", url]).exit_code == 0
    both = runner.invoke(cli, ["rm", "-y", "--shards", url])
    assert both.exit_code == 0, both.output
    assert "its index and 2 shards" in both.output
    assert list(store.list()) == []


def test_rm_of_a_packed_dataset_removes_its_shards_without_asking_for_them(
    s3_bucket, env, tmp_path: Path
) -> None:
    url = _packed(s3_bucket, tmp_path, "packed")
    result = CliRunner(env=env).invoke(cli, ["rm", "-y", url])
    assert result.exit_code == 0, result.output
    assert "Left" not in result.output
    assert list(s3_bucket.store("packed").list()) == []


@pytest.mark.parametrize("where", ["{src}/sub", "file://{src}/sub/deeper", "{src}"])
def test_upload_into_its_own_folder_is_refused(tmp_path: Path, where: str) -> None:
    """Issue 22.6: `upload SRC SRC/sub` copied the folder into itself, more on each rerun."""
    write_image_folder(tmp_path / "src", files=6, classes=2, width=16, height=16)
    before = sorted(p for p in (tmp_path / "src").rglob("*"))
    destination = where.format(src=tmp_path / "src")
    result = CliRunner().invoke(cli, ["upload", str(tmp_path / "src"), destination])
    assert result.exit_code == 1, result.output
    assert "is inside the source folder" in result.output
    assert str(tmp_path / "src") in result.output
    assert sorted(p for p in (tmp_path / "src").rglob("*")) == before
    beside = CliRunner().invoke(cli, ["upload", str(tmp_path / "src"), str(tmp_path / "copy")])
    assert beside.exit_code == 0, beside.output
