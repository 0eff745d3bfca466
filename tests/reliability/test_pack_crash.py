"""pack() killed at any point resumes: a real SIGKILL mid-run, and every state its commit
order can leave behind (plan written; a shard without its record; every record but no
index; index.bin without index.json). Nothing is locked, so nothing stale can block a rerun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.format.reader import open_dataset
from stoker.format.spec import PACK_STATE_DIR
from stoker.pack.packer import PackConfig, pack
from stoker.storage.transfer import upload
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import LinkConfig, NetProxy


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


CRASH_POINTS = {
    # What is deleted from a finished pack to recreate the state a crash leaves.
    "after the plan": lambda names: [n for n in names if n != f"{PACK_STATE_DIR}/plan.json"],
    "a shard without its record": lambda names: [
        f"{PACK_STATE_DIR}/shard-000001.json",
        f"{PACK_STATE_DIR}/shard-000004.json",
        "index.bin",
        "index.json",
    ],
    "every record, no index": lambda names: ["index.bin", "index.json"],
    "index.bin without index.json": lambda names: ["index.json"],
}
REUSED = {
    "after the plan": 0,
    "a shard without its record": 4,
    "every record, no index": 6,
    "index.bin without index.json": 6,
}


@pytest.mark.parametrize("crash", list(CRASH_POINTS))
def test_pack_resumes_from_every_crash_point(crash: str, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=60, classes=3, width=48, height=40)
    config = PackConfig(samples_per_shard=10)
    pack(tmp_path / "src", tmp_path / "whole", config=config)
    finished = _files(tmp_path / "whole")
    dst = tmp_path / "crashed"
    pack(tmp_path / "src", dst, config=config)
    for name in CRASH_POINTS[crash](sorted(finished)):
        (dst / name).unlink()

    report = pack(tmp_path / "src", dst, config=config)

    assert report.shards_reused == REUSED[crash]
    assert (report.samples, report.shards) == (60, 6)
    assert _files(dst) == finished  # byte for byte what an uninterrupted run writes
    assert open_dataset(dst).verify().ok


def test_sigkill_during_pack_from_a_bucket(s3_bucket, s3_server, tmp_path: Path) -> None:
    """Kill `stoker pack` (bucket to bucket) with SIGKILL mid-run; the same command run
    again completes: index valid, every shard verified, every sample exactly once."""
    write_image_folder(tmp_path / "src", files=300, classes=5, width=48, height=40)
    upload(tmp_path / "src", s3_bucket.store("raw"))
    options = s3_bucket.options()
    dst = f"{s3_bucket.url}/ds"
    command = [sys.executable, "-m", "stoker", "pack", f"{s3_bucket.url}/raw", dst]
    command += ["--samples-per-shard", "10", "--workers", "2", "--no-progress"]
    store = s3_bucket.store("ds")
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }
    # Through a 20 ms link, so that the kill lands while shards are being written.
    with NetProxy("127.0.0.1", s3_server.port, link=LinkConfig(rtt_s=0.02)) as slow:
        child = subprocess.Popen(
            command,
            env={**env, "AWS_ENDPOINT_URL": slow.endpoint},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        records: list[str] = []
        while time.monotonic() < deadline and len(records) < 5 and child.poll() is None:
            records = [m.key for m in store.list(PACK_STATE_DIR) if "shard-" in m.key]
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    done_before = len([m for m in store.list(PACK_STATE_DIR) if "shard-" in m.key])
    assert 0 < done_before < 30, "the kill should land mid-pack"
    with pytest.raises(FileNotFoundError):
        store.head("index.json")  # no index before every shard is complete

    rerun = subprocess.run(
        [*command, "--json"],
        env={**env, "AWS_ENDPOINT_URL": options["endpoint_url"]},
        capture_output=True,
        text=True,
        check=False,
    )
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout)
    assert report["samples"] == 300
    assert report["shards_reused"] >= done_before
    dataset = open_dataset(dst, storage_options=options)
    check = dataset.verify()
    assert check.ok, check.corrupt
    assert check.samples == len(dataset) == 300
    keys = list(dataset.index.keys)
    assert len(set(keys)) == 300  # no sample twice
    originals = {
        p.relative_to(tmp_path / "src").with_suffix("").as_posix()
        for p in (tmp_path / "src").rglob("*.jpg")
    }
    assert set(keys) == originals
    shards = sorted(m.key for m in store.list("") if m.key.endswith(".tar"))
    assert shards == sorted(s.name for s in dataset.shards)  # no orphan shard
