"""An exact evaluation epoch over DDP ranks; run by torchrun in tests/distributed/test_exact_ddp.py.

torchrun --nproc_per_node=2 exact_eval.py DATASET OUT [--workers K]

Each rank runs its share of the epoch (``OrderConfig(exact=True)``: ranks' step counts may
differ by one), sums the real rows and their labels, and all-reduces both once at the end;
each rank writes what it saw and the reduced totals to ``OUT.rank<r>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from stoker.integrations.torch import TorchLoader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import CenterCrop


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 3, 4))
    )
    loader = TorchLoader(
        args.dataset,
        batch_size=4,
        num_workers=args.workers,
        transform=CenterCrop(16),
        order=OrderConfig(exact=True),
    )
    keys: list[str] = []
    steps = 0
    real = torch.zeros(2, dtype=torch.int64)  # rows, sum of their labels
    correct = torch.zeros(1, dtype=torch.int64)
    model.eval()
    # Ranks' step counts may differ by one: nothing collective inside the loop (the module
    # itself, not DDP's forward, which may broadcast buffers).
    with torch.no_grad():
        for batch in loader:
            mask = batch["real"]
            logits = model.module(batch["image"].float().div(255))
            correct += (logits.argmax(1) == batch["label"])[mask].sum()
            real += torch.stack([mask.sum(), batch["label"][mask].sum()])
            keys += list(batch["key"])
            steps += 1
    totals = real.clone()
    dist.all_reduce(totals)
    dist.all_reduce(correct)
    record = {
        "steps": steps,
        "keys": keys,
        "rows": int(real[0]),
        "totals": totals.tolist(),
        "correct": int(correct),
    }
    Path(f"{args.out}.rank{rank}").write_text(json.dumps(record))
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
