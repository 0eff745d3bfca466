"""FIFOs, sockets, devices and dangling links in a source folder: never read, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.testing.images import write_image_folder


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_image_folder(src, files=4, classes=1, width=16, height=12)
    os.mkfifo(src / "class_00" / "fifo.jpg")  # opening it for reading would block forever
    (src / "class_00" / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    return src


def _stoker(*args: str) -> subprocess.CompletedProcess[str]:
    # A subprocess with a timeout: a regression would hang, and must fail instead.
    command = [sys.executable, "-m", "stoker", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_upload_skips_what_is_not_a_regular_file(source: Path, tmp_path: Path) -> None:
    dangling = source / "class_00" / "dangling.jpg"
    dangling.unlink()
    done = _stoker("upload", str(source), str(tmp_path / "up"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["files_transferred"] == 4
    assert report["not_regular"] == [{"key": "class_00/fifo.jpg", "what": "a FIFO"}]
    # A dangling link is one failure: every regular file is still uploaded.
    dangling.symlink_to(tmp_path / "nowhere.jpg")
    failed = _stoker("upload", str(source), str(tmp_path / "up2"))
    assert failed.returncode == 1
    assert "class_00/dangling.jpg: a dangling symbolic link" in failed.stdout + failed.stderr
    assert "fifo.jpg" in failed.stdout + failed.stderr  # skipped, and said
    assert sorted(p.name for p in (tmp_path / "up2" / "class_00").iterdir()) == [
        f"img_{i:06d}.jpg" for i in range(4)
    ]


def test_pack_names_a_dangling_link_or_skips_and_lists_it(source: Path, tmp_path: Path) -> None:
    refused = _stoker("pack", str(source), str(tmp_path / "refused"))
    assert refused.returncode == 1
    assert "dangling.jpg: a dangling symbolic link" in refused.stderr
    packed = _stoker("pack", str(source), str(tmp_path / "ds"), "--on-error", "skip")
    assert packed.returncode == 0, packed.stderr
    said = packed.stdout + packed.stderr
    assert "fifo.jpg: a FIFO, not a regular file" in said
    assert "dangling.jpg: a dangling symbolic link" in said
    index = json.loads((tmp_path / "ds" / "index.json").read_text(encoding="utf-8"))
    assert index["samples"] == 4
