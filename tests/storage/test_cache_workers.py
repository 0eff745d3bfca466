"""TorchLoader's DataLoader workers share the disk cache's pages but read from it only
their own samples: an epoch read from the cache costs its data once, not once per worker
(issue 25.2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stoker.format.reader import open_dataset
from stoker.integrations.torch import TorchLoader
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.config import CacheConfig
from stoker.pipeline.order import OrderConfig
from stoker.testing.images import write_image_folder

#: Pages of several samples, so that each page holds samples of both workers' batches.
PAGE = 16 << 10


def test_two_workers_read_an_epoch_from_the_cache_once(tmp_path: Path, s3_bucket: Any) -> None:
    write_image_folder(tmp_path / "src", files=96, classes=3, width=64, height=48)
    url = f"{s3_bucket.url}/ds"
    options = s3_bucket.options()
    pack(tmp_path / "src", url, config=PackConfig(samples_per_shard=48), storage_options=options)
    data = int(open_dataset(url, storage_options=options).index.length.sum())
    cache = CacheConfig(dir=str(tmp_path / "cache"), page_bytes=PAGE)
    with TorchLoader(
        url,
        batch_size=8,
        num_workers=2,
        cache=cache,
        storage_options=options,
        order=OrderConfig(block_size=8, group_blocks=2),
        seed=0,
    ) as loader:
        hits = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            assert sum(len(b["label"]) for b in loader) == 96
            hits.append(loader.stats().disk_cache.get("cache.bytes_hit", 0))
    assert data > 4 * PAGE  # several pages, each shared by the workers
    read = hits[1] - hits[0]  # epoch 2: every page is in the cache
    assert read <= 1.05 * data, f"epoch 2 read {read / data:.2f}x its data from the cache"
