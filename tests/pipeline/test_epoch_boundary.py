"""A loader reused across epochs keeps reading and decoding across the boundary."""

from __future__ import annotations

import time
from typing import Literal

import pytest

from stoker import DecodeConfig
from stoker.core.metrics import Stage
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_packed_images

#: A training step's time: the next epoch's first reads, started as this epoch's last ones
#: go out (a few batches before its end), come in over the steps of its last batches.
STEP_S = 0.02
OPTIONS = {
    "batch_size": 8,
    "transform": RandomResizedCrop(8),
    "order": OrderConfig(block_size=8, group_blocks=2),  # a read group: 2 batches
    "prefetch": 2,
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("boundary"),
        files=96,
        classes=4,
        width=16,
        height=12,
        samples_per_shard=32,
    )


def _keys(loader: Loader) -> list[str]:
    return [key for batch in loader for key in batch["key"]]


@pytest.mark.parametrize("set_epoch", [False, True])
def test_the_first_epochs_end_reads_and_decodes_the_next_ones_start(
    dataset: str, set_epoch: bool
) -> None:
    with Loader(dataset, **OPTIONS) as loader:  # type: ignore[arg-type]
        chunks = len(loader._plan(0).chunks)
        delivered = 0
        for batch in loader:  # the first epoch this loader runs
            delivered += len(batch["key"])
            time.sleep(STEP_S)  # a training step, over which reads and decodes go on
        time.sleep(0.3)  # the last step: what was started ahead completes
        stats = loader.stats().stages
        # Epoch 1's first read group is in, and its first batch decoded, before it is asked.
        assert stats[Stage.FETCH].calls == chunks + 1
        assert stats[Stage.DECODE].items >= delivered + OPTIONS["batch_size"]  # type: ignore[operator]
        if set_epoch:
            loader.set_epoch(1)
        # (It was fetched and decoded before it was asked for: the counts above.)
        batches = iter(loader)
        first = next(batches)
        second = [key for batch in batches for key in batch["key"]]
        # Nothing fetched twice, and the epoch is the one a fresh loader gives.
        assert loader.stats().stages[Stage.FETCH].calls >= 2 * chunks
        epoch_1 = list(first["key"]) + second
    with Loader(dataset, **OPTIONS) as fresh:  # type: ignore[arg-type]
        fresh.set_epoch(1)
        assert _keys(fresh) == epoch_1


@pytest.mark.parametrize("method", ["thread", "process"])
def test_an_epoch_started_ahead_and_not_asked_for_is_dropped(
    dataset: str, method: Literal["thread", "process"]
) -> None:
    decode = DecodeConfig(threads=2, method=method)
    with Loader(dataset, **OPTIONS, decode=decode) as loader:  # type: ignore[arg-type]
        _keys(loader)
        time.sleep(0.2)  # epoch 1's first batches decode ahead (in processes: in slots)
        loader.set_epoch(5)  # not epoch 1: what was read ahead for it is not used
        batches = iter(loader)
        processes = loader._batches._processes  # type: ignore[union-attr]
        if method == "process":  # the dropped batches gave their shared-memory slots back
            assert processes is not None
            assert len(processes._free) == loader._decode_depth + 1
        epoch_5 = [key for batch in batches for key in batch["key"]]
        state = loader.state_dict()
    assert state["epoch"] == 6
    with Loader(dataset, **OPTIONS) as fresh:  # type: ignore[arg-type]
        fresh.set_epoch(5)
        assert _keys(fresh) == epoch_5
