"""stoker doctor and stoker bench --compare, through click's CliRunner."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from stoker.cli.main import cli
from stoker.pack.packer import pack
from stoker.storage.transfer import upload
from stoker.testing.images import make_jpeg, with_comment, write_image_folder, write_packed_images


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("doctor-cli"),
        files=48,
        classes=3,
        width=64,
        height=48,
        samples_per_shard=16,
    )


def test_doctor_names_a_slow_step_and_writes_its_files(dataset: str, tmp_path: Path) -> None:
    png, trace = tmp_path / "report.png", tmp_path / "trace.json"
    args = ["doctor", dataset, "--step-ms", "60", "--batch-size", "8", "--batches", "4"]
    args += ["--size", "32", "--out", str(png), "--trace", str(trace), "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verdict"] == "compute-bound"
    assert report["batches"] == 4
    assert report["png"] == str(png)
    with Image.open(png) as image:
        assert image.format == "PNG"
    assert json.loads(trace.read_text(encoding="utf-8"))["displayTimeUnit"] == "ms"


def test_doctor_prints_a_report(dataset: str, tmp_path: Path) -> None:
    args = ["doctor", dataset, "--step-ms", "0", "--batch-size", "8", "--batches", "3"]
    result = CliRunner().invoke(cli, [*args, "--size", "32", "--out", str(tmp_path / "d.png")])
    assert result.exit_code == 0, result.output
    assert "What to do:" in result.output
    assert "INPUT-BOUND" in result.output or "COMPUTE-BOUND" in result.output
    assert f"Wrote {tmp_path / 'd.png'}." in result.output


def test_doctor_reports_a_missing_dataset(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["doctor", str(tmp_path / "nothing")])
    assert result.exit_code == 1
    assert result.output.startswith("stoker: error:")


def test_bench_compare(s3_bucket: Any, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=20, classes=2, width=64, height=48)
    upload(tmp_path / "src", s3_bucket.store("photos"))
    options = s3_bucket.options()
    env = {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }
    png = tmp_path / "compare.png"
    args = ["bench", "--compare", f"{s3_bucket.url}/photos", "--batch-size", "8"]
    args += ["--size", "32", "--threads", "2", "--out", str(png)]
    result = CliRunner(env=env).invoke(cli, args)
    assert result.exit_code == 0, result.output
    for method in ("(a)", "(b)", "(c)", "(d)"):
        assert method in result.output
    assert f"Wrote {png}." in result.output
    with Image.open(png) as image:
        assert image.format == "PNG"
    assert list(s3_bucket.store("photos-stoker-compare").list()) == []


def test_bench_compare_refuses_loader_options(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "--compare", str(tmp_path), "--batches", "2"])
    assert result.exit_code == 2
    assert "--compare takes no" in result.output


def test_doctor_advice_names_cli_flags(tmp_path: Path) -> None:
    """Decode-bound on large photos with one thread: the advice is flags to try, never
    Python, and pack --resize is offered because stored images exceed the output."""
    rng = np.random.default_rng(3)
    pool = [make_jpeg(rng, width=1200, height=900, quality=90) for _ in range(2)]
    for i in range(24):
        folder = tmp_path / "src" / f"class_{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{i:03d}.jpg").write_bytes(with_comment(pool[i % 2], str(i).encode()))
    pack(tmp_path / "src", tmp_path / "ds")
    args = ["doctor", str(tmp_path / "ds"), "--step-ms", "0", "--batch-size", "4"]
    args += ["--batches", "5", "--threads", "1", "--transform", "center-crop"]
    result = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "d.png"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verdict"] == "input-bound: decode", report
    advice = report["advice"]
    assert not any("Loader(" in line or "Config(" in line for line in advice), advice
    if (os.cpu_count() or 1) > 1:
        assert any(f"--threads {os.cpu_count()}" in line for line in advice), advice
    assert any("`stoker pack --resize 256`" in line for line in advice), advice


def test_bench_counts_samples_delivered_and_one_get_count(dataset: str) -> None:
    """48 samples in batches of 10: an epoch is 48 samples, not 5 x 10; the GETs per sample
    and per epoch that bench prints are one count."""
    args = ["bench", dataset, "--batch-size", "10", "--size", "16", "--block-size", "4"]
    whole = CliRunner().invoke(cli, [*args, "--json"])
    assert whole.exit_code == 0, whole.output
    report = json.loads(whole.output)
    assert report["samples"] == report["epoch_samples"] == 48
    assert report["whole_epoch"]
    assert report["requests_per_epoch"] == report["requests"] > 0
    assert report["requests_per_sample"] == pytest.approx(report["requests"] / 48, abs=1e-4)
    assert "requests_per_epoch" not in report["shuffle"]  # no second, modelled count
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert f"{report['requests'] / 48:.3f} GETs per sample" in text.output
    assert f"; {report['requests']} GETs per epoch of 48 samples." in text.output
    part = CliRunner().invoke(cli, [*args, "--batches", "2", "--json"])
    assert part.exit_code == 0, part.output
    partial = json.loads(part.output)
    assert not partial["whole_epoch"]
    assert partial["epoch_samples"] == 48
    assert partial["requests_per_epoch"] == round(partial["requests_per_sample"] * 48)


def test_bench_compare_through_a_delaying_proxy(s3_bucket: Any, tmp_path: Path) -> None:
    files, rtt_s = 12, 0.05
    write_image_folder(tmp_path / "src", files=files, classes=2, width=64, height=48)
    upload(tmp_path / "src", s3_bucket.store("photos"))
    options = s3_bucket.options()
    env = {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }
    args = ["bench", "--compare", f"{s3_bucket.url}/photos", "--batch-size", "4", "--size", "16"]
    args += ["--threads", "1", "--out", str(tmp_path / "c.png"), "--rtt-ms", str(rtt_s * 1000)]
    result = CliRunner(env=env).invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["rtt_ms"] == rtt_s * 1000
    rows = {row["method"][:3]: row for row in report["rows"]}
    # The proxy was in the way: every method's requests went through it, at least a GET a
    # file for the download one by one.
    assert report["proxy_requests"] >= files
    assert set(rows) == {"(a)", "(b)", "(c)", "(d)"}
    text = CliRunner(env=env).invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "adding 50 ms per round trip" in text.output


def test_rtt_ms_needs_compare_and_a_local_endpoint(tmp_path: Path) -> None:
    alone = CliRunner().invoke(cli, ["bench", str(tmp_path), "--rtt-ms", "20"])
    assert alone.exit_code == 2
    assert "--rtt-ms goes with --compare" in alone.output
    remote = CliRunner(env={"AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_S3": ""}).invoke(
        cli, ["bench", "--compare", "s3://bucket/images", "--rtt-ms", "20"]
    )
    assert remote.exit_code == 2
    assert "--endpoint-url http://127.0.0.1:PORT" in remote.output
