"""A process that used TorchLoader's workers exits quietly (issue 25): no "terminate called
without an active exception" from a worker still making its next epoch's first batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# A worker's first batch of the next epoch in the making (torch ops, each letting go of the
# GIL and taking it back, as turning a batch into tensors in shared memory does) when the
# process exits: the DataLoader stops its workers at the end of training.
SCRIPT = """
import time
import torch
from stoker.integrations.torch_workers import NextEpoch

def batches():
    x = torch.ones(64, 64)
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        x = torch.tanh(x @ x)
    yield {"image": x}

NextEpoch({"epoch": 1}, batches())
time.sleep(0.1)  # it is under way
"""


def test_a_process_exits_cleanly_while_a_next_epoch_is_being_made(tmp_path: Path) -> None:
    script = tmp_path / "exit.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "terminate called" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]  # not killed by SIGABRT (-6)
