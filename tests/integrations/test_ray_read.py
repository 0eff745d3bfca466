"""stoker.integrations.ray.read_dataset on a local Ray cluster (2 CPUs) over datasets in the
SeaweedFS test server: stoker's order, every sample once, the Loader's samples, Ray Train's
split and iter_torch_batches; a set of photos and a set of records without images."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import ray.exceptions
import ray.train
import torch

from stoker import Loader, OrderConfig
from stoker.format.reader import open_dataset
from stoker.integrations import ray as ray_read
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.plan import resolve_order
from stoker.pipeline.sources import DatasetSource
from stoker.storage.open import open_store
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import SeaweedServer
from stoker.transforms import RandomResizedCrop

pytestmark = [
    # Ray's DataContext sets its own deprecated field when made (Ray 2.60).
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
    # Ray Train's DataConfig sets a field Ray itself deprecated (Ray 2.60).
    pytest.mark.filterwarnings("ignore:.*ExecutionOptions.exclude_resources:DeprecationWarning"),
]

IMAGES = 60
RECORDS = 30
#: Small blocks and groups: several read tasks an epoch, so their order is put to the test.
ORDER = OrderConfig(block_size=4, group_blocks=2)
CROP = RandomResizedCrop(24)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    # Ray Data's executor logs every block at DEBUG, which pytest would capture.
    loggers = [logging.getLogger(name) for name in ("ray", "ray.data")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@pytest.fixture(scope="module")
def bucket(s3_server: SeaweedServer) -> tuple[str, dict[str, Any]]:
    s3_server.create_bucket("ray-read")
    return "s3://ray-read", s3_server.storage_options()


@pytest.fixture(scope="module")
def images_url(bucket: tuple[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("ray-images")
    write_image_folder(root, files=IMAGES, classes=3, width=48, height=40)
    url = f"{bucket[0]}/images"
    pack(root, url, config=PackConfig(samples_per_shard=16), storage_options=bucket[1])
    return url


def _record(i: int) -> dict[str, Any]:
    return {
        "__key__": f"r{i:03d}",
        "txt": f"caption {i}: \N{SNOWMAN}",
        "json": {"n": i, "tags": ["a"] * (i % 3), **({"odd": True} if i % 2 else {})},
        "npy": np.arange(i % 4 + 1, dtype=np.float32) + i,  # 1 to 4 long
        "cls": i % 5,
    }


@pytest.fixture(scope="module")
def records_url(
    bucket: tuple[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> str:
    import webdataset as wds

    root = tmp_path_factory.mktemp("ray-records")
    for shard in range(2):
        with wds.TarWriter(str(root / f"records-{shard}.tar")) as sink:
            for i in range(shard * RECORDS // 2, (shard + 1) * RECORDS // 2):
                sink.write(_record(i))
    url = f"{bucket[0]}/records"
    pack(root, url, config=PackConfig(samples_per_shard=8), storage_options=bucket[1])
    return url


def _stoker_keys(url: str, options: dict[str, Any], *, seed: int, epoch: int) -> list[str]:
    """The keys of the epoch in stoker's own order, from its pure functions."""
    source = DatasetSource(open_dataset(url, storage_options=options))
    settings = resolve_order(
        ORDER,
        seed=seed,
        units=source.units(),
        unit_bytes=source.unit_bytes(),
        shuffled=source.shuffled(),
    )
    order = source.epoch_order(settings, epoch)
    assert order.groups >= 4  # several read tasks
    return [source.dataset.index.keys[i] for i in order.samples.tolist()]


def _keys(dataset: Any) -> list[str]:
    return [row["key"] for row in dataset.select_columns(["key"]).take_all()]


@pytest.mark.usefixtures("cluster")
def test_an_epoch_is_stokers_order_with_the_loaders_samples(
    images_url: str, bucket: tuple[str, dict[str, Any]]
) -> None:
    options = bucket[1]
    # Reads as tasks of their own (half a CPU each: fewer extra workers to start than a
    # quarter), apart from the decoding: their blocks of raw members cross the object store.
    ds = ray_read.read_dataset(
        images_url,
        seed=3,
        epoch=1,
        transform=CROP,
        order=ORDER,
        storage_options=options,
        read_num_cpus=0.5,
    )
    rows = ds.take_all()
    keys = [row["key"] for row in rows]
    assert keys == _stoker_keys(images_url, options, seed=3, epoch=1)
    assert len(set(keys)) == IMAGES  # every sample once
    loader = Loader(images_url, batch_size=7, seed=3, transform=CROP, order=ORDER,
                    storage_options=options)  # fmt: skip
    loader.set_epoch(1)
    with loader:
        batches = list(loader)
    assert keys == [key for batch in batches for key in batch["key"]]
    images = np.stack([row["image"] for row in rows])
    assert images.dtype == np.uint8
    assert images.shape == (IMAGES, 24, 24, 3)
    # The same crops, decoded in Ray's tasks as in the Loader's threads.
    np.testing.assert_array_equal(images, np.concatenate([b["image"] for b in batches]))
    assert [row["label"] for row in rows] == [int(x) for b in batches for x in b["label"]]
    assert [row["index"] for row in rows] == [int(x) for b in batches for x in b["index"]]


@pytest.mark.usefixtures("cluster")
def test_a_seed_gives_its_order_and_another_seed_another(
    images_url: str, bucket: tuple[str, dict[str, Any]]
) -> None:
    def keys(seed: int, epoch: int) -> list[str]:
        return _keys(
            ray_read.read_dataset(
                images_url, seed=seed, epoch=epoch, order=ORDER, storage_options=bucket[1]
            )
        )

    first = keys(5, 0)
    assert keys(5, 0) == first
    assert sorted(keys(6, 0)) == sorted(first)
    assert keys(6, 0) != first
    second = keys(5, 1)
    assert second != first
    # Two epochs in one dataset: each in its own order, one after the other.
    # Three groups a read task: a task reads the last groups of one epoch and the first
    # of the next.
    both = ray_read.read_dataset(
        images_url,
        seed=5,
        epochs=2,
        order=ORDER,
        storage_options=bucket[1],
        groups_per_task=3,
    ).select_columns(["key", "epoch"])
    rows = both.take_all()
    assert [row["key"] for row in rows] == first + second
    assert [row["epoch"] for row in rows] == [0] * IMAGES + [1] * IMAGES


@pytest.mark.usefixtures("cluster")
# Ray's own conversion makes tensors of its read-only arrays (TorchCollateFn copies them).
@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning")
def test_iter_torch_batches_and_ray_trains_split(
    images_url: str, bucket: tuple[str, dict[str, Any]]
) -> None:
    ds = ray_read.read_dataset(
        images_url, seed=1, transform=CROP, order=ORDER, storage_options=bucket[1]
    )
    seen: list[str] = []
    for batch in ds.iter_torch_batches(batch_size=16, collate_fn=ray_read.TorchCollateFn()):
        assert isinstance(batch["image"], torch.Tensor)
        assert batch["image"].dtype == torch.uint8
        assert batch["image"].shape[1:] == (24, 24, 3)
        assert batch["label"].dtype == torch.int64
        assert isinstance(batch["key"], list)
        seen += batch["key"]
    assert sorted(seen) == sorted(_stoker_keys(images_url, bucket[1], seed=1, epoch=0))
    # Ray's own conversion, for the numeric columns.
    (plain,) = ds.select_columns(["image", "label"]).iter_torch_batches(batch_size=IMAGES)
    assert plain["image"].shape == (IMAGES, 24, 24, 3)

    # What Ray Train does with datasets=: each worker's get_dataset_shard is one of these.
    shards = ray.train.DataConfig().configure(
        {"train": ds}, world_size=2, worker_handles=None, worker_node_ids=None
    )
    got: list[list[str]] = [[], []]

    def consume(rank: int) -> None:  # Train's workers read their shards at the same time
        for batch in shards[rank]["train"].iter_torch_batches(
            batch_size=8, collate_fn=ray_read.TorchCollateFn()
        ):
            got[rank] += batch["key"]

    threads = [threading.Thread(target=consume, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(got[0]) == len(got[1]) == IMAGES // 2
    assert sorted(got[0] + got[1]) == sorted(seen)  # each sample to one worker, once


@pytest.mark.usefixtures("cluster")
def test_records_without_images_come_as_the_loader_gives_them(
    records_url: str, bucket: tuple[str, dict[str, Any]]
) -> None:
    options = bucket[1]
    ds = ray_read.read_dataset(records_url, seed=2, order=ORDER, storage_options=options)
    rows = ds.take_all()
    keys = [row["key"] for row in rows]
    assert keys == _stoker_keys(records_url, options, seed=2, epoch=0)
    assert sorted(keys) == [f"r{i:03d}" for i in range(RECORDS)]
    for row in rows:
        expected = _record(int(row["key"][1:]))
        assert "image" not in row
        assert row["txt"] == expected["txt"]
        assert row["json"] == expected["json"]  # the object, not a struct with gaps
        assert row["npy"].dtype == np.float32
        np.testing.assert_array_equal(row["npy"], expected["npy"])
        assert "cls" not in row  # the class once, as label
        assert row["label"] == expected["cls"]
    (batch,) = ds.iter_torch_batches(batch_size=RECORDS, collate_fn=ray_read.TorchCollateFn())
    assert isinstance(batch["txt"], list)
    assert isinstance(batch["json"], list)
    assert all(isinstance(v, torch.Tensor) for v in batch["npy"])  # ragged: a list of tensors
    assert batch["label"].dtype == torch.int64
    with Loader(records_url, batch_size=RECORDS, seed=2, order=ORDER,
                storage_options=options) as loader:  # fmt: skip
        (expected_batch,) = list(loader)
    assert batch["key"] == expected_batch["key"]
    assert batch["json"] == expected_batch["json"]
    assert batch["txt"] == expected_batch["txt"]


@pytest.mark.usefixtures("cluster")
def test_a_corrupt_sample_is_named(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=12, classes=2, width=32, height=24)
    pack(tmp_path / "src", tmp_path / "packed", config=PackConfig(samples_per_shard=6))
    dataset = open_dataset(tmp_path / "packed")
    victim = 7
    shard = tmp_path / "packed" / dataset.shards[int(dataset.index.shard[victim])].name
    data = bytearray(shard.read_bytes())
    data[int(dataset.index.offset[victim]) + 600] ^= 0xFF  # inside the JPEG's bytes
    shard.write_bytes(bytes(data))
    key = dataset.index.keys[victim]
    # Ray raises the worker's error in the driver, its message (shard, sample) kept.
    with pytest.raises(ray.exceptions.RayTaskError, match=f"sample {key!r}.*CRC-32"):
        ray_read.read_dataset(tmp_path / "packed", transform=CROP).take_all()


def test_a_transform_for_records_without_images_or_an_unpacked_location_is_refused(
    records_url: str, bucket: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="no image"):
        ray_read.read_dataset(records_url, transform=CROP, storage_options=bucket[1])
    with pytest.raises(FileNotFoundError):
        ray_read.read_dataset(tmp_path / "nothing")
    with pytest.raises(ValueError, match="batch_size"):
        ray_read.read_dataset(records_url, batch_size=0, storage_options=bucket[1])
    with pytest.raises(ValueError, match="groups_per_task"):
        ray_read.read_dataset(records_url, groups_per_task=0, storage_options=bucket[1])


@pytest.fixture(scope="module")
def parquet_url(bucket: tuple[str, dict[str, Any]]) -> str:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from stoker.testing.images import make_jpeg

    store = open_store(f"{bucket[0]}/table", storage_options=bucket[1])
    rng = np.random.default_rng(0)
    for file in range(2):
        rows = range(file * 25, file * 25 + 25)
        table = pa.table(
            {
                "image": [
                    {"bytes": make_jpeg(rng, width=40, height=32), "path": None} for _ in rows
                ],
                "caption": [f"caption {i}" for i in rows],
                "label": [i % 3 for i in rows],
            }
        )
        out = io.BytesIO()
        pq.write_table(table, out, row_group_size=6)
        store.put(f"train-{file:05d}-of-00002.parquet", out.getvalue())
    return f"{bucket[0]}/table"


@pytest.mark.usefixtures("cluster")
def test_a_parquet_table_read_in_place_gives_the_loaders_epoch(
    parquet_url: str, bucket: tuple[str, dict[str, Any]]
) -> None:
    from stoker import SourceConfig

    options = bucket[1]
    source = SourceConfig(parquet_url, columns=["image", "caption", "label"])
    ds = ray_read.read_dataset(source, seed=2, transform=CROP, storage_options=options)
    rows = ds.take_all()
    with Loader(source, batch_size=5, seed=2, transform=CROP, storage_options=options) as loader:
        batches = list(loader)
    # Every row once, as the Loader's epoch, with its fields: in the epoch's order of read
    # groups, without the Loader's window that mixes several read groups (Ray mixes with
    # iter_batches(local_shuffle_buffer_size=...)).
    by_key = {row["key"]: row for row in rows}
    assert len(by_key) == len(rows) == 50
    loaded = {key: (b, n) for b in batches for n, key in enumerate(b["key"])}
    assert set(by_key) == set(loaded)
    for key, (batch, n) in loaded.items():
        assert by_key[key]["txt"] == batch["txt"][n]
        assert by_key[key]["label"] == int(batch["label"][n])
        assert by_key[key]["image"].shape == batch["image"][n].shape == (24, 24, 3)


@pytest.mark.usefixtures("cluster")
def test_video_clips_read_as_the_loaders_epoch(
    bucket: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    pytest.importorskip("av")
    from stoker import SourceConfig, VideoConfig
    from stoker.testing.videos import make_video

    for n in range(3):
        path = tmp_path / "in" / f"c{n % 2}" / f"v{n}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(make_video(frames=18, gop=6, photo=n))
    url = f"{bucket[0]}/videos"
    pack(tmp_path / "in", url, storage_options=bucket[1])
    source = SourceConfig(url, video=VideoConfig(frames=4, clips_per_video=2))
    rows = ray_read.read_dataset(source, seed=1, storage_options=bucket[1]).take_all()
    with Loader(source, batch_size=2, seed=1, storage_options=bucket[1]) as loader:
        clips = {
            (key, int(b["first_frame"][n])): b["image"][n]
            for b in loader
            for n, key in enumerate(b["key"])
        }
    assert len(rows) == len(clips) == 6
    for row in rows:
        np.testing.assert_array_equal(row["image"], clips[(row["key"], int(row["first_frame"]))])
