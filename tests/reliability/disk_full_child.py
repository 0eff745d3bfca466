"""Run by test_disk_full.py in a private mount namespace: download onto a tiny tmpfs.

Usage: python disk_full_child.py SPEC_JSON, where SPEC_JSON holds ``url``, ``options``
(storage options), ``disk`` (a directory to mount the tmpfs on), ``small`` and ``large``
(tmpfs sizes such as "2m"). Prints one JSON object: what the download onto the small disk
raised and left behind, and what a rerun after growing the disk did. Exit status 3 means the
tmpfs could not be mounted.

The mount lives only as long as this process's namespace: nothing is left mounted on the
machine, whatever happens to the test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from stoker.errors import TransferError
from stoker.storage import open_store
from stoker.storage.checksum import md5_tree
from stoker.storage.transfer import TransferConfig, download


def _mount(disk: Path, options: str) -> None:
    mount = shutil.which("mount") or "/bin/mount"
    result = subprocess.run(
        [mount, "-t", "tmpfs", "-o", options, "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        print(f"cannot mount a tmpfs on {disk}: {result.stderr.strip()}", file=sys.stderr)
        raise SystemExit(3)


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    disk = Path(spec["disk"])
    _mount(disk, f"size={spec['small']}")
    store = open_store(spec["url"], storage_options=spec["options"])
    dst = disk / "dst"
    out: dict[str, Any] = {}
    try:
        download(store, dst, config=TransferConfig(workers=4))
        out["first"] = {"raised": None}
    except TransferError as exc:
        out["first"] = {
            "raised": type(exc).__name__,
            "message": str(exc),
            "failures": exc.failures,
            "cause": repr(exc.__cause__),
        }
    out["first"]["left"] = md5_tree(disk)
    _mount(disk, f"remount,size={spec['large']}")
    report = download(store, dst, config=TransferConfig(workers=4))
    out["rerun"] = {
        "transferred": report.files_transferred,
        "skipped": report.files_skipped,
        "files": md5_tree(dst),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
