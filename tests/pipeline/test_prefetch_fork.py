"""A read-ahead the parent started is not waited for in a forked child.

A Loader that has run an epoch reads the next epoch's first batch ahead, on its I/O engine.
If the process forks before those reads complete (a DataLoader made right after an epoch),
their answers go to the parent: the child must fetch the batch itself, not wait forever.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from stoker.core.metrics import Stages
from stoker.format.index import read_index
from stoker.format.reader import ShardDataset
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.plan import plan_epoch
from stoker.pipeline.prefetch import Prefetcher
from stoker.pipeline.sources import DatasetSource
from stoker.pipeline.world import World
from stoker.storage import open_store
from stoker.storage.engine import IOEngine
from stoker.testing.forks import in_forked_child
from stoker.testing.images import write_image_folder

ORDER = OrderConfig(block_size=4, group_blocks=2)


def test_a_read_ahead_pending_at_the_fork_is_fetched_again_in_the_child(
    tmp_path: Path,
) -> None:
    write_image_folder(tmp_path / "src", files=24, classes=3, width=16, height=12)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=8))
    engine = IOEngine(max_in_flight=1)
    store = open_store(str(tmp_path / "ds"), engine=engine)
    source = DatasetSource(ShardDataset(store, read_index(store)))
    plan = plan_epoch(
        source.epoch_order(ORDER, 1),
        world=World(),
        batch_size=6,
        drop_last=False,
        group_samples=ORDER.group_samples,
    )
    prefetcher = Prefetcher(source, stages=Stages(), memory_bytes=None)
    holding, release = threading.Event(), threading.Event()

    async def hold_the_only_slot() -> None:
        async with engine.slot():
            holding.set()
            while not release.is_set():
                await asyncio.sleep(0.01)

    held = engine.submit(hold_the_only_slot())
    try:
        assert holding.wait(10)
        prefetcher.read_ahead(1, plan)  # its reads wait for the slot: pending at the fork
        assert prefetcher.reading_ahead

        def child() -> list[str]:
            stream = prefetcher.open(1, plan)
            keys = []
            for number in plan.mine:
                ids = plan.batches[number]
                stream.top_up()
                stream.wait(ids)
                keys += [sample["key"] for sample in stream.take(ids)]
            return keys

        keys = in_forked_child(child, timeout_s=30)
    finally:
        release.set()
        held.result(10)
        engine.close()
    assert len(keys) == 24
    assert len(set(keys)) == 24


def test_an_iteration_the_parent_started_is_refused_in_a_forked_child(tmp_path: Path) -> None:
    # Its decodes run on the parent's threads: the child's next() waited forever.
    write_image_folder(tmp_path / "src", files=48, classes=2, width=16, height=12)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=8))
    with Loader(str(tmp_path / "ds"), batch_size=4) as loader:
        started = iter(loader)
        assert len(next(started)["key"]) == 4
        with pytest.raises(AssertionError, match=r"RuntimeError: this iteration of the Loader"):
            in_forked_child(lambda: next(started), timeout_s=30)
        # A new iteration in the child reads the rest of the epoch itself.
        assert in_forked_child(lambda: sum(len(b["key"]) for b in loader), timeout_s=60) == 44
        assert sum(len(batch["key"]) for batch in started) == 44  # the parent's goes on
