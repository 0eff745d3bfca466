"""A download onto a disk that fills up: a clear error, nothing half-written, and a rerun
after freeing space completes.

The disk is a 2 MB tmpfs mounted in a private mount namespace (``unshare --mount`` as root,
``unshare --user --map-root-user --mount`` otherwise), by a child process that runs the
download; the mount disappears with the child. Where neither is permitted, the test fails and
says why: it must not pass without having filled a disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.storage.checksum import md5_tree
from stoker.storage.transfer import PARTIAL_SUFFIX, upload

CHILD = Path(__file__).with_name("disk_full_child.py")
MiB = 1024 * 1024


def _namespace_command() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail(
            "this test needs util-linux `unshare` to mount a small tmpfs in a private mount "
            "namespace (a full disk cannot be simulated without one)"
        )
    if os.geteuid() == 0:
        return [unshare, "--mount", "--propagation", "private"]
    return [unshare, "--user", "--map-root-user", "--mount"]


def test_download_onto_a_full_disk(s3_bucket, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "small").mkdir(parents=True)
    for i in range(60):  # 3.6 MB of small files: about half fit on the 2 MB disk
        (source / "small" / f"f{i:02d}.bin").write_bytes(os.urandom(60_000 + i))
    (source / "large.bin").write_bytes(os.urandom(6 * MiB))  # in parts; cannot fit at all
    upload(source, s3_bucket.store("data"))
    expected = md5_tree(source)
    disk = tmp_path / "disk"
    disk.mkdir()
    spec = {
        "url": f"{s3_bucket.url}/data",
        "options": s3_bucket.options(part_size_bytes=5 * MiB, multipart_threshold_bytes=5 * MiB),
        "disk": str(disk),
        "small": "2m",
        "large": "32m",
    }
    child = subprocess.run(
        [*_namespace_command(), sys.executable, str(CHILD), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if child.returncode != 0 and (child.stderr.startswith("unshare:") or child.returncode == 3):
        pytest.fail(f"cannot make a small disk for this test: {child.stderr.strip()}")
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)

    first = result["first"]
    assert first["raised"] == "TransferError"
    message = first["message"]
    assert message.startswith("download stopped: no space left on device writing ")
    assert f"{disk}/dst/" in message  # names the file it was writing
    assert "rerun to resume" in message
    assert "No space left on device" in first["cause"]
    left = first["left"]
    assert not [name for name in left if name.endswith(PARTIAL_SUFFIX)]
    assert 0 < len(left) < len(expected)
    for name, digest in left.items():  # whatever is there under a final name is complete
        assert digest == expected[name.removeprefix("dst/")], name

    rerun = result["rerun"]
    assert rerun["files"] == expected
    assert rerun["skipped"] == len(left)
    assert rerun["transferred"] == len(expected) - len(left)
