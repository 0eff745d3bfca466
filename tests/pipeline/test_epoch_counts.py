"""Counts that add up: samples per epoch are the samples delivered, not batches times the
batch size, and the cost of an epoch follows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker import World
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.config import CacheConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig, epoch_order
from stoker.pipeline.stats import LoaderStats, samples_per_epoch
from stoker.testing.images import write_image_folder

ORDER = OrderConfig(block_size=4, group_blocks=2)
PAGE = 32 << 10


@pytest.mark.parametrize(
    ("world_size", "drop_last", "expected"),
    [(1, False, 103), (1, True, 100), (3, False, 35), (3, True, 30)],
)
def test_samples_per_epoch_counts_what_a_rank_delivers(
    world_size: int, drop_last: bool, expected: int
) -> None:
    order = epoch_order([40, 40, 23], config=ORDER, epoch=0)
    for rank in range(world_size):
        world = World(rank=rank, world_size=world_size)
        got = samples_per_epoch(order, world=world, batch_size=10, drop_last=drop_last)
        assert got == expected


def test_cost_per_epoch_scales_by_samples_delivered() -> None:
    stats = LoaderStats(samples=50, epoch_samples=103, requests={"requests.get": 10})
    assert stats.cost_per_epoch().requests == pytest.approx(10 * 103 / 50)


def test_loader_stats_epoch_samples_are_delivered_samples(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=103, classes=2, width=16, height=16)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=40))
    with Loader(str(tmp_path / "ds"), batch_size=10, order=ORDER) as loader:
        delivered = sum(len(b["label"]) for b in loader)
        assert loader.stats().epoch_samples == delivered == 103


@pytest.mark.parametrize("workers", [2, 3])
def test_each_worker_reads_the_disk_cache_once_per_epoch(tmp_path: Path, workers: int) -> None:
    # Cache pages of several samples: a page holds samples of several batches, and of
    # every worker's batches.
    write_image_folder(tmp_path / "src", files=120, classes=3, width=48, height=32)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=40))
    data = sum(p.stat().st_size for p in (tmp_path / "ds").glob("*.tar"))
    cache = CacheConfig(dir=str(tmp_path / "cache"), page_bytes=PAGE)
    with Loader(str(tmp_path / "ds"), batch_size=8, cache=cache) as warm:
        assert sum(len(b["label"]) for b in warm) == 120  # fills the cache
    for w in range(workers):
        world = World(worker=w, num_workers=workers)
        with Loader(str(tmp_path / "ds"), batch_size=8, cache=cache, world=world) as loader:
            for epoch in (1, 2, 3):
                loader.set_epoch(epoch)
                assert sum(len(b["label"]) for b in loader) > 0
            read = loader.stats().disk_cache["cache.bytes_hit"]
            # Each page this worker needs, once an epoch (the next epoch's first read group,
            # read ahead, on top).
            ahead = min(loader.order_config.group_samples, 120) * data / 120
            assert read <= 3 * 1.05 * data + ahead + 3 * PAGE, (w, read / data)
