"""Trains a tiny model with DDP through stoker's torch adapter; run by torchrun in a test.

torchrun --nproc_per_node=2 ddp_train.py DATASET OUT.json [--stop-after N] [--resume CKPT]
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
from stoker.pipeline.transforms import RandomResizedCrop


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out")
    parser.add_argument("--stop-after", type=int, default=-1, help="steps into epoch 1")
    parser.add_argument("--resume", default=None)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 3, 5))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = TorchLoader(
        args.dataset,
        batch_size=8,
        num_workers=args.workers,
        transform=RandomResizedCrop(16),
        order=OrderConfig(block_size=4, group_blocks=2),
    )
    start_epoch = 0
    if args.resume:
        checkpoint = torch.load(args.resume, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        loader.load_state_dict(checkpoint["loader"])
        start_epoch = checkpoint["loader"]["epoch"]
    log: dict[str, list[list[str]]] = {}
    for epoch in range(start_epoch, 2):
        loader.set_epoch(epoch) if not args.resume or epoch != start_epoch else None
        steps = log.setdefault(str(epoch), [])
        for batch in loader:
            images = batch["image"].float().div(255)
            loss = torch.nn.functional.cross_entropy(model(images), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps.append(list(batch["key"]))
            if epoch == 1 and len(steps) == args.stop_after:
                if rank == 0:
                    torch.save(
                        {"model": model.state_dict(), "loader": loader.state_dict()},
                        Path(args.out).with_suffix(".ckpt"),
                    )
                dist.barrier()
                break
        else:
            continue
        break
    Path(f"{args.out}.rank{rank}").write_text(json.dumps(log))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
