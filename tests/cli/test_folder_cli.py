"""stoker show, bench and doctor on an unpacked image folder, through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from PIL import Image

from stoker.cli.main import cli
from stoker.storage.transfer import upload
from stoker.testing.images import write_image_folder

FILES = 24


@pytest.fixture(scope="module")
def local_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("folder-cli") / "train"
    write_image_folder(root, files=FILES, classes=3, width=48, height=36)
    return root


def _env(bucket: Any) -> dict[str, str]:
    options = bucket.options()
    return {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }


def test_show_on_a_local_folder(local_folder: Path, tmp_path: Path) -> None:
    png = tmp_path / "grid.png"
    result = CliRunner().invoke(cli, ["show", str(local_folder), "--size", "32", "--out", str(png)])
    assert result.exit_code == 0, result.output
    assert f"Wrote {png}" in result.output
    with Image.open(png) as image:
        assert image.format == "PNG"


def test_bench_on_a_bucket_folder(s3_bucket: Any, local_folder: Path) -> None:
    upload(local_folder, s3_bucket.store("train"))
    url = f"{s3_bucket.url}/train"
    args = ["bench", url, "--batch-size", "8", "--size", "32", "--threads", "2", "--json"]
    result = CliRunner(env=_env(s3_bucket)).invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["samples"] == FILES
    assert report["requests_per_epoch"] == FILES  # one GET per image
    plain = CliRunner(env=_env(s3_bucket)).invoke(cli, args[:-1])
    assert plain.exit_code == 0, plain.output
    assert "images/s" in plain.output
    assert f"{FILES} GETs per epoch" in plain.output


def test_doctor_on_a_local_folder(local_folder: Path, tmp_path: Path) -> None:
    args = ["doctor", str(local_folder), "--step-ms", "0", "--batch-size", "8", "--batches", "3"]
    args += ["--size", "32", "--out", str(tmp_path / "d.png"), "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["url"] == str(local_folder)
    assert report["batches"] == 3


def test_a_prefix_with_neither_index_nor_images_exits_naming_both_ways(s3_bucket: Any) -> None:
    s3_bucket.store("notes").put("readme.txt", b"no images")
    url = f"{s3_bucket.url}/notes"
    result = CliRunner(env=_env(s3_bucket)).invoke(cli, ["bench", url, "--batches", "1"])
    assert result.exit_code == 1
    assert result.output.startswith("stoker: error:")
    assert f"`stoker pack {url} {url}-packed`" in result.output
    assert "class folders" in result.output
