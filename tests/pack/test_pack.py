"""pack() and `stoker pack`: image folders local and in a bucket, errors, resume."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from stoker.cli.main import cli
from stoker.errors import SourceError, StokerError
from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.pack.plan import plan_shards
from stoker.pack.reencode import ImagePolicy
from stoker.storage.transfer import upload
from stoker.testing.images import write_image_folder


def _originals(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).with_suffix("").as_posix(): p.read_bytes() for p in root.rglob("*.jpg")
    }


def test_pack_local_folder_round_trips(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=60, classes=3)
    report = pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=25))
    assert (report.samples, report.shards, report.source_format) == (60, 3, "imagefolder")
    dataset = open_dataset(tmp_path / "ds")
    assert dataset.class_names == ["class_00", "class_01", "class_02"]
    originals = _originals(tmp_path / "src")
    for sample in dataset.read_many(range(len(dataset))):
        assert sample["jpg"] == originals[sample["key"]]
        assert dataset.class_names[sample["label"]] == sample["key"].split("/")[0]
        assert sample["cls"] == str(sample["label"]).encode()
    assert dataset.verify().ok


def test_pack_from_bucket_to_bucket_then_verify(s3_bucket, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=80, classes=4)
    upload(tmp_path / "src", s3_bucket.store("raw"))
    options = s3_bucket.options()
    report = pack(
        f"{s3_bucket.url}/raw",
        f"{s3_bucket.url}/packed",
        config=PackConfig(max_shard_bytes=200_000),
        storage_options=options,
    )
    assert report.samples == 80
    assert report.shards > 1
    dataset = open_dataset(f"{s3_bucket.url}/packed", storage_options=options)
    assert dataset.verify().ok
    originals = _originals(tmp_path / "src")
    assert {s["key"]: s["jpg"] for s in dataset.read_many(range(80))} == originals
    result = CliRunner(
        env={
            "AWS_ENDPOINT_URL": options["endpoint_url"],
            "AWS_ACCESS_KEY_ID": options["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        }
    ).invoke(cli, ["verify", f"{s3_bucket.url}/packed"])
    assert result.exit_code == 0, result.output
    assert "OK:" in result.output


def test_resize_and_reencode(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=6, classes=2, width=400, height=300)
    pack(
        tmp_path / "src",
        tmp_path / "ds",
        config=PackConfig(images=ImagePolicy(resize_shorter=60, quality=80)),
    )
    for sample in open_dataset(tmp_path / "ds").read_many(range(6)):
        with Image.open(io.BytesIO(sample["jpg"])) as image:
            assert min(image.size) == 60
            assert image.size == (80, 60)


def test_bad_images_stop_the_pack_or_are_skipped(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=10, classes=2)
    (tmp_path / "src" / "class_00" / "broken.jpg").write_bytes(b"not a jpeg at all")
    with pytest.raises(SourceError, match=r"broken\.jpg: cannot decode image"):
        pack(tmp_path / "src", tmp_path / "ds")
    assert not (tmp_path / "ds" / "index.json").exists()
    report = pack(tmp_path / "src", tmp_path / "ds2", config=PackConfig(on_error="skip"))
    assert report.samples == 10
    assert [s["key"] for s in report.skipped] == ["class_00/broken"]
    manifest = json.loads((tmp_path / "ds2" / "index.json").read_text())
    assert manifest["skipped"] == [
        {
            "key": "class_00/broken",
            "source": str(tmp_path / "src" / "class_00" / "broken.jpg"),
            "reason": f"{tmp_path / 'src' / 'class_00' / 'broken.jpg'}: cannot decode image: "
            "no JPEG start-of-image marker",
        }
    ]


def test_truncated_jpeg_is_caught(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=3, classes=1)
    victim = next((tmp_path / "src").rglob("*.jpg"))
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(SourceError, match="truncated"):
        pack(tmp_path / "src", tmp_path / "ds")


def test_empty_class_folder_and_duplicate_keys(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=4, classes=2)
    (tmp_path / "src" / "class_empty").mkdir()
    with pytest.raises(SourceError, match="class_empty: class folder has no images"):
        pack(tmp_path / "src", tmp_path / "ds")
    (tmp_path / "src" / "class_empty").rmdir()
    first = next((tmp_path / "src" / "class_00").glob("*.jpg"))
    (first.parent / (first.stem + ".png")).write_bytes(first.read_bytes())
    with pytest.raises(SourceError, match="duplicate key"):
        pack(tmp_path / "src", tmp_path / "ds3")


def test_decompression_bombs_are_refused(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=2, classes=1, width=300, height=200)
    with pytest.raises(SourceError, match="exceeds max_pixels"):
        pack(
            tmp_path / "src",
            tmp_path / "ds",
            config=PackConfig(images=ImagePolicy(max_pixels=10_000)),
        )


def test_other_pack_in_destination_is_refused(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=10)
    pack(tmp_path / "src", tmp_path / "ds")
    again = pack(tmp_path / "src", tmp_path / "ds")
    assert again.shards_reused == again.shards
    with pytest.raises(StokerError, match="already holds a pack of other input"):
        pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=3))


def test_plan_is_deterministic_and_complete() -> None:
    from stoker.format.foreign.base import SampleRef

    refs = [SampleRef(key=f"k{i}", location=f"/x/{i}", size=100 + i) for i in range(100)]
    a = plan_shards(refs, max_shard_bytes=20_000, shuffle_seed=3)
    b = plan_shards(refs, max_shard_bytes=20_000, shuffle_seed=3)
    assert a == b
    assert sorted(i for shard in a.shards for i in shard) == list(range(100))
    assert plan_shards(refs, max_shard_bytes=20_000, shuffle_seed=4).plan_id != a.plan_id
    by_count = plan_shards(refs, max_shard_bytes=1, samples_per_shard=30)
    assert [len(s) for s in by_count.shards] == [30, 30, 30, 10]


def test_sigkill_during_pack_then_rerun_verifies(s3_bucket, tmp_path: Path) -> None:
    """Kill a running `stoker pack` with SIGKILL, rerun it, and verify the result."""
    write_image_folder(tmp_path / "src", files=600, classes=5)
    options = s3_bucket.options()
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }
    dst = f"{s3_bucket.url}/ds"
    command = [
        sys.executable,
        "-m",
        "stoker",
        "pack",
        str(tmp_path / "src"),
        dst,
        "--samples-per-shard",
        "20",
        "--workers",
        "1",
        "--no-progress",
    ]
    store = s3_bucket.store("ds")
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = [m for m in store.list("_stoker") if m.key.endswith(".json")]
        if len(done) >= 4:
            break
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.communicate()
    with pytest.raises(FileNotFoundError):
        store.head("index.json")  # no index before every shard is complete
    rerun = subprocess.run(
        [*command, "--json"], env=env, capture_output=True, text=True, check=False
    )
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout)
    assert report["samples"] == 600
    assert 0 < report["shards_reused"] < 30
    # Only the shards not reused are written again, each with its completion record, then
    # index.json and index.bin; the input is local, so nothing is read from a store.
    written = report["requests"]["destination"]["requests.put"]
    assert written == 2 * (30 - report["shards_reused"]) + 2
    assert report["requests"]["source"] == {}
    dataset = open_dataset(dst, storage_options=options)
    assert dataset.verify().ok
    assert len(dataset) == 600


def test_index_existing_webdataset_tars(tmp_path: Path) -> None:
    """`stoker index` makes tars written by tarfile (with pax headers) random-access."""
    import tarfile

    root = tmp_path / "wds"
    root.mkdir()
    expected = {}
    for shard in range(2):
        with tarfile.open(root / f"part-{shard}.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            for i in range(5):
                key = f"sample_{shard}_{i}" + ("_ü" if i == 2 else "")
                for ext, data in (("jpg", os.urandom(300 + i)), ("cls", str(i % 2).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                    expected.setdefault(key, {})[ext] = data
    result = CliRunner().invoke(
        cli, ["index", str(root), "--class-name", "even", "--class-name", "odd"]
    )
    assert result.exit_code == 0, result.output
    assert "Indexed 10 samples in 2 shards" in result.output
    dataset = open_dataset(root)
    assert dataset.class_names == ["even", "odd"]
    for sample in dataset.read_many(range(10)):
        assert sample["jpg"] == expected[sample["key"]]["jpg"]
        assert sample["label"] == int(expected[sample["key"]]["cls"])
    assert dataset.verify().ok
    inspect = CliRunner().invoke(cli, ["inspect", str(root), "--json"])
    assert json.loads(inspect.output)["classes"] == {"even": 6, "odd": 4}


def test_a_shard_lost_between_runs_is_caught_before_the_index(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=30)
    config = PackConfig(samples_per_shard=10)
    pack(tmp_path / "src", tmp_path / "ds", config=config)
    (tmp_path / "ds" / "index.json").unlink()
    (tmp_path / "ds" / "shard-000001.tar").write_bytes(b"truncated")
    with pytest.raises(StokerError, match=r"shard-000001\.tar is 9 bytes"):
        pack(tmp_path / "src", tmp_path / "ds", config=config)
    assert not (tmp_path / "ds" / "index.json").exists()


def test_show_writes_a_titled_grid_and_bench_reports(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=20, classes=3, width=80, height=60)
    pack(tmp_path / "src", tmp_path / "ds")
    result = CliRunner().invoke(
        cli, ["show", str(tmp_path / "ds"), "--out", str(tmp_path / "grid.png"), "--size", "48"]
    )
    assert result.exit_code == 0, result.output
    with Image.open(tmp_path / "grid.png") as grid:
        assert grid.size == (3 * 48, 3 * (48 + 18))
        # Titles are drawn: the caption strips are not all white.
        strip = np.asarray(grid.convert("L"))[:18]
        assert strip.min() < 128
    bench = CliRunner().invoke(
        cli, ["bench", str(tmp_path / "ds"), "--batch-size", "8", "--size", "32", "--json"]
    )
    assert bench.exit_code == 0, bench.output
    report = json.loads(bench.output)
    assert report["samples"] == 20
    assert report["batches"] == 3
    assert report["requests_per_sample"] > 0
    assert report["first_batch_s"] > 0


def test_extensions_are_normalised_before_the_checks(tmp_path: Path) -> None:
    from stoker.errors import SourceError
    from stoker.format.foreign.base import Sample
    from stoker.pack.shard_writer import _prepare

    # A misnamed, undecodable "jpeg" is checked like a "jpg" (it used to pass unchecked).
    with pytest.raises(SourceError, match="cannot decode"):
        _prepare(Sample("a", {"jpeg": b"garbage"}, 0), PackConfig(), "where")
    with pytest.raises(SourceError, match="same extension twice"):
        _prepare(Sample("a", {"jpeg": b"x", "JPG": b"y"}, 0), PackConfig(), "where")
