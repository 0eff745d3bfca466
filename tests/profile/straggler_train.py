"""A DDP run in which rank 1's input is slow (its transform sleeps), for the straggler check;
run by torchrun in tests/profile/test_stragglers.py.

torchrun --nproc_per_node=2 straggler_train.py DATASET OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from stoker.integrations.torch import TorchLoader
from stoker.profile.stragglers import find_straggler


def slow(image: object) -> np.ndarray:
    time.sleep(0.02)  # rank 1's samples cost 20 ms each to prepare
    return np.zeros((8, 8, 3), dtype=np.uint8)


def quick(image: object) -> np.ndarray:
    return np.zeros((8, 8, 3), dtype=np.uint8)


def main() -> None:
    dataset, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Linear(8 * 8 * 3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = TorchLoader(dataset, batch_size=4, transform=slow if rank == 1 else quick)
    for batch in loader:
        loss = model(batch["image"].float().flatten(1)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    stats: list[object] = [None, None]
    dist.all_gather_object(stats, loader.stats())
    if rank == 0:
        report = find_straggler(stats)  # type: ignore[arg-type]
        Path(out).write_text(json.dumps({**report.to_dict(), "summary": report.summary()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
