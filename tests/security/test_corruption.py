"""Corrupt data is never returned as if it were good: a clear error naming shard and sample,
or, where the user asked to skip, a skip that is counted.

Each kind of damage (a flipped byte, a truncated shard, an index from another dataset, a
newer format version, an undecodable JPEG) goes through every way of reading: indexing,
``read_many``, ``verify()`` and the Loader (which raises a ValueError naming the sample, or
with ``on_error="skip"`` skips and lists it), on local files, and the first three on S3.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import DecodeConfig, OrderConfig
from stoker.errors import CorruptShardError, ShardFormatError
from stoker.format.foreign.base import Sample
from stoker.format.index import DatasetIndex, read_index, write_index
from stoker.format.reader import ShardDataset, open_dataset
from stoker.format.writer import ShardWriter
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import CenterCrop
from stoker.storage import Store, open_store
from stoker.testing.images import make_jpeg

RNG = np.random.default_rng(11)
KEYS = [f"k{i}" for i in range(8)]


def make_dataset(store: Store, *, images: dict[str, bytes] | None = None, size: int = 40) -> None:
    """Two shards of four JPEG samples each (``images`` overrides some samples' bytes)."""
    records = []
    for number in range(2):
        writer = ShardWriter(store, f"shard-{number:06d}.tar")
        for key in KEYS[number * 4 : number * 4 + 4]:
            image = (images or {}).get(key) or make_jpeg(RNG, width=size, height=size - 10)
            writer.add(Sample(key=key, fields={"jpg": image, "cls": b"1"}, label=1))
        records.append(writer.close())
    write_index(store, DatasetIndex.from_shards(records, class_names=["a", "b"], fields={}))


def damage(store: Store, name: str, *, flip_at: int | None = None, keep: int | None = None) -> None:
    data = bytearray(bytes(store.get(name)))
    if flip_at is not None:
        data[flip_at] ^= 0x55
    if keep is not None:
        del data[keep:]
    store.put(name, bytes(data))


def data_offset(store: Store, key: str) -> int:
    """A byte inside the data of sample ``key``'s first member."""
    index = read_index(store)
    return int(index.offset[index.keys.index(key)]) + 512 + 7


def loader(url: str | ShardDataset, **options: Any) -> Loader:
    return Loader(
        url, batch_size=8, transform=CenterCrop(16), **options, order=OrderConfig(mode="none")
    )


@pytest.fixture
def local(tmp_path: Path) -> tuple[str, Store]:
    store = open_store(tmp_path / "ds")
    make_dataset(store)
    return str(tmp_path / "ds"), store


# -- a flipped byte -------------------------------------------------------------------------


def test_flipped_byte_is_named_by_every_reader(local: tuple[str, Store]) -> None:
    url, store = local
    damage(store, "shard-000001.tar", flip_at=data_offset(store, "k5"))
    dataset = open_dataset(url)
    named = r"shard-000001\.tar: sample 'k5' \(#5\) fails its CRC-32 check"
    assert dataset[4]["key"] == "k4"
    with pytest.raises(CorruptShardError, match=named):
        dataset[5]
    with pytest.raises(CorruptShardError, match=named):
        dataset.read_many(range(8))
    kept = dataset.read_many(range(8), return_errors=True)
    assert [type(x).__name__ for x in kept] == ["dict"] * 5 + ["CorruptShardError"] + ["dict"] * 2
    assert dataset.verify().corrupt == [
        ("shard-000001.tar", "k5", "sample bytes fail their CRC-32")
    ]
    with loader(url) as running, pytest.raises(ValueError, match=named):
        list(running)


def test_flipped_byte_in_a_header_is_caught_too(local: tuple[str, Store]) -> None:
    url, store = local
    damage(store, "shard-000000.tar", flip_at=data_offset(store, "k2") - 7 - 512 + 3)
    with pytest.raises(CorruptShardError, match="sample 'k2'"):
        open_dataset(url)[2]


def test_flipped_byte_outside_every_sample_is_found_by_verify(local: tuple[str, Store]) -> None:
    url, store = local
    size = len(bytes(store.get("shard-000000.tar")))
    damage(store, "shard-000000.tar", flip_at=size - 10)  # in the end-of-archive blocks
    dataset = open_dataset(url)
    assert [s["key"] for s in dataset.read_many(range(8))] == KEYS  # every sample is intact
    assert dataset.verify().corrupt == [
        ("shard-000000.tar", "", "SHA-256 mismatch outside any sample")
    ]


def test_loader_skips_and_counts_a_corrupt_sample(local: tuple[str, Store]) -> None:
    url, store = local
    damage(store, "shard-000001.tar", flip_at=data_offset(store, "k5"))
    with loader(url, decode=DecodeConfig(on_error="skip")) as running:
        keys = [k for batch in running for k in batch["key"]]
        skipped = running.stats().skipped
    assert keys == [k for k in KEYS if k != "k5"]
    assert [key for key, _ in skipped] == ["k5"]
    assert "CRC-32" in skipped[0][1]


# -- a truncated shard ------------------------------------------------------------------------


def test_truncated_shard_is_named_by_every_reader(local: tuple[str, Store]) -> None:
    url, store = local
    full = len(bytes(store.get("shard-000001.tar")))
    damage(store, "shard-000001.tar", keep=full // 2)
    dataset = open_dataset(url)  # the index is fine; the shard is not
    named = rf"shard-000001\.tar: shard is {full // 2} bytes, but the index says {full}"
    assert [s["key"] for s in dataset.read_many(range(4))] == KEYS[:4]
    for i in (4, 7):  # before and after the cut: the whole shard is refused
        with pytest.raises(CorruptShardError, match=named):
            dataset[i]
    with pytest.raises(CorruptShardError, match=named):
        dataset.read_many(range(8))
    kept = dataset.read_many(range(8), return_errors=True)
    assert all(isinstance(x, CorruptShardError) for x in kept[4:])
    assert all(isinstance(x, dict) for x in kept[:4])
    report = dataset.verify()
    assert ("shard-000001.tar", "", f"size {full // 2} != {full} in the index") in report.corrupt
    assert not report.ok
    with loader(url) as running, pytest.raises(ValueError, match=named):
        list(running)


def test_loader_skips_and_counts_a_truncated_shard(local: tuple[str, Store]) -> None:
    url, store = local
    damage(store, "shard-000001.tar", keep=3000)
    with loader(url, decode=DecodeConfig(on_error="skip")) as running:
        keys = [k for batch in running for k in batch["key"]]
        skipped = running.stats().skipped
    assert keys == KEYS[:4]
    assert sorted(key for key, _ in skipped) == KEYS[4:]
    assert all("shard is 3000 bytes" in reason for _, reason in skipped)


def test_flipped_byte_and_truncated_shard_on_s3(s3_bucket: Any) -> None:
    store = s3_bucket.store("ds")
    make_dataset(store)
    damage(store, "shard-000000.tar", flip_at=data_offset(store, "k1"))
    damage(store, "shard-000001.tar", keep=2048)
    dataset = open_dataset(f"{s3_bucket.url}/ds", storage_options=s3_bucket.options())
    with pytest.raises(CorruptShardError, match=r"shard-000000\.tar: sample 'k1'"):
        dataset.read_many(range(4))
    with pytest.raises(CorruptShardError, match=r"shard-000001\.tar: shard is 2048 bytes"):
        dataset[6]
    corrupt = dataset.verify().corrupt
    assert ("shard-000000.tar", "k1", "sample bytes fail their CRC-32") in corrupt
    assert any(c[0] == "shard-000001.tar" and "size 2048" in c[2] for c in corrupt)


# -- an index from another dataset, a newer version ------------------------------------------


@pytest.mark.parametrize("same_sizes", [True, False])
def test_index_from_another_dataset_is_caught(tmp_path: Path, same_sizes: bool) -> None:
    ours, theirs = open_store(tmp_path / "ours"), open_store(tmp_path / "theirs")
    make_dataset(ours)
    make_dataset(theirs, size=40 if same_sizes else 64)
    for name in ("index.json", "index.bin"):
        ours.put(name, bytes(theirs.get(name)))
    dataset = open_dataset(tmp_path / "ours")
    if same_sizes:  # identical layout, other bytes: every sample fails its CRC
        expected = r"shard-000000\.tar: sample 'k0' \(#0\) fails its CRC-32"
    else:
        expected = r"shard-000000\.tar: shard is \d+ bytes, but the index says \d+ .*another"
    with pytest.raises(CorruptShardError, match=expected):
        dataset[0]
    with pytest.raises(CorruptShardError, match=expected):
        dataset.read_many(range(8))
    assert not dataset.verify().ok
    with loader(str(tmp_path / "ours")) as running, pytest.raises(ValueError, match=expected):
        list(running)


def test_arrays_from_another_dataset_are_refused_on_open(tmp_path: Path) -> None:
    ours, theirs = open_store(tmp_path / "ours"), open_store(tmp_path / "theirs")
    make_dataset(ours)
    make_dataset(theirs)
    ours.put("index.bin", bytes(theirs.get("index.bin")))
    expected = r"index\.bin: checksum does not match index\.json \(an index from another"
    with pytest.raises(ShardFormatError, match=expected):
        open_dataset(tmp_path / "ours")
    with pytest.raises(ShardFormatError, match=expected):
        loader(str(tmp_path / "ours"))


def test_newer_format_version_is_refused(local: tuple[str, Store]) -> None:
    url, store = local
    manifest = json.loads(bytes(store.get("index.json")))
    manifest["version"] = 2
    store.put("index.json", json.dumps(manifest).encode())
    expected = r"index\.json: format version 2 is newer than this stoker reads \(1\)"
    with pytest.raises(ShardFormatError, match=expected):
        open_dataset(url)
    with pytest.raises(ShardFormatError, match=expected):
        loader(url)


# -- an undecodable JPEG ------------------------------------------------------------------


@pytest.mark.parametrize("transform", [CenterCrop(16), None])
def test_undecodable_jpeg_is_named_or_skipped_and_counted(
    tmp_path: Path, transform: CenterCrop | None
) -> None:
    good = make_jpeg(RNG, width=40, height=30)
    broken = {"k2": b"\xff\xd8\xff\xe0" + b"not really a jpeg" * 10, "k6": good[: len(good) // 2]}
    store = open_store(tmp_path / "ds")
    make_dataset(store, images=broken)
    url = str(tmp_path / "ds")
    dataset = open_dataset(url)
    assert dataset[2]["jpg"] == broken["k2"]  # the bytes are intact; they are not an image
    assert dataset.verify().ok
    options = {"batch_size": 8, "order": OrderConfig(mode="none"), "transform": transform}
    running = Loader(url, **options)
    with running, pytest.raises(ValueError, match=r"sample 'k2'.*cannot decode JPEG"):
        list(running)
    with Loader(url, **options, decode=DecodeConfig(on_error="skip")) as running:
        batches = list(running)
        skipped = running.stats().skipped
    assert [k for batch in batches for k in batch["key"]] == ["k0", "k1", "k3", "k4", "k5", "k7"]
    assert [key for key, _ in skipped] == ["k2", "k6"]
    assert all("cannot decode JPEG" in reason for _, reason in skipped)
