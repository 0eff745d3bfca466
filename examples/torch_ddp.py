"""Train a small model with PyTorch DDP on two CPU processes, each reading its own share.

Runs as is against a throwaway SeaweedFS server (needs `pip install 'stoker[demo,torch]'`);
rank 0 starts the server and packs the data, then both ranks train:

    torchrun --nproc_per_node=2 examples/torch_ddp.py
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import stoker
from stoker import OrderConfig
from stoker.integrations.torch import TorchLoader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import SeaweedServer


def prepare(stack: contextlib.ExitStack) -> dict[str, Any]:
    """Start the server, pack 256 JPEGs into s3://example/train; return storage options."""
    server = stack.enter_context(SeaweedServer())
    scratch = stack.enter_context(tempfile.TemporaryDirectory())
    server.create_bucket("example")
    options = server.storage_options()
    write_image_folder(Path(scratch, "src"), files=256, classes=4, width=40, height=40)
    stoker.pack(
        Path(scratch, "src"),
        "s3://example/train",
        storage_options=options,
        config=stoker.PackConfig(samples_per_shard=64),
    )
    return options


def main() -> None:
    dist.init_process_group("gloo")  # torchrun sets rank, world size and rendezvous
    rank, world = dist.get_rank(), dist.get_world_size()
    with contextlib.ExitStack() as stack:
        shared: list[Any] = [prepare(stack) if rank == 0 else None]
        dist.broadcast_object_list(shared, src=0)  # rank 0's storage options to everyone

        # Ranks come from torch.distributed. Read groups of 16 samples: the default groups
        # (about 1,000 samples) are what ranks split, and this dataset has only 256.
        loader = TorchLoader(
            "s3://example/train",
            batch_size=16,
            transform=RandomResizedCrop(16, scale=(0.5, 1.0)),
            order=OrderConfig(block_size=8, group_blocks=2),
            storage_options=shared[0],
        )
        torch.manual_seed(0)
        model = DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 3, 4))
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(2):
            loader.set_epoch(epoch)  # a new order every epoch, split anew between ranks
            seen: list[str] = []
            for batch in loader:
                images = batch["image"].permute(0, 3, 1, 2).float().div(255)
                loss = torch.nn.functional.cross_entropy(model(images), batch["label"])
                optimizer.zero_grad()
                loss.backward()  # DDP averages gradients over both ranks
                optimizer.step()
                seen += batch["key"]
            everyone: list[Any] = [None] * world
            dist.all_gather_object(everyone, seen)
            if rank == 0:
                distinct = len({key for keys in everyone for key in keys})
                print(
                    f"epoch {epoch}: {len(loader)} steps per rank, {distinct} distinct "
                    f"samples over {world} ranks, last loss {loss.item():.3f}"
                )
        dist.barrier()  # everyone is done reading before rank 0 stops the server
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
