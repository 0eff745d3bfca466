"""Loader.stats(): per-stage times, consumer wait against step time, cost, timeline, log."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from stoker import DecodeConfig, OrderConfig, Stage, World, open_dataset
from stoker.core.pricing import StoragePrices
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_image_folder, write_packed_images


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("stats"),
        files=64,
        classes=4,
        width=64,
        height=48,
        samples_per_shard=16,
    )


def test_every_stage_is_timed_and_counts_its_items(dataset_url: str) -> None:
    with Loader(dataset_url, batch_size=16, transform=RandomResizedCrop(16)) as loader:
        loader.read_ahead = False  # one epoch: the next one's start is not read
        list(loader)
        stats = loader.stats()
    stages = stats.stages
    assert stages["index"].calls == 1
    assert stages["fetch"].items == 64
    assert stages["fetch"].bytes == int(loader.dataset.index.length.sum())
    assert stages["decode"].items == 64
    assert stages["collate"].items == 64
    assert stages["consumer.wait"].calls == 4
    assert stages["consumer.step"].calls == 4  # after each batch, until the next next()
    assert "transform" not in stages  # the built-in transform is part of decode
    assert all(t.seconds >= 0 for t in stages.values())
    assert stats.wait_s == stages["consumer.wait"].seconds


def test_cost_per_epoch_prices_measured_requests(dataset_url: str) -> None:
    with Loader(dataset_url, batch_size=16, transform=RandomResizedCrop(16)) as loader:
        list(loader)
        stats = loader.stats()
    cost = stats.cost_per_epoch(StoragePrices(get_per_1000=1.0, transfer_per_gib=2**30))
    gets = stats.requests["requests.get"]  # index (2) and shard reads
    assert stats.epoch_samples == 64
    assert cost.requests == gets
    assert cost.bytes == stats.requests["bytes.read"]
    assert cost.price == pytest.approx(gets / 1000 + stats.requests["bytes.read"])


def test_trace_keeps_a_timeline(dataset_url: str) -> None:
    with Loader(dataset_url, batch_size=16, transform=RandomResizedCrop(16)) as loader:
        assert loader.events() == []
        loader.trace(max_events=1000)
        list(loader)
        events = loader.events()
    stages = {e.stage for e in events}
    assert {"fetch", "decode", "collate", "consumer.wait"} <= stages
    assert {e.lane for e in events if e.stage == "fetch"} == {"io"}
    assert all(e.seconds >= 0 for e in events)
    starts = [e.start_s for e in events if e.stage == "consumer.wait"]
    assert starts == sorted(starts)


def test_periodic_log_line(dataset_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stoker.pipeline.loader")
    with Loader(dataset_url, batch_size=8, transform=RandomResizedCrop(16)) as loader:
        loader.log_every(0.0)
        list(loader)
    lines = [r.getMessage() for r in caplog.records if "images/s" in r.getMessage()]
    assert len(lines) == 8
    assert "waiting for input" in lines[-1]
    assert "busiest stage" in lines[-1]


def test_a_dataset_path_opens_once(tmp_path: Path, dataset_url: str) -> None:
    with Loader(dataset_url, batch_size=16) as loader:
        assert loader.stats().requests["requests.get"] == 2  # index.json and index.bin


def test_since_gives_what_happened_between_two_snapshots(dataset_url: str) -> None:
    with Loader(dataset_url, batch_size=16, transform=RandomResizedCrop(16)) as loader:
        it = iter(loader)
        next(it)
        before = loader.stats()
        rest = sum(len(batch["label"]) for batch in it)
        after = loader.stats()
    done = after.since(before)
    assert done.samples == rest == 48
    assert done.batches == 3
    assert done.stages["collate"].items == 48
    assert done.stages["collate"].calls == after.stages["collate"].calls - 1
    assert "index" not in done.stages  # did not move
    assert (
        done.requests.get("requests.get", 0)
        == after.requests["requests.get"] - before.requests["requests.get"]
    )


# The decode stages read time.perf_counter and time.thread_time; a test of what they time
# gives them a clock that moves only where the test says, by binary fractions (sums exact).
DECODE_S = 2**-8  # each image's decoding: CPU and wall
TRANSFORM_S = 2**-6  # each call of the user's transform: wall ...
TRANSFORM_CPU_S = 2**-10  # ... of which it ran this long (it waited the rest)


class FakeClock:
    """``perf_counter`` and ``thread_time`` per thread, from 0, moved only by :meth:`advance`;
    anything else is the time module's."""

    def __init__(self) -> None:
        self._threads = threading.local()

    def perf_counter(self) -> float:
        return float(getattr(self._threads, "wall", 0.0))

    def thread_time(self) -> float:
        return float(getattr(self._threads, "cpu", 0.0))

    def advance(self, *, wall: float, cpu: float) -> None:
        self._threads.wall = self.perf_counter() + wall
        self._threads.cpu = self.thread_time() + cpu

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def install_fake_clock(patch: Callable[[object, str, object], None]) -> FakeClock:
    """Give the decode stages a fake clock, and make each image's decoding take DECODE_S of
    it; ``patch`` is ``monkeypatch.setattr`` here, ``setattr`` in a worker process."""
    from stoker.pipeline import batching, decode, sample_decoder, workers

    clock = FakeClock()
    real_decode = decode.decode_full

    def decode_full(data: Any, **options: Any) -> Any:
        clock.advance(wall=DECODE_S, cpu=DECODE_S)
        return real_decode(data, **options)

    patch(sample_decoder, "decode_full", decode_full)
    patch(sample_decoder, "time", clock)
    patch(workers, "time", clock)
    patch(batching, "time", clock)
    return clock


class ClockedTransform:
    """A user transform that takes TRANSFORM_S of the fake clock, TRANSFORM_CPU_S of them
    running. Sent to a worker process, it arrives with a fake clock installed there, before
    the worker reads the clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def __call__(self, image: Any) -> np.ndarray:
        self.clock.advance(wall=TRANSFORM_S, cpu=TRANSFORM_CPU_S)
        return np.zeros((8, 8, 3), np.uint8)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _clocked_transform_in_a_worker, ()


def _clocked_transform_in_a_worker() -> ClockedTransform:
    return ClockedTransform(install_fake_clock(setattr))


@pytest.mark.parametrize("method", ["thread", "process"])
def test_the_transform_stage_times_only_the_users_callable(
    dataset_url: str, method: Literal["thread", "process"], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stages' seconds are what the fake clock says happened in each: the transform
    # stage holds the user's callable (its wall time) and no decoding; the decode stage
    # holds the decoding and none of the callable (not even the CPU time it ran).
    clock = install_fake_clock(monkeypatch.setattr)
    decode = DecodeConfig(threads=2, method=method)
    with Loader(
        dataset_url, batch_size=8, transform=ClockedTransform(clock), decode=decode
    ) as loader:
        loader.read_ahead = False  # one epoch: the next one's start is not decoded
        assert sum(len(batch["key"]) for batch in loader) == 64
        stages = loader.stats().stages
    transform, decoded = stages[Stage.TRANSFORM], stages[Stage.DECODE]
    assert transform.items == decoded.items == 64
    assert transform.seconds == 64 * TRANSFORM_S
    assert decoded.seconds == 64 * DECODE_S


STEP_S = 2**-4  # each training step of the consumer, on the fake clock


def test_the_consumers_time_between_batches_is_its_step_not_a_wait(
    dataset_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stoker.pipeline import loader as loader_module

    clock = FakeClock()  # the clock the Loader times next() and the consumer's steps with
    monkeypatch.setattr(loader_module, "time", clock)
    with Loader(dataset_url, batch_size=8, transform=RandomResizedCrop(16)) as loader:
        for _ in loader:
            clock.advance(wall=STEP_S, cpu=0.0)  # a training step
        stats = loader.stats()
    assert stats.stages[Stage.CONSUMER_STEP].calls == 8
    assert stats.step_s == 8 * STEP_S
    assert stats.wait_s == 0.0  # the clock did not move inside next()
    assert stats.wait_share == 0.0


@pytest.mark.parametrize("world_size", [1, 3])
def test_an_epoch_reads_only_the_bytes_it_delivers(tmp_path: Path, world_size: int) -> None:
    write_image_folder(tmp_path / "src", files=600, classes=6, width=40, height=30)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=150))
    dataset = open_dataset(tmp_path / "ds")
    shard_bytes = sum(s.size for s in dataset.shards)
    index_bytes = sum(p.stat().st_size for p in (tmp_path / "ds").glob("index.*"))
    read = 0
    for rank in range(world_size):
        world = World(rank=rank, world_size=world_size)
        # Groups of 4 blocks from all over the shards: the gaps between them are other blocks.
        order = OrderConfig(block_size=8, group_blocks=4)
        with Loader(str(tmp_path / "ds"), batch_size=32, world=world, order=order) as loader:
            loader.read_ahead = False  # one epoch's reads, not the next one's start
            for _ in loader:
                pass
            read += loader.stats().requests["bytes.read"] - index_bytes
    # Every shard byte once (ranks sharing a block each read their part), and no gap.
    assert shard_bytes * 0.98 < read <= shard_bytes * 1.02


def test_cache_hits_count_both_caches_and_stats_print_as_a_table(
    dataset_url: str, tmp_path: Path
) -> None:
    from stoker.pipeline.config import CacheConfig

    cache = CacheConfig(dir=str(tmp_path / "cache"), memory_bytes=10_000_000)
    with Loader(dataset_url, batch_size=16, transform=RandomResizedCrop(8), cache=cache) as one:
        one.read_ahead = False
        for _ in one:
            pass
    # A second loader: its memory cache is empty, the disk cache holds every block.
    with Loader(dataset_url, batch_size=16, transform=RandomResizedCrop(8), cache=cache) as two:
        two.read_ahead = False
        for _ in two:
            pass
        stats = two.stats()
    disk_hits = stats.disk_cache["cache.hits"]
    assert disk_hits > 0
    assert stats.memory_cache_hits == 0
    assert stats.cache_hits == disk_hits  # the disk cache's hits count as cache hits
    text = str(stats)
    assert not text.startswith("LoaderStats(")
    assert len(text.splitlines()) <= 16
    for part in ("64 samples in 4 batches", "stage", "fetch", "decode", "requests:", "read"):
        assert part in text, text
    assert f"disk {disk_hits} hits" in text, text
    assert "waits: the caller waited" in text, text
    assert stats.table() == text
