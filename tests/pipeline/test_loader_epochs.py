"""A loader reused across epochs: the epoch read ahead goes on reading once it is asked for."""

from __future__ import annotations

import time

import pytest

from stoker.core.metrics import Stage
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_packed_images


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("epochs"),
        files=96,
        classes=4,
        width=16,
        height=12,
        samples_per_shard=32,
    )


def _fetches(loader: Loader) -> int:
    return loader.stats().stages[Stage.FETCH].calls


def test_the_epoch_read_ahead_fetches_its_next_read_groups_once_asked_for(dataset: str) -> None:
    """Its first batch was made ahead: waiting for it to be handed over before fetching
    more would make the batches after the first read group's wait (issue 25's stall a few
    batches into each later epoch)."""
    order = OrderConfig(block_size=8, group_blocks=2)  # a read group: 2 batches
    options = {"batch_size": 8, "transform": RandomResizedCrop(8), "order": order}
    with Loader(dataset, **options, prefetch=2) as loader:  # type: ignore[arg-type]
        chunks = len(loader._plan(0).chunks)
        for _ in loader:
            pass
        time.sleep(0.3)  # epoch 1's first read group comes in
        assert _fetches(loader) == chunks + 1  # only the first batch's, while not asked for
        batches = iter(loader)
        keys = list(next(batches)["key"])
        time.sleep(0.3)
        assert _fetches(loader) >= chunks + 2  # the next ones, before it is handed over
        keys += [key for batch in batches for key in batch["key"]]
        assert _fetches(loader) >= 2 * chunks  # each read group once, none twice
    with Loader(dataset, **options) as fresh:  # type: ignore[arg-type]
        fresh.set_epoch(1)
        assert [key for batch in fresh for key in batch["key"]] == keys
