"""The PyTorch adapter: tensors, DataLoader workers, and a real torchrun DDP run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from stoker import Loader, World
from stoker.format.reader import open_dataset
from stoker.integrations.torch import StokerIterableDataset, TorchLoader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_packed_images
from stoker.testing.seaweed import free_ports

ORDER = OrderConfig(block_size=4, group_blocks=2)


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("torch"),
        files=90,
        classes=5,
        width=48,
        height=40,
        samples_per_shard=12,
    )


def test_torch_loader_yields_tensors(dataset_url: str) -> None:
    loader = TorchLoader(
        dataset_url,
        batch_size=16,
        transform=RandomResizedCrop(24),
        channels_last=True,
        pin_memory=False,
    )
    opened = loader.dataset.opened()
    batches = list(loader)
    loader.set_epoch(1)
    assert len(list(loader)) == 6
    # One open dataset per process: the index is not read again every epoch.
    assert loader.dataset.opened() is opened
    assert len(batches) == len(loader) == 6
    assert batches[0]["image"].shape == (16, 3, 24, 24)
    assert batches[0]["image"].dtype == torch.uint8
    assert batches[0]["label"].dtype == torch.int64


def test_dataloader_workers_give_the_same_batches(dataset_url: str) -> None:
    reference = [
        b["key"]
        for b in TorchLoader(
            dataset_url, batch_size=10, order=ORDER, transform=RandomResizedCrop(8)
        )
    ]
    dataset = StokerIterableDataset(
        dataset_url, batch_size=10, order=ORDER, transform=RandomResizedCrop(8)
    )
    with_workers = [
        b["key"]
        for b in DataLoader(
            dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn"
        )
    ]
    assert with_workers == reference


def test_state_dict_resumes_with_another_worker_count(dataset_url: str) -> None:
    full = [
        b["key"]
        for b in TorchLoader(dataset_url, batch_size=9, order=ORDER, transform=RandomResizedCrop(8))
    ]
    first = TorchLoader(dataset_url, batch_size=9, order=ORDER, transform=RandomResizedCrop(8))
    stream = iter(first)
    head = [next(stream)["key"] for _ in range(4)]
    state = first.state_dict()
    assert state["batches"] == 4
    second = TorchLoader(
        dataset_url, batch_size=9, order=ORDER, num_workers=2, transform=RandomResizedCrop(8)
    )
    second.load_state_dict(state)
    tail = [b["key"] for b in second]
    assert head + tail == full


def _torchrun(script: Path, *args: str) -> None:
    (port,) = free_ports(1)  # torchrun's --master_port=0 hangs its rendezvous
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={port}",
        str(script),
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]


def test_torchrun_ddp_two_epochs_checkpoint_and_resume(dataset_url: str, tmp_path: Path) -> None:
    script = Path(__file__).with_name("ddp_train.py")
    _torchrun(script, dataset_url, str(tmp_path / "full"))
    full = [json.loads(Path(f"{tmp_path / 'full'}.rank{r}").read_text()) for r in range(2)]
    # Equal step counts on both ranks, every sample each epoch.
    for epoch in ("0", "1"):
        assert len(full[0][epoch]) == len(full[1][epoch]) > 0
        keys = [k for rank in full for step in rank[epoch] for k in step]
        assert len(set(keys)) == 90
    _torchrun(script, dataset_url, str(tmp_path / "cut"), "--stop-after", "2")
    checkpoint = tmp_path / "cut.ckpt"
    assert checkpoint.exists()
    _torchrun(script, dataset_url, str(tmp_path / "resumed"), "--resume", str(checkpoint))
    for rank in range(2):
        cut = json.loads(Path(f"{tmp_path / 'cut'}.rank{rank}").read_text())
        resumed = json.loads(Path(f"{tmp_path / 'resumed'}.rank{rank}").read_text())
        assert cut["1"] + resumed["1"] == full[rank]["1"]


def test_resume_onto_a_new_world_size(dataset_url: str) -> None:
    kwargs = {"batch_size": 6, "order": ORDER, "transform": RandomResizedCrop(8)}
    seen: list[str] = []
    states = []
    for rank in range(2):
        loader = TorchLoader(dataset_url, **kwargs, world=World(rank=rank, world_size=2))
        stream = iter(loader)
        seen += [k for _ in range(3) for k in next(stream)["key"]]
        states.append(loader.state_dict())
    assert states[0] == states[1]
    rest: list[str] = []
    for rank in range(3):
        resumed = TorchLoader(
            dataset_url, num_workers=rank % 2, **kwargs, world=World(rank=rank, world_size=3)
        )
        resumed.load_state_dict(states[0])
        assert resumed.state_dict()["segments"] == [[2, 18]]
        rest += [k for batch in resumed for k in batch["key"]]
    assert not set(rest) & set(seen)
    assert set(rest) | set(seen) == {
        f"class_{c:02d}/img_{i:06d}" for i in range(90) for c in [i % 5]
    }


def _decode_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("stoker-decode")}


def test_close_stops_an_iteration_and_its_threads(dataset_url: str) -> None:
    before = _decode_threads()
    with TorchLoader(
        dataset_url, batch_size=6, order=ORDER, transform=RandomResizedCrop(8)
    ) as loader:
        stream = iter(loader)
        next(stream)
        assert _decode_threads() - before  # decoding runs in this process
        state = loader.state_dict()
    assert not _decode_threads() - before  # the with block closed it
    assert state["batches"] == 1
    with pytest.raises(StopIteration):
        next(stream)  # a closed iteration is over
    # The loader holds no reference to its iteration: dropping one frees it at once. Its
    # decode threads stay for the next epoch, until close().
    again = iter(loader)
    next(again)
    dropped = weakref.ref(again)
    del again
    assert dropped() is None
    assert _decode_threads() - before
    loader.close()
    assert not _decode_threads() - before


def test_state_is_snapshotted_at_delivery(dataset_url: str) -> None:
    loader = TorchLoader(dataset_url, batch_size=6, order=ORDER, transform=RandomResizedCrop(8))
    states = []
    for _ in loader:
        states.append(loader.state_dict()["batches"])
    assert states == list(range(1, len(loader) + 1))
    assert loader.state_dict()["batches"] == 0  # the epoch is over


def test_dataloader_workers_resume_mid_epoch_exactly(dataset_url: str) -> None:
    options: dict[str, Any] = {
        "batch_size": 6,
        "order": ORDER,
        "transform": RandomResizedCrop(8),
        "num_workers": 2,
    }
    full = [b["key"] for b in TorchLoader(dataset_url, **options)]
    with TorchLoader(dataset_url, **options) as first:
        stream = iter(first)
        head = [next(stream)["key"] for _ in range(5)]  # an odd number: worker 1's turn next
        state = first.state_dict()
    assert state["batches"] == 5
    resumed = TorchLoader(dataset_url, **options)
    resumed.load_state_dict(state)
    assert head + [b["key"] for b in resumed] == full


def test_a_state_saved_after_an_epoch_does_not_replay_it(dataset_url: str) -> None:
    options: dict[str, Any] = {"batch_size": 6, "order": ORDER, "transform": RandomResizedCrop(8)}
    loader = TorchLoader(dataset_url, **options)
    first = [k for b in loader for k in b["key"]]
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    restored = TorchLoader(dataset_url, **options)
    restored.load_state_dict(state)
    again = [k for b in restored for k in b["key"]]
    loader.set_epoch(1)
    assert again == [k for b in loader for k in b["key"]] != first


def test_stats_and_trace_say_what_the_loader_says(dataset_url: str) -> None:
    options: dict[str, Any] = {"batch_size": 16, "order": ORDER, "transform": RandomResizedCrop(8)}
    with Loader(dataset_url, **options) as plain:
        for _ in plain:
            pass
        expected = plain.stats()
    torch_loader = TorchLoader(dataset_url, **options)
    torch_loader.trace()
    for _ in torch_loader:
        pass
    stats = torch_loader.stats()
    assert (stats.samples, stats.batches) == (expected.samples, expected.batches) == (90, 6)
    # Both loaders, reused across epochs, read and decode the next epoch's first batches
    # ahead, each at its own pace: up to two batches (of two read groups of two blocks).
    ahead = 2 * 16 * float(open_dataset(dataset_url).index.length.max())
    assert abs(stats.requests["bytes.read"] - expected.requests["bytes.read"]) <= ahead
    assert abs(stats.requests["requests.get"] - expected.requests["requests.get"]) <= 8
    assert set(stats.stages) == set(expected.stages)
    assert 90 <= stats.stages["decode"].items <= 90 + 2 * 16
    assert stats.epoch_samples == expected.epoch_samples
    assert stats.threads == expected.threads > 0
    # The next epoch adds to it: counts, stage totals and requests (one store, counted once).
    for _ in torch_loader:
        pass
    both = torch_loader.stats()
    assert (both.samples, both.batches) == (180, 12)
    assert 180 <= both.stages["decode"].items <= 180 + 2 * 16
    gets = stats.requests["requests.get"]
    assert gets < both.requests["requests.get"] <= 2 * gets
    stages = {e.stage for e in torch_loader.events()}
    assert {"fetch", "decode", "consumer.wait"} <= stages
    # Both epochs are in the timeline: as many waits for a batch as batches.
    assert sum(e.stage == "consumer.wait" for e in torch_loader.events()) == 12


def test_stats_and_trace_add_up_over_dataloader_workers(dataset_url: str) -> None:
    options: dict[str, Any] = {"batch_size": 16, "order": ORDER, "transform": RandomResizedCrop(8)}
    with TorchLoader(dataset_url, **options) as alone:
        for _ in alone:
            pass
    loader = TorchLoader(dataset_url, num_workers=2, **options)
    loader.trace()
    assert loader.stats().samples == 0
    for _ in loader:
        pass
    stats = loader.stats()
    assert (stats.samples, stats.batches) == (90, 6)
    # Each worker decoded its own batches: together, every sample once (and each, at its
    # epoch's end, its first batch of the next epoch, if it got to it by its last report).
    assert 90 <= stats.stages["decode"].items <= 90 + 2 * 16
    assert stats.stages["consumer.wait"].items == 90  # measured in this process
    assert stats.stages["consumer.wait"].calls == 6
    # Both workers read: at least every byte one process reads for the epoch.
    assert stats.requests["bytes.read"] >= alone.stats().requests["bytes.read"]
    assert stats.requests["requests.get"] > 0
    assert stats.epoch_samples == alone.stats().epoch_samples
    assert stats.threads == 2  # one decode thread in each worker
    events = loader.events()
    assert {"fetch", "decode", "consumer.wait", "consumer.step"} <= {e.stage for e in events}
    assert sum(e.stage == "decode" for e in events) == stats.stages["decode"].calls
    # A second epoch adds to the first.
    for _ in loader:
        pass
    assert (loader.stats().samples, loader.stats().batches) == (180, 12)


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_dataloader_that_batches_again_is_refused(
    dataset_url: str, workers: int, batch_size: int
) -> None:
    dataset = StokerIterableDataset(dataset_url, batch_size=8, transform=RandomResizedCrop(8))
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        multiprocessing_context="spawn" if workers else None,
    )
    with pytest.raises(TypeError, match=r"batch_size=None"):
        next(iter(loader))
    # Given batch_size=None, the same dataset gives batches of 8 with no extra dimension.
    batch = next(iter(DataLoader(dataset, batch_size=None)))
    assert batch["image"].shape == (8, 8, 8, 3)
