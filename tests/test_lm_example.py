"""examples/lm_pretrain.py under torchrun with two processes (gloo): each rank trains on its
own share of the sequences, and the half after the checkpoint continues exactly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from stoker.pipeline.order import OrderConfig
from stoker.pipeline.token_loader import TokenLoader
from stoker.pipeline.world import World
from stoker.testing.seaweed import free_ports

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lm_pretrain.py"
STEPS = 12


def test_two_ranks_train_checkpoint_and_resume_without_repeating_a_sequence(
    tmp_path: Path,
) -> None:
    (port,) = free_ports(1)  # torchrun's --master_port=0 hangs its rendezvous
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}"]
    args = [str(EXAMPLE), "--workdir", str(tmp_path), "--steps", str(STEPS)]
    done = subprocess.run(
        [sys.executable, *launcher, *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        assert f"rank {rank} resumed at step {STEPS // 2}" in done.stdout
    trained = []
    for rank in range(2):
        lines = (tmp_path / f"rank-{rank}.jsonl").read_text().splitlines()
        logged = [json.loads(line) for line in lines]
        assert [entry["step"] for entry in logged] == list(range(STEPS))
        # The rank's own share, in the order of an uninterrupted run: the half after the
        # checkpoint went on from where the first half stopped.
        expected = TokenLoader(
            tmp_path / "tokens",
            seq_len=64,
            batch_size=8,
            seed=0,
            order=OrderConfig(block_size=16),
            world=World(rank=rank, world_size=2),
        )
        uninterrupted = [b["index"].tolist() for _, b in zip(range(STEPS), expected, strict=False)]
        assert [entry["index"] for entry in logged] == uninterrupted
        trained += [i for entry in logged for i in entry["index"]]
    assert len(set(trained)) == len(trained) == 2 * STEPS * 8  # no sequence twice
    ends = re.findall(r"loss ([\d.]+) at step \d+, ([\d.]+) at the end", done.stdout)
    assert len(ends) == 2
    for first, last in ends:
        assert float(last) < float(first) < np.log(257)  # learning, better than guessing
