"""The straggler check (issue 32, item 10): the rank whose input holds a multi-rank run
back is named with why; a torchrun DDP run (gloo) whose rank 1 prepares samples slowly
names rank 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.core.metrics import StageTotals
from stoker.pipeline.stats import LoaderStats
from stoker.profile.stragglers import find_straggler
from stoker.testing.images import write_packed_images
from stoker.testing.seaweed import free_ports


def _stats(
    wait: float, step: float, *, fetch: float = 0.0, decode: float = 0.0, **requests: int
) -> LoaderStats:
    stages = {
        "consumer.wait": StageTotals(seconds=wait),
        "consumer.step": StageTotals(seconds=step),
        "wait.fetch": StageTotals(seconds=fetch),
        "wait.decode": StageTotals(seconds=decode),
    }
    return LoaderStats(stages=stages, requests=dict(requests))


def test_the_rank_that_waits_clearly_longest_is_named_with_why() -> None:
    ranks = [
        _stats(0.5, 10),
        _stats(4.0, 10, fetch=3.5, retries=40),
        _stats(0.6, 10),
        _stats(0.4, 10),
    ]
    found = find_straggler(ranks)
    assert found.straggler == 1
    assert found.median_wait_s == 0.5
    assert "waited 3.50 s for reads (fetch-bound)" in found.summary()
    assert "40 retries against a median of 0" in found.summary()
    assert found.to_dict()["ranks"][1]["retries"] == 40


def test_no_rank_is_named_when_none_stands_out() -> None:
    assert find_straggler([_stats(0.50, 10), _stats(0.55, 10), _stats(0.52, 10)]).straggler is None
    # Twice the others' wait, but a few milliseconds of a long iteration: jitter.
    assert find_straggler([_stats(0.001, 10), _stats(0.002, 10)]).straggler is None
    assert find_straggler([_stats(5.0, 1)]).straggler is None  # one rank: no one to compare
    with pytest.raises(ValueError, match="no stats"):
        find_straggler([])


def test_a_torchrun_ddp_run_names_its_slow_rank(tmp_path: Path) -> None:
    url = write_packed_images(tmp_path / "data", files=48, classes=2, width=16, height=12)
    (port,) = free_ports(1)
    script = Path(__file__).with_name("straggler_train.py")
    out = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        f"--master_port={port}", str(script), url, str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["straggler"] == 1, report["summary"]
    assert "decode-bound" in report["summary"]
