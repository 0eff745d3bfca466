"""download, pack and two loader epochs through a proxy that faults 5% of requests.

Every kind of fault is in the mix (503 SlowDown, 500, reset, reset mid-body, truncated
body, stalled response). The runs must complete with every byte checked and every sample
delivered exactly once, and each injected fault must show up as exactly one retry.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from faultmix import faulty_options, retries_logged

from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.storage import open_store
from stoker.storage.checksum import md5_tree
from stoker.storage.transfer import PARTIAL_SUFFIX, TransferConfig, download, upload
from stoker.testing.images import write_image_folder

MiB = 1024 * 1024


def test_download_under_faults(s3_bucket, proxy, tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_image_folder(source, files=300, classes=6, width=64, height=48)
    (source / "large").mkdir()
    for i in range(2):  # ranged parts, each its own request
        (source / "large" / f"blob{i}.bin").write_bytes(os.urandom(11 * MiB + i))
    upload(source, s3_bucket.store("data"))  # no faults yet
    options = faulty_options(s3_bucket, proxy)
    store = open_store(
        f"{s3_bucket.url}/data",
        storage_options={
            **options,
            "part_size_bytes": 5 * MiB,
            "multipart_threshold_bytes": 5 * MiB,
        },
    )
    report = download(store, tmp_path / "dst", config=TransferConfig(workers=16))

    assert report.files_transferred == 302
    assert md5_tree(tmp_path / "dst") == md5_tree(source)  # MD5-equal, file by file
    assert not list((tmp_path / "dst").rglob(f"*{PARTIAL_SUFFIX}"))
    stats = proxy.stats()
    counters = store.counters.snapshot()
    assert stats.faulted > 0
    assert counters["retries"] == stats.faulted  # one retry per injected fault
    assert counters.get("throttles", 0) == stats.faults["503"]


def test_pack_from_a_bucket_under_faults(s3_bucket, proxy, tmp_path: Path, caplog) -> None:
    source = tmp_path / "src"
    write_image_folder(source, files=240, classes=4, width=64, height=48)
    upload(source, s3_bucket.store("raw"))
    options = faulty_options(s3_bucket, proxy)
    caplog.set_level(logging.DEBUG, logger="stoker.storage.retry")
    report = pack(
        f"{s3_bucket.url}/raw",
        f"{s3_bucket.url}/packed",
        config=PackConfig(samples_per_shard=30, workers=8),
        storage_options=options,
    )
    stats = proxy.stats()

    assert report.samples == 240
    assert report.shards == 8
    dataset = open_dataset(f"{s3_bucket.url}/packed", storage_options=s3_bucket.options())
    check = dataset.verify()  # every shard's SHA-256 and every sample's CRC-32
    assert check.ok, check.corrupt
    assert check.samples == 240
    keys = list(dataset.index.keys)
    assert len(set(keys)) == 240  # no sample twice
    originals = {
        p.relative_to(source).with_suffix("").as_posix(): p.read_bytes()
        for p in source.rglob("*.jpg")
    }
    assert {s["key"]: s["jpg"] for s in dataset.read_many(range(240))} == originals
    assert stats.faulted > 0
    assert retries_logged(caplog) == stats.faulted
    # The report counts them too: reads of the originals and writes of the shards.
    retried = {side: counters.get("retries", 0) for side, counters in report.requests.items()}
    assert sum(retried.values()) == stats.faulted
    assert report.requests["source"]["requests.get"] >= 240
    assert report.requests["destination"]["requests.put"] >= 9  # 8 shards and the index


def test_two_loader_epochs_under_faults(s3_bucket, proxy, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=200, classes=5, width=48, height=40)
    url = f"{s3_bucket.url}/ds"
    pack(
        tmp_path / "src",
        url,
        config=PackConfig(samples_per_shard=25),
        storage_options=s3_bucket.options(),
    )
    options = faulty_options(s3_bucket, proxy)
    all_keys = set(open_dataset(url, storage_options=s3_bucket.options()).index.keys)

    # Short blocks from many shards: a few hundred ranged GETs in two epochs.
    order = OrderConfig(block_size=2, group_blocks=4)
    with Loader(url, batch_size=16, seed=3, storage_options=options, order=order) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            indices: list[int] = []
            keys: list[str] = []
            for batch in loader:
                indices.extend(int(i) for i in batch["index"])
                keys.extend(batch["key"])
                assert all(isinstance(image, np.ndarray) for image in batch["image"])
            assert sorted(indices) == list(range(200)), f"epoch {epoch}"  # each exactly once
            assert len(keys) == 200
            assert set(keys) == all_keys
        stats = loader.stats()
    injected = proxy.stats()
    assert injected.faulted > 0
    assert stats.requests["retries"] == injected.faulted
    assert stats.samples == 400
    assert stats.requests["requests.get"] > 150
