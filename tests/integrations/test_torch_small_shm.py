"""DataLoader workers with a small /dev/shm (issue 32, item 5): Docker's default 64 MiB holds
fewer than two batches of 256 images of 224 px. A DataLoader worker's feeder thread moved
each batch into shared memory, and where that failed it printed "No space left on device"
and dropped the batch: the training process waited forever, or ended the epoch with samples
missing and exit status 0. Now TorchLoader's workers send what does not fit through their
pipes (every sample arrives, and a warning says why and what to change), and a plain
DataLoader over a StokerIterableDataset stops at once with an error naming the sizes and the
fix.

Each run is a child process in a private mount namespace (``unshare --mount`` as root,
``unshare --user --map-root-user --mount`` otherwise) with a 64 MiB tmpfs over /dev/shm; the
mount disappears with the child. Where neither is permitted, the test fails and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stoker.testing.images import write_packed_images

CHILD = Path(__file__).with_name("small_shm_child.py")
SAMPLES = 600
SHM_SIZE = "64m"
#: A guard only: the runs take seconds; a worker's lost batch used to make them hang.
HANG_S = 180


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("small-shm"), files=SAMPLES, classes=4, width=96, height=72
    )


def _namespace_command() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail(
            "this test needs util-linux `unshare` to mount a small /dev/shm in a private "
            "mount namespace"
        )
    if os.geteuid() == 0:
        return [unshare, "--mount", "--propagation", "private"]
    return [unshare, "--user", "--map-root-user", "--mount"]


def _run_child(url: str, mode: str) -> tuple[dict[str, Any], str]:
    command = [*_namespace_command(), sys.executable, str(CHILD), url, mode, SHM_SIZE]
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=HANG_S, check=False)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(
            f"{mode} with a {SHM_SIZE} /dev/shm did not finish within {HANG_S} s (a hang); "
            f"its stderr ends: {stderr[-2000:]}"
        )
    if child.returncode != 0 and (child.stderr.startswith("unshare:") or child.returncode == 3):
        pytest.fail(f"cannot make a small /dev/shm for this test: {child.stderr.strip()}")
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout), child.stderr


def test_torch_loader_workers_deliver_every_sample_with_a_small_shm(dataset_url: str) -> None:
    result, stderr = _run_child(dataset_url, "torch_loader")
    assert "raised" not in result, result
    assert sorted(result["indices"]) == list(range(SAMPLES))  # each sample, once
    # It said why batches took the slower way, and what to change.
    assert "/dev/shm has no room for a DataLoader worker's batch of 36.8 MiB" in stderr
    assert "it is 64 MiB" in stderr
    assert "docker run --shm-size=" in stderr


def test_a_plain_data_loader_stops_at_once_naming_the_size_and_the_fix(
    dataset_url: str,
) -> None:
    result, _ = _run_child(dataset_url, "data_loader")
    assert result.get("raised") == "OSError", result
    message = result["message"]
    assert "/dev/shm has no room for a DataLoader worker's batch of 36.8 MiB" in message
    assert "it is 64 MiB" in message
    assert "docker run --shm-size=" in message
    assert "emptyDir" in message
