"""Counts that add up: samples per epoch are the samples delivered, not batches times the
batch size, and the cost of an epoch follows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker import World
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig, epoch_order
from stoker.pipeline.stats import LoaderStats, samples_per_epoch
from stoker.testing.images import write_image_folder

ORDER = OrderConfig(block_size=4, group_blocks=2)


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
