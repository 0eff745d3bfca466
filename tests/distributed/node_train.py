"""One rank of a data-parallel job on several nodes, reading through stoker (run by torchrun).

torchrun ... node_train.py DATASET OUT_DIR --storage-options JSON --cache-dir DIR
    [--epochs 2] [--checkpoint-every 2] [--pause-at STEP] [--page-bytes N] [--group-samples N]

Each rank rewrites ``OUT_DIR/rank{R}-restart{N}.json`` after every step (atomically, so a
killed rank leaves its last whole record): its node (``STOKER_NODE``), world, the state it
resumed from, and per epoch the keys of each step and the bytes and GETs the store served this
rank. Global rank 0 saves ``OUT_DIR/checkpoint.pt`` (model and loader state) every
``--checkpoint-every`` steps; a rank started again by torchrun after a failure loads it and
goes on from there, on whatever world size the new rendezvous made. With ``--pause-at S``,
every rank of the first attempt waits after the checkpoint at step S of epoch 1 until
``OUT_DIR/release`` exists, so a test can kill a node at a known point of the epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from stoker.integrations.torch import TorchLoader
from stoker.pipeline.config import CacheConfig
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop


def _write(path: Path, record: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record))
    partial.replace(path)


def _step(model: torch.nn.Module, world_size: int, lr: float = 0.01) -> None:
    # What DDP and SGD do, by hand: constructing either imports torch._dynamo, seconds of
    # CPU per process, and the test starts six of them on two cores.
    with torch.no_grad():
        for parameter in model.parameters():
            assert parameter.grad is not None
            dist.all_reduce(parameter.grad)
            parameter -= lr * parameter.grad / world_size


def _store_counts(loader: TorchLoader) -> dict[str, int]:
    requests = loader.stats().requests
    return {"bytes": requests.get("bytes.read", 0), "gets": requests.get("requests.get", 0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out", type=Path)
    parser.add_argument("--storage-options", type=json.loads, required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--pause-at", type=int, default=-1, help="step of epoch 1")
    parser.add_argument("--page-bytes", type=int, default=4096, help="of the disk cache")
    parser.add_argument("--group-samples", type=int, default=8, help="samples per read")
    args = parser.parse_args()
    started = time.time()
    dist.init_process_group("gloo")
    times = {"main": started, "init": time.time()}
    rank, world_size = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 3, 6))
    times["model"] = time.time()
    loader = TorchLoader(
        args.dataset,
        batch_size=8,
        seed=7,
        transform=RandomResizedCrop(16),
        order=OrderConfig(block_size=args.group_samples, group_blocks=1),
        cache=CacheConfig(dir=args.cache_dir, page_bytes=args.page_bytes),
        storage_options=args.storage_options,
    )
    checkpoint_path = args.out / "checkpoint.pt"
    record: dict[str, Any] = {
        "node": os.environ.get("STOKER_NODE"),
        "rank": rank,
        "world_size": world_size,
        "restart": restart,
        "resumed_from": None,
        "epochs": {},
        "times": {**times, "loader": time.time()},
    }
    start_epoch, resumed = 0, False
    if checkpoint_path.exists():
        checkpoint = torch.load(checkpoint_path, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        loader.load_state_dict(checkpoint["loader"])
        record["resumed_from"] = checkpoint["loader"]
        start_epoch, resumed = checkpoint["loader"]["epoch"], True
    path = args.out / f"rank{rank}-restart{restart}.json"
    for epoch in range(start_epoch, args.epochs):
        if not (resumed and epoch == start_epoch):
            loader.set_epoch(epoch)
        before = _store_counts(loader)
        log: dict[str, Any] = {"steps": [], "complete": False}
        record["epochs"][str(epoch)] = log
        first_step = loader.state_dict()["batches"]
        for step, batch in enumerate(loader, start=first_step + 1):
            images = batch["image"].float().div(255)
            loss = torch.nn.functional.cross_entropy(model(images), batch["label"])
            model.zero_grad()
            loss.backward()
            try:
                _step(model, world_size)
            except RuntimeError:  # a peer is gone: torchrun starts this rank again
                record["times"]["failed"] = time.time()
                _write(path, record)
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)  # now, not after seconds of tearing down threads and gloo
            log["steps"].append(list(batch["key"]))
            record["times"].setdefault("first_step", time.time())
            _write(path, record)
            if step % args.checkpoint_every == 0:
                if rank == 0:
                    state = {"model": model.state_dict(), "loader": loader.state_dict()}
                    torch.save(state, args.out / "checkpoint.partial")
                    (args.out / "checkpoint.partial").replace(checkpoint_path)
                dist.barrier()
            if restart == 0 and epoch == 1 and step == args.pause_at:
                (args.out / f"paused.rank{rank}").touch()
                deadline = time.monotonic() + 120
                while not (args.out / "release").exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
        after = _store_counts(loader)
        log.update(
            complete=True,
            store_bytes=after["bytes"] - before["bytes"],
            store_gets=after["gets"] - before["gets"],
        )
        record["times"][f"epoch{epoch}"] = time.time()
        _write(path, record)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
