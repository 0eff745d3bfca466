"""Loader: exactly-once delivery, thread/worker independence, resume, cache, errors."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker import CacheConfig, DecodeConfig, World
from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.storage import DiskCache
from stoker.testing.images import write_image_folder, write_packed_images

SMALL_ORDER = OrderConfig(block_size=4, group_blocks=3)
#: The same, with each rank's piece mixed through a window of 3 read groups (the default
#: for data not written shuffled).
WINDOWED = replace(SMALL_ORDER, window=3)
ORDERS = pytest.mark.parametrize("order", [SMALL_ORDER, WINDOWED], ids=["groups", "window"])


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("loader"),
        files=103,
        classes=5,
        width=64,
        height=48,
        samples_per_shard=10,
    )


@pytest.fixture(scope="module")
def records_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """103 records without images: a float32 array of 1-7 values, a caption and a class."""
    root = tmp_path_factory.mktemp("records")
    (root / "src").mkdir()
    for i in range(103):
        np.save(root / "src" / f"r{i:03d}.npy", np.arange(i % 7 + 1, dtype=np.float32))
        (root / "src" / f"r{i:03d}.txt").write_text(f"record {i}")
        (root / "src" / f"r{i:03d}.cls").write_text(str(i % 5))
    pack(root / "src", root / "ds", config=PackConfig(samples_per_shard=10))
    assert sorted(open_dataset(root / "ds").index.fields) == ["cls", "npy", "txt"]
    return str(root / "ds")


@pytest.fixture(params=["images", "records"])
def any_url(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """The image dataset with a transform, or the records (no images, no transform): the
    order, partition and resume guarantees hold for both."""
    if request.param == "images":
        return request.getfixturevalue("dataset_url"), RandomResizedCrop(8)
    return request.getfixturevalue("records_url"), None


def _keys(loader: Loader) -> list[str]:
    return [k for batch in loader for k in batch["key"]]


def test_batches_have_the_documented_shape(dataset_url: str) -> None:
    with Loader(
        dataset_url,
        batch_size=16,
        transform=RandomResizedCrop(32, flip=True),
        decode=DecodeConfig(threads=2),
    ) as loader:
        batches = list(loader)
    assert len(batches) == 7 == len(loader)
    first = batches[0]
    assert first["image"].shape == (16, 32, 32, 3)
    assert first["image"].dtype == np.uint8
    assert first["label"].dtype == np.int64
    assert len(first["key"]) == 16
    assert batches[-1]["image"].shape[0] == 103 - 6 * 16


def test_each_sample_once_per_epoch_and_epochs_differ(dataset_url: str) -> None:
    with Loader(
        dataset_url, batch_size=10, transform=RandomResizedCrop(16), order=SMALL_ORDER
    ) as loader:
        loader.set_epoch(0)
        first = _keys(loader)
        loader.set_epoch(1)
        second = _keys(loader)
    assert sorted(first) == sorted(second)
    assert len(set(first)) == 103
    assert first != second


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    drop_last=st.booleans(),
    batch=st.integers(3, 20),
    order=st.sampled_from([SMALL_ORDER, WINDOWED]),
)
def test_ranks_and_workers_cover_the_epoch(
    any_url: tuple[str, Any],
    world: int,
    workers: int,
    drop_last: bool,
    batch: int,
    order: OrderConfig,
) -> None:
    url, transform = any_url
    dataset = open_dataset(url)
    per_rank = []
    for rank in range(world):
        keys: list[str] = []
        for worker in range(workers):
            with Loader(
                dataset,
                batch_size=batch,
                transform=transform,
                drop_last=drop_last,
                order=order,
                world=World(rank=rank, world_size=world, worker=worker, num_workers=workers),
                decode=DecodeConfig(threads=2),
            ) as loader:
                keys += _keys(loader)
        per_rank.append(keys)
    assert len({len(k) for k in per_rank}) == 1  # equal epochs on every rank
    everything = [k for keys in per_rank for k in keys]
    if drop_last:
        assert len(set(everything)) == len(everything)
    else:
        assert set(everything) == {dataset.index.keys[i] for i in range(len(dataset))}


def test_order_and_pixels_do_not_depend_on_threads(dataset_url: str) -> None:
    results = []
    for threads in (1, 4):
        with Loader(
            dataset_url,
            batch_size=8,
            transform=RandomResizedCrop(16, flip=True),
            order=SMALL_ORDER,
            seed=3,
            decode=DecodeConfig(threads=threads),
        ) as loader:
            batches = list(loader)
        results.append(batches)
    for a, b in zip(*results, strict=True):
        assert a["key"] == b["key"]
        assert np.array_equal(a["image"], b["image"])


def test_batch_arrays_are_recycled_only_when_nobody_holds_them(dataset_url: str) -> None:
    kwargs: dict[str, Any] = {
        "batch_size": 8,
        "transform": RandomResizedCrop(16, flip=True),
        "order": SMALL_ORDER,
        "seed": 3,
        "decode": DecodeConfig(threads=2),
    }
    with Loader(dataset_url, **kwargs) as loader:
        held = [batch["image"] for batch in loader]  # every array kept: none recycled
        assert loader._batches.arrays.reused == 0
    # Keep a view of one batch in three and a memoryview of another; drop the rest.
    views: dict[int, np.ndarray] = {}
    exports: dict[int, memoryview] = {}
    copies: list[np.ndarray] = []
    with Loader(dataset_url, **kwargs) as loader:
        for n, batch in enumerate(loader):
            copies.append(batch["image"].copy())
            if n % 3 == 0:
                views[n] = batch["image"][1:]
            elif n % 3 == 1:
                exports[n] = memoryview(batch["image"])
            del batch
        assert loader._batches.arrays.reused > 0
    for n, view in views.items():
        np.testing.assert_array_equal(view, copies[n][1:])
    for n, export in exports.items():
        np.testing.assert_array_equal(np.asarray(export), copies[n])
    for image, copy in zip(held, copies, strict=True):
        np.testing.assert_array_equal(image, copy)


@ORDERS
def test_resume_equals_an_uninterrupted_run(any_url: tuple[str, Any], order: OrderConfig) -> None:
    dataset_url, transform = any_url
    kwargs = {"batch_size": 7, "transform": transform, "order": order}
    with Loader(dataset_url, **kwargs) as loader:
        loader.set_epoch(2)
        full = _keys(loader)
    with Loader(dataset_url, **kwargs) as loader:
        loader.set_epoch(2)
        stream = iter(loader)
        head = [k for _ in range(5) for k in next(stream)["key"]]
        state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (2, 5)
    with Loader(dataset_url, **kwargs, decode=DecodeConfig(threads=3)) as resumed:
        resumed.load_state_dict(state)
        tail = _keys(resumed)
    assert head + tail == full


@ORDERS
def test_resume_with_a_new_world_size(any_url: tuple[str, Any], order: OrderConfig) -> None:
    dataset_url, transform = any_url
    kwargs = {"batch_size": 5, "transform": transform, "order": order}
    seen: list[str] = []
    states = []
    for rank in range(2):
        with Loader(dataset_url, **kwargs, world=World(rank=rank, world_size=2)) as loader:
            stream = iter(loader)
            seen += [k for _ in range(3) for k in next(stream)["key"]]
            states.append(loader.state_dict())
    assert states[0] == states[1]
    rest: list[str] = []
    for rank in range(3):
        with Loader(dataset_url, **kwargs, world=World(rank=rank, world_size=3)) as loader:
            loader.load_state_dict(states[0])
            rest += _keys(loader)
    fresh = set(rest)
    assert not fresh & set(seen)  # nothing repeated
    assert fresh | set(seen) == set(open_dataset(dataset_url).index.keys)  # nothing skipped


def test_cache_serves_the_second_epoch_without_requests(dataset_url: str) -> None:
    with Loader(
        dataset_url,
        batch_size=32,
        transform=RandomResizedCrop(8),
        cache=CacheConfig(memory_bytes=1 << 30),
    ) as loader:
        list(loader)
        before = loader.stats().requests.get("requests.get", 0)
        loader.set_epoch(1)
        list(loader)
        stats = loader.stats()
    assert stats.requests.get("requests.get", 0) == before
    # Every sample of epoch 1 from memory (and the read-ahead of epoch 2's first batch too).
    assert stats.cache_hits >= 103


def test_disk_cache_serves_later_epochs_and_other_loaders(dataset_url: str, tmp_path: Path) -> None:
    options = {
        "batch_size": 32,
        "transform": RandomResizedCrop(8),
        "cache": CacheConfig(dir=tmp_path),
    }
    with Loader(dataset_url, **options) as loader:  # type: ignore[arg-type]
        first = _keys(loader)
        cold = loader.stats()
        loader.set_epoch(1)
        second = _keys(loader)
        warm = loader.stats()
    assert sorted(first) == sorted(second)
    assert cold.requests["requests.get"] > 0
    assert warm.requests["requests.get"] == cold.requests["requests.get"]
    assert warm.disk_cache["cache.hits"] > 0
    # A new loader (as a restarted job or another rank would be) reads the index from the
    # cache too, after one HEAD of index.json (its ETag versions the cached copy).
    with Loader(dataset_url, **options) as again:  # type: ignore[arg-type]
        assert sorted(_keys(again)) == sorted(first)
        assert again.stats().requests.get("requests.get", 0) == 0


KILLED_LOADER = """
import sys
from stoker import CacheConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
url, cache_dir = sys.argv[1], sys.argv[2]
loader = Loader(url, batch_size=4, transform=RandomResizedCrop(8),
                cache=CacheConfig(dir=cache_dir), prefetch=8)
for epoch in range(1000):
    loader.set_epoch(epoch)
    for batch in loader:
        print(len(batch["key"]), flush=True)
"""


def test_a_loader_killed_mid_run_leaves_a_sound_cache(dataset_url: str, tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(KILLED_LOADER)
    cache_dir = tmp_path / "cache"
    for _ in range(3):
        with subprocess.Popen(
            [sys.executable, str(script), dataset_url, str(cache_dir)],
            stdout=subprocess.PIPE,
            text=True,
        ) as proc:
            assert proc.stdout is not None
            for _ in range(5):  # a few batches in, with fetches in flight
                assert proc.stdout.readline()
            proc.kill()
    cache = DiskCache(cache_dir, max_bytes=1 << 30)
    checked, damaged = cache.verify()
    assert checked > 0
    assert damaged == 0
    with Loader(
        dataset_url, batch_size=32, transform=RandomResizedCrop(8), cache=CacheConfig(dir=cache_dir)
    ) as loader:
        assert len(set(_keys(loader))) == 103
        assert loader.stats().disk_cache["cache.hits"] > 0


def test_undecodable_samples_raise_or_are_skipped(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=12, classes=2, width=40, height=30)
    pack(tmp_path / "src", tmp_path / "ds")
    from stoker.format.foreign.base import Sample
    from stoker.format.index import DatasetIndex, write_index
    from stoker.format.writer import ShardWriter
    from stoker.storage import open_store

    store = open_store(tmp_path / "bad")
    writer = ShardWriter(store, "shard-000000.tar")
    good = open_dataset(tmp_path / "ds").read_many(range(12))
    for sample in good[:5]:
        writer.add(Sample(key=sample["key"], fields={"jpg": sample["jpg"]}, label=0))
    writer.add(Sample(key="broken", fields={"jpg": b"\xff\xd8\xff garbage"}, label=0))
    write_index(store, DatasetIndex.from_shards([writer.close()], class_names=[], fields={}))
    with (
        pytest.raises(ValueError, match="sample 'broken'"),
        Loader(str(tmp_path / "bad"), batch_size=3, transform=RandomResizedCrop(8)) as loader,
    ):
        list(loader)
    with Loader(
        str(tmp_path / "bad"),
        batch_size=3,
        transform=RandomResizedCrop(8),
        decode=DecodeConfig(on_error="skip"),
    ) as loader:
        keys = _keys(loader)
        stats = loader.stats()
    assert len(keys) == 5
    assert [k for k, _ in stats.skipped] == ["broken"]


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_corrupt_sample_raises_naming_it_or_is_skipped(tmp_path: Path, method: str) -> None:
    write_image_folder(tmp_path / "src", files=20, classes=2, width=40, height=30)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=10))
    dataset = open_dataset(tmp_path / "ds")
    victim = 7
    shard = tmp_path / "ds" / dataset.shards[int(dataset.index.shard[victim])].name
    data = bytearray(shard.read_bytes())
    data[int(dataset.index.offset[victim]) + int(dataset.index.length[victim]) - 700] ^= 0x55
    shard.write_bytes(bytes(data))
    key = dataset.index.keys[victim]
    options: dict[str, object] = {"batch_size": 5, "transform": RandomResizedCrop(8)}
    decode = DecodeConfig(method="process", threads=1) if method == "process" else DecodeConfig()
    with (
        pytest.raises(ValueError, match=rf"sample {key!r}.*CRC-32"),
        Loader(str(tmp_path / "ds"), **options, decode=decode) as loader,  # type: ignore[arg-type]
    ):
        list(loader)
    skip = replace(decode, on_error="skip")
    with Loader(str(tmp_path / "ds"), **options, decode=skip) as loader:  # type: ignore[arg-type]
        keys = _keys(loader)
        stats = loader.stats()
    assert len(keys) == 19
    assert key not in keys
    assert [k for k, _ in stats.skipped] == [key]
    assert "CRC-32" in stats.skipped[0][1]


def test_a_small_dataset_still_splits_over_ranks(dataset_url: str) -> None:
    # 103 samples: the default order makes groups small enough for every rank's share.
    shares = []
    for rank in range(2):
        with Loader(dataset_url, batch_size=8, world=World(rank=rank, world_size=2)) as loader:
            shares.append(_keys(loader))
    assert len(shares[0]) == len(shares[1])
    assert len(set(shares[0]) & set(shares[1])) <= 1  # at most the one padding repeat
    assert set(shares[0]) | set(shares[1]) == set(open_dataset(dataset_url).index.keys)


def test_ranks_split_by_samples_even_with_one_read_group(dataset_url: str) -> None:
    # 103 samples in one read group over 4 ranks: 26 steps each, one sample repeated.
    keys = []
    for rank in range(4):
        world = World(rank=rank, world_size=4)
        order = OrderConfig(block_size=64)
        with Loader(dataset_url, batch_size=8, order=order, world=world) as loader:
            keys.append(_keys(loader))
            assert loader.stats().padded == (1 if rank == 3 else 0)
    assert {len(k) for k in keys} == {26}
    everything = [k for share in keys for k in share]
    assert len(everything) - len(set(everything)) == 1
    assert set(everything) == set(open_dataset(dataset_url).index.keys)


def test_max_pixels_refuses_large_images(dataset_url: str) -> None:
    with (
        Loader(
            dataset_url,
            batch_size=50,
            transform=RandomResizedCrop(8),
            decode=DecodeConfig(max_pixels=1000),
        ) as loader,
        pytest.raises(ValueError, match="max_pixels=1000"),
    ):
        next(iter(loader))
    with Loader(
        dataset_url,
        batch_size=50,
        transform=RandomResizedCrop(8),
        decode=DecodeConfig(max_pixels=1000, on_error="skip"),
    ) as loader:
        assert _keys(loader) == []
        assert len(loader.stats().skipped) == 103
    with pytest.raises(ValueError, match="max_pixels must be >= 1"):
        Loader(dataset_url, batch_size=1, decode=DecodeConfig(max_pixels=0))


def test_the_next_epoch_is_read_ahead_and_stays_exact(dataset_url: str) -> None:
    options: dict[str, Any] = {
        "batch_size": 10,
        "transform": RandomResizedCrop(8),
        "order": SMALL_ORDER,
        "prefetch": 2,
    }

    def fresh(epoch: int) -> list[str]:
        with Loader(dataset_url, **options) as loader:
            loader.set_epoch(epoch)
            return _keys(loader)

    with Loader(dataset_url, **options) as loader:
        chunks = loader.source.epoch_order(loader.order_config, 0).groups  # one fetch each
        seen = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            seen.append(_keys(loader))
        # From the second epoch on, its end starts reading the next one's first batch, and
        # the next epoch uses those reads: no chunk is fetched twice. Epoch 3's read-ahead
        # runs in the background and is counted when it completes: let it.
        deadline = time.monotonic() + 10
        while loader.stats().stages["fetch"].calls <= 3 * chunks and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loader.stats().stages["fetch"].calls == 3 * chunks + 1  # epoch 3 read ahead
        loader.set_epoch(7)  # not the epoch read ahead: those reads are dropped
        seen_7 = _keys(loader)
    assert seen == [fresh(e) for e in range(3)]
    assert seen_7 == fresh(7)


@ORDERS
@pytest.mark.parametrize("workers", [2, 3])
def test_workers_resumed_at_any_batch_deliver_the_uninterrupted_sequence(
    dataset_url: str, workers: int, order: OrderConfig
) -> None:
    options: dict[str, Any] = {"batch_size": 4, "order": order}
    with Loader(dataset_url, **options) as whole:
        full = [list(b["key"]) for b in whole]
    for position in (1, 5, 7):
        state = {"epoch": 0, "batches": position, "batch_size": 4, "seed": 0, "world_size": 1}
        streams = []
        for worker in range(workers):
            world = World(worker=worker, num_workers=workers)
            with Loader(dataset_url, **options, world=world) as loader:
                loader.load_state_dict(state)
                streams.append([list(b["key"]) for b in loader])
        # A DataLoader takes one batch from each worker in turn, worker 0 first.
        merged = [s[i] for i in range(max(map(len, streams))) for s in streams if i < len(s)]
        assert merged == full[position:]


@ORDERS
def test_a_state_saved_after_an_epoch_starts_the_next_one(
    dataset_url: str, order: OrderConfig
) -> None:
    options: dict[str, Any] = {"batch_size": 16, "order": order}
    with Loader(dataset_url, **options) as loader:
        first = _keys(loader)
        state = loader.state_dict()
        second = _keys(loader)  # no set_epoch: the next epoch, not the same one again
    assert (state["epoch"], state["batches"]) == (1, 0)
    assert sorted(first) == sorted(second)
    assert first != second
    with Loader(dataset_url, **options) as restored:
        restored.load_state_dict(state)
        assert _keys(restored) == second  # nothing replayed


@ORDERS
def test_until_the_first_batch_is_out_only_its_chunks_are_fetched(
    dataset_url: str, order: OrderConfig
) -> None:
    """Reads beyond the first batch would share the link and the cores with it."""
    from stoker.pipeline.plan import chunks_covering

    with Loader(dataset_url, batch_size=8, order=order, prefetch=4) as loader:
        loader.read_ahead = False  # count this epoch's fetches only, not the next one's
        loader.trace()
        plan = loader._plan(0)
        needed = chunks_covering(plan.chunks, plan.batches[plan.mine[0]])
        assert needed < len(plan.chunks)
        batches = iter(loader)
        next(batches)
        time.sleep(0.2)  # anything submitted before the first batch was out completes
        events = loader.events()
        made = next(e for e in events if e.stage == "collate")  # the first batch, assembled
        fetches = [e for e in events if e.stage == "fetch"]
        assert len([e for e in fetches if e.start_s < made.start_s]) == needed
        assert len(fetches) > needed  # and then the next ones, before it was handed over
        rest = sum(len(batch["key"]) for batch in batches)
        assert loader.stats().stages["fetch"].calls == len(plan.chunks)
    assert rest == 103 - 8


def test_a_fast_store_does_not_fill_memory_with_the_rest_of_the_epoch(dataset_url: str) -> None:
    """Prefetch bounds the samples held (fetched, not yet decoding), not only the reads in
    flight: a local disk answers at once, and the rest of the epoch would pile up."""
    order = OrderConfig(block_size=2, group_blocks=1)  # one read per batch of 2
    with Loader(dataset_url, batch_size=2, order=order, prefetch=4) as loader:
        chunks = len(loader._plan(0).chunks)
        batches = iter(loader)
        for _ in range(10):
            next(batches)
            time.sleep(0.05)  # a training step: every read submitted completes
        fetched = loader.stats().stages["fetch"].calls
        # 10 delivered, up to prefetch + 1 decoding, prefetch + 1 (the window's hold) held.
        assert fetched <= 10 + 5 + 5 < chunks
        assert sum(len(batch["key"]) for batch in batches) == 103 - 20
