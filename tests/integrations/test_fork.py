"""DataLoader workers started by fork (torch's default on Linux) after the parent used stoker.

The parent's I/O engine thread and obstore's native runtime do not survive a fork; a forked
worker must get working ones of its own, whatever the parent did first. Each DataLoader has
a timeout, so that a regression fails the test instead of hanging it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from stoker import DecodeConfig, Loader, World
from stoker.format.reader import ShardDataset, open_dataset
from stoker.integrations.torch import StokerIterableDataset
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.storage.transfer import upload
from stoker.testing.images import write_image_folder

FILES = 40
WORKERS = 2
TIMEOUT_S = 60.0  # per batch: a worker that hangs fails the test


@pytest.fixture
def source_folder(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    write_image_folder(root, files=FILES, classes=4, width=32, height=24)
    return root


@pytest.fixture
def packed_url(s3_bucket: Any, source_folder: Path) -> tuple[str, dict[str, Any]]:
    url = f"{s3_bucket.url}/packed"
    pack(
        source_folder,
        url,
        config=PackConfig(samples_per_shard=8),
        storage_options=s3_bucket.options(),
    )
    return url, s3_bucket.options()


@pytest.fixture
def folder_url(s3_bucket: Any, source_folder: Path) -> tuple[str, dict[str, Any]]:
    upload(source_folder, s3_bucket.store("folder"))
    return f"{s3_bucket.url}/folder", s3_bucket.options()


def forked(dataset: Dataset[Any], **options: Any) -> DataLoader[Any]:
    # "fork" is DataLoader's default on Linux; named so the test holds wherever it runs.
    return DataLoader(
        dataset,
        num_workers=WORKERS,
        multiprocessing_context="fork",
        timeout=TIMEOUT_S,
        **options,
    )


def exactly_once(keys: list[str], expected: list[str]) -> None:
    repeated = sorted(k for k, n in Counter(keys).items() if n > 1)
    assert not repeated, f"delivered more than once: {repeated[:5]}"
    assert sorted(keys) == sorted(expected)


class Samples(Dataset[str]):
    """Map-style: each item read from a dataset the parent opened (and read from)."""

    def __init__(self, opened: ShardDataset) -> None:
        self.opened = opened

    def __len__(self) -> int:
        return len(self.opened)

    def __getitem__(self, i: int) -> str:
        key: str = self.opened[i]["key"]
        return key


def test_workers_read_a_dataset_the_parent_opened_and_read(
    packed_url: tuple[str, dict[str, Any]],
) -> None:
    url, options = packed_url
    opened = open_dataset(url, storage_options=options)
    assert opened[0]["key"]  # the parent has made requests: its engine and runtime run
    keys = list(forked(Samples(opened), batch_size=None))
    exactly_once(keys, list(opened.index.keys))
    assert opened[1]["key"]  # and the parent's own store still works afterwards


def test_iterable_dataset_after_the_parent_read_its_index(
    packed_url: tuple[str, dict[str, Any]],
) -> None:
    url, options = packed_url
    dataset = StokerIterableDataset(
        url,
        batch_size=6,
        storage_options=options,
        order=OrderConfig(block_size=4, group_blocks=2),
        transform=RandomResizedCrop(8),
    )
    assert len(dataset.class_names) == 4
    batches = dataset.batches_per_epoch()
    delivered = list(forked(dataset, batch_size=None))
    assert len(delivered) == batches
    keys = dataset.opened().datasets[0].index.keys
    exactly_once([k for b in delivered for k in b["key"]], list(keys))


class PerWorker(IterableDataset[list[str]]):
    """Iterates, in DataLoader worker ``w``, the Loader the parent made for worker ``w``."""

    def __init__(self, loaders: list[Loader]) -> None:
        self.loaders = loaders

    def __iter__(self) -> Iterator[list[str]]:
        info = get_worker_info()
        assert info is not None
        for batch in self.loaders[info.id]:
            yield list(batch["key"])


@pytest.mark.parametrize("source", ["packed", "folder"])
def test_loaders_made_in_the_parent_run_in_forked_workers(
    source: str, request: pytest.FixtureRequest
) -> None:
    url, options = request.getfixturevalue(f"{source}_url")
    loaders = [
        Loader(
            url,
            batch_size=5,
            storage_options=options,
            world=World(worker=w, num_workers=WORKERS),
            decode=DecodeConfig(threads=1),
            transform=RandomResizedCrop(8),
        )
        for w in range(WORKERS)
    ]
    # The parent runs two epochs: its decode threads start, and the second epoch's end
    # starts reading the next epoch's first batch ahead, on the parent's engine.
    for _ in range(2):
        expected = [k for loader in loaders for batch in loader for k in batch["key"]]
        exactly_once(expected, expected)
        assert len(expected) == FILES
    keys = [k for batch in forked(PerWorker(loaders), batch_size=None) for k in batch]
    exactly_once(keys, expected)
