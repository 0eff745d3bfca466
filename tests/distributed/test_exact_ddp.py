"""Exact evaluation over DDP (issue 35, item 4): torchrun, 2 ranks, gloo, on CPU. Each rank
runs its share of an ``OrderConfig(exact=True)`` epoch (their step counts differ by one
here), and the real rows and the sum of their labels, all-reduced once after the loop,
equal the dataset's: every sample counted once. The run ending is the check that nothing
hangs (the subprocess has a timeout; no duration is asserted).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stoker import Loader
from stoker.pipeline.order import OrderConfig
from stoker.testing.images import write_packed_images
from stoker.testing.seaweed import free_ports

SCRIPT = Path(__file__).with_name("exact_eval.py")
SAMPLES = 41  # 21 and 20 on two ranks: 6 and 5 batches of 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """A packed dataset: its URL and the sum of its labels."""
    url = write_packed_images(
        tmp_path_factory.mktemp("exact_ddp"),
        files=SAMPLES,
        classes=4,
        width=24,
        height=20,
        samples_per_shard=10,
    )
    with Loader(url, batch_size=SAMPLES, order=OrderConfig(mode="none")) as loader:
        labels = int(next(iter(loader))["label"].sum())
    return url, labels


@pytest.mark.parametrize("workers", [0, 2])
def test_an_exact_evaluation_epoch_over_two_ranks(
    dataset: tuple[str, int], tmp_path: Path, workers: int
) -> None:
    url, labels = dataset
    (port,) = free_ports(1)  # torchrun's --master_port=0 hangs its rendezvous
    out = tmp_path / "eval"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={port}",
        str(SCRIPT),
        url,
        str(out),
        f"--workers={workers}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]
    assert [r["rows"] for r in ranks] == [21, 20]
    assert [r["steps"] for r in ranks] == [6, 5]  # one step apart, and no hang
    for record in ranks:
        assert record["totals"] == [SAMPLES, labels]
    keys = [key for record in ranks for key in record["keys"]]
    assert len(keys) == len(set(keys)) == SAMPLES
    assert ranks[0]["correct"] == ranks[1]["correct"]
