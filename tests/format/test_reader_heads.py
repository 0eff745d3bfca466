"""A shard's size is checked against the index from its first ranged GET's answer (the whole
object's size), with no HEAD, on a local folder, on S3 and through the disk cache; a shard
of another size is still refused, naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stoker import CacheConfig, Loader, OrderConfig
from stoker.errors import CorruptShardError
from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.storage import open_store
from stoker.storage.cache import DiskCache
from stoker.storage.cached import cache_reads
from stoker.testing.images import write_image_folder


def test_no_head_with_many_reads_in_flight(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=400, classes=4, width=16, height=12)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=100))
    # Blocks of one sample, all read before the first batch: 400 reads in flight at once.
    order = OrderConfig(block_size=1, group_blocks=4, window=100)
    with Loader(str(tmp_path / "ds"), batch_size=50, order=order) as loader:
        delivered = sum(len(batch["label"]) for batch in loader)
        requests = loader.stats().requests
    assert delivered == 400
    assert requests["requests.get"] > 300  # few neighbours share a read group
    assert requests.get("requests.head", 0) == 0  # the sizes came with the GETs (was 4)


def _packed(tmp_path: Path, bucket: Any) -> str:
    write_image_folder(tmp_path / "src", files=96, classes=4, width=16, height=12)
    url = f"{bucket.url}/ds"
    pack(
        tmp_path / "src",
        url,
        config=PackConfig(samples_per_shard=16),
        storage_options=bucket.options(),
    )
    return url


@pytest.mark.parametrize("cached", [False, True], ids=["store", "disk-cache"])
def test_an_epoch_on_s3_sends_no_shard_head(tmp_path: Path, s3_bucket: Any, cached: bool) -> None:
    url = _packed(tmp_path, s3_bucket)
    cache = CacheConfig(dir=tmp_path / "cache") if cached else CacheConfig()
    with Loader(url, batch_size=16, cache=cache, storage_options=s3_bucket.options()) as loader:
        delivered = sum(len(batch["label"]) for batch in loader)
        requests = loader.stats().requests
    assert delivered == 96
    assert requests["requests.get"] >= 6  # every one of the 6 shards read
    # Was one HEAD per shard (6); with the cache, index.json's one HEAD stays (its ETag
    # versions the cached index).
    assert requests.get("requests.head", 0) == (1 if cached else 0), requests


@pytest.mark.parametrize("change", ["shorter", "longer"])
@pytest.mark.parametrize("cached", [False, True], ids=["store", "disk-cache"])
def test_a_replaced_shard_on_s3_is_refused_naming_it(
    tmp_path: Path, s3_bucket: Any, change: str, cached: bool
) -> None:
    url = _packed(tmp_path, s3_bucket)
    store = open_store(url, storage_options=s3_bucket.options())
    name = "shard-000002.tar"
    data = bytes(store.get(name))
    store.put(name, data[: len(data) // 2] if change == "shorter" else data + bytes(1024))
    found = len(data) // 2 if change == "shorter" else len(data) + 1024
    named = rf"{name}: shard is {found} bytes, but the index says {len(data)}"
    dataset = open_dataset(url, storage_options=s3_bucket.options())
    if cached:
        disk = DiskCache(tmp_path / "cache", max_bytes=1 << 30)
        objects = {s.name: (f"sha256:{s.sha256}", s.size) for s in dataset.shards}
        dataset = type(dataset)(cache_reads(dataset.store, disk, objects=objects), dataset.index)
    in_shard = [i for i in range(len(dataset)) if int(dataset.index.shard[i]) == 2]
    assert len(dataset.read_many(range(16))) == 16  # shard 0 is fine
    with pytest.raises(CorruptShardError, match=named):
        dataset.read_many(in_shard)
    with pytest.raises(CorruptShardError, match=named):
        dataset[in_shard[-1]]
    kept = dataset.read_many([0, *in_shard], return_errors=True)
    assert isinstance(kept[0], dict)
    assert all(isinstance(x, CorruptShardError) for x in kept[1:])
    if cached:  # nothing of the wrong object was cached: it is refused again, not served
        with pytest.raises(CorruptShardError, match=named):
            type(dataset)(dataset.store, dataset.index).read_many(in_shard)
