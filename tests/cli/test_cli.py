"""The command line, through click's CliRunner and as a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from PIL import Image

from stoker.cli.docs import render
from stoker.cli.main import cli
from stoker.storage import open_store
from stoker.testing.images import write_image_folder


@pytest.fixture
def env(s3_bucket) -> dict[str, str]:
    options = s3_bucket.options()
    return {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }


def test_help_lists_commands() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for command in ("ls", "download", "upload", "demo"):
        assert command in result.output


def test_upload_ls_download(s3_bucket, env: dict[str, str], tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=30, classes=3)
    runner = CliRunner(env=env)
    url = f"{s3_bucket.url}/imgs"
    result = runner.invoke(cli, ["upload", str(tmp_path / "src"), url, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["files_transferred"] == 30

    listing = runner.invoke(cli, ["ls", f"{url}/"])
    assert listing.exit_code == 0
    assert [line.split()[-1] for line in listing.output.splitlines()] == [
        "class_00/",
        "class_01/",
        "class_02/",
    ]
    recursive = runner.invoke(cli, ["ls", "-r", "--json", url])
    lines = [json.loads(line) for line in recursive.output.splitlines()]
    rows, totals = lines[:-1], lines[-1]  # the last line carries the totals
    assert len(rows) == 30
    assert {"key", "size", "etag", "last_modified"} <= set(rows[0])
    assert totals == {"total": {"objects": 30, "bytes": sum(row["size"] for row in rows)}}

    result = runner.invoke(cli, ["download", url, str(tmp_path / "dst"), "--include", "class_01/*"])
    assert result.exit_code == 0, result.output
    assert "Downloaded 10 files" in result.output
    assert len(list((tmp_path / "dst").rglob("*.jpg"))) == 10


def test_errors_exit_1_with_one_clear_line(env: dict[str, str], tmp_path: Path) -> None:
    runner = CliRunner(env=env)
    result = runner.invoke(cli, ["ls", "s3://bucket-that-does-not-exist"])
    assert result.exit_code == 1
    assert "bucket 'bucket-that-does-not-exist' does not exist" in result.output

    bad = CliRunner(env={**env, "AWS_SECRET_ACCESS_KEY": "CANARY-wrong-secret"})
    result = bad.invoke(cli, ["download", "s3://any-bucket", str(tmp_path)])
    assert result.exit_code == 1
    assert "credentials came from environment" in result.output
    assert "CANARY" not in result.output


def test_failed_objects_are_each_named(tmp_path: Path) -> None:
    store = open_store("memory://cli-failures")
    store.put("good.txt", b"fine")
    store.put("../evil.txt", b"escape attempt")
    store.put("a/./b.txt", b"dot segment")
    result = CliRunner().invoke(cli, ["download", "memory://cli-failures", str(tmp_path / "d")])
    assert result.exit_code == 1
    assert "failed: ../evil.txt: object key '../evil.txt' cannot be a local file name" in (
        result.output
    )
    assert "failed: a/./b.txt" in result.output
    assert "stoker: error: 2 of 3 files failed to download; rerun the same command" in result.output
    assert (tmp_path / "d" / "good.txt").read_bytes() == b"fine"


def test_global_options_reach_the_store(s3_bucket, tmp_path: Path) -> None:
    options = s3_bucket.options()
    s3_bucket.store().put("x.txt", b"x")
    env = {
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
    }
    result = CliRunner(env=env).invoke(
        cli,
        [
            "--endpoint-url",
            options["endpoint_url"],
            "--region",
            "us-east-1",
            "--addressing-style",
            "path",
            "ls",
            s3_bucket.url,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "x.txt" in result.output


def test_process_exit_code_is_clean_after_many_requests(
    s3_bucket, env: dict[str, str], tmp_path: Path
) -> None:
    """obstore's async futures must not abort the interpreter at exit (was exit 134)."""
    write_image_folder(tmp_path / "src", files=200)
    for _ in range(3):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "stoker",
                "upload",
                str(tmp_path / "src"),
                f"{s3_bucket.url}/exit",
                "--no-resume",
                "--no-progress",
            ],
            env={**env, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        cli, ["demo", "--files", "60", "--rtt-ms", "5", "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verified_files"] == 60
    assert report["parallel_files_per_s"] > 0
    assert report["sequential_files_per_s"] > 0
    rows = report["comparison"]["rows"]
    assert [row["method"][:3] for row in rows] == ["(a)", "(b)", "(c)", "(d)"]
    assert all(row["images"] == 60 for row in rows)
    assert report["doctor"]["verdict"].startswith(("input-bound: ", "compute-bound"))
    for name in ("compare.png", "doctor.png", "grid.png"):
        with Image.open(out / name) as image:
            assert image.format == "PNG"
    trace = json.loads((out / "trace.json").read_text(encoding="utf-8"))
    assert any(event["ph"] == "X" for event in trace["traceEvents"])


def test_cli_docs_page_is_current() -> None:
    """docs/cli.md is generated from --help; regenerate with `python -m stoker.cli.docs`."""
    page = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
    assert page.read_text(encoding="utf-8") == render()


def test_pack_refuses_images_over_max_pixels(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=4, classes=1, width=48, height=40)
    runner = CliRunner()
    refused = runner.invoke(
        cli, ["pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--max-pixels", "100"]
    )
    assert refused.exit_code == 1
    assert "max_pixels=100" in refused.output
    allowed = runner.invoke(
        cli, ["pack", str(tmp_path / "src"), str(tmp_path / "ok"), "--max-pixels", "1920"]
    )
    assert allowed.exit_code == 0, allowed.output


def test_a_stopped_transfer_says_why_and_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    from stoker.cli.progress import BarProgress
    from stoker.cli.transfer import _run_transfer
    from stoker.errors import TransferError

    def stops() -> Any:
        raise TransferError(
            "download stopped: no space left on device writing /d/big.bin (6291456 bytes); "
            "3 of 61 files are complete in /d and no partial file is left; free some space, "
            "then rerun to resume",
            [],
        )

    with pytest.raises(SystemExit):
        _run_transfer(stops, BarProgress("download", enabled=False), as_json=False)
    err = capsys.readouterr().err
    assert "stoker: error: download stopped: no space left on device writing /d/big.bin" in err
    assert "free some space, then rerun to resume" in err
