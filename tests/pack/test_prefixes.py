"""pack --prefixes N: shards spread over N key prefixes, read back, verified and resumed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stoker import CacheConfig
from stoker.cli.main import cli
from stoker.errors import SourceError, StokerError
from stoker.format.reader import open_dataset
from stoker.format.spec import MAX_PREFIXES, prefix_labels, shard_key
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_image_folder


def _originals(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).with_suffix("").as_posix(): p.read_bytes() for p in root.rglob("*.jpg")
    }


def _prefix_counts(names: list[str]) -> Counter[str]:
    return Counter(name.rpartition("/")[0] for name in names)


def test_prefix_labels_are_distinct_and_spread() -> None:
    assert prefix_labels(1) == []
    assert prefix_labels(4) == ["00", "40", "80", "c0"]
    for n in (2, 3, 16, 17, 256, 257, MAX_PREFIXES):
        labels = prefix_labels(n)
        assert len(set(labels)) == n
        assert labels == sorted(labels)
        assert len({len(label) for label in labels}) == 1
    assert shard_key(5) == "shard-000005.tar"
    assert shard_key(5, prefixes=4) == "40/shard-000005.tar"
    with pytest.raises(ValueError, match="prefixes must be between"):
        prefix_labels(0)
    with pytest.raises(ValueError, match="prefixes must be between"):
        PackConfig(prefixes=MAX_PREFIXES + 1)


def test_one_prefix_keeps_the_flat_layout_and_index(tmp_path: Path) -> None:
    """The default writes the same index bytes as a pack that never heard of prefixes."""
    write_image_folder(tmp_path / "src", files=20, classes=2)
    pack(tmp_path / "src", tmp_path / "a", config=PackConfig(samples_per_shard=8))
    pack(tmp_path / "src", tmp_path / "b", config=PackConfig(samples_per_shard=8, prefixes=1))
    manifest = json.loads((tmp_path / "a" / "index.json").read_bytes())
    assert [s["name"] for s in manifest["shards"]] == [shard_key(n) for n in range(3)]
    assert "prefixes" not in manifest["packed_with"]
    for name in ("index.json", "index.bin"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_pack_with_four_prefixes_round_trips_locally(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=90, classes=3)
    result = CliRunner().invoke(
        cli,
        [
            "pack",
            str(tmp_path / "src"),
            str(tmp_path / "ds"),
            "--samples-per-shard",
            "10",
            "--prefixes",
            "4",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["shards"] == 9
    dataset = open_dataset(tmp_path / "ds")
    names = [s.name for s in dataset.shards]
    assert names == [shard_key(n, prefixes=4) for n in range(9)]
    assert _prefix_counts(names) == {"00": 3, "40": 2, "80": 2, "c0": 2}
    on_disk = sorted(
        p.relative_to(tmp_path / "ds").as_posix() for p in (tmp_path / "ds").rglob("*.tar")
    )
    assert on_disk == sorted(names)
    assert dataset.index.packed_with["prefixes"] == 4
    originals = _originals(tmp_path / "src")
    read = dataset.read_many(range(len(dataset)))
    assert {s["key"]: s["jpg"] for s in read} == originals
    assert [dataset[i]["jpg"] for i in (0, 45, 89)] == [read[i]["jpg"] for i in (0, 45, 89)]
    assert dataset.verify().ok
    verify = CliRunner().invoke(cli, ["verify", str(tmp_path / "ds")])
    assert verify.exit_code == 0, verify.output


def test_pack_with_four_prefixes_round_trips_on_s3(s3_bucket, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=60, classes=3)
    options = s3_bucket.options()
    report = pack(
        tmp_path / "src",
        f"{s3_bucket.url}/ds",
        config=PackConfig(samples_per_shard=6, prefixes=4),
        storage_options=options,
    )
    assert report.shards == 10
    listed = sorted(m.key for m in s3_bucket.store("ds").list("") if m.key.endswith(".tar"))
    assert _prefix_counts(listed) == {"00": 3, "40": 3, "80": 2, "c0": 2}
    dataset = open_dataset(f"{s3_bucket.url}/ds", storage_options=options)
    assert sorted(s.name for s in dataset.shards) == listed
    assert {s["key"]: s["jpg"] for s in dataset.read_many(range(60))} == _originals(
        tmp_path / "src"
    )
    assert dataset.verify().ok


def test_an_interrupted_spread_pack_resumes(tmp_path: Path) -> None:
    """A pack that stops at a bad input resumes, once mended, with the shards it finished."""
    write_image_folder(tmp_path / "src", files=40, classes=1)
    images = sorted((tmp_path / "src").rglob("*.jpg"))
    good = images[-1].read_bytes()
    images[-1].write_bytes(b"\xff\xd8\xff not a jpeg")  # in the last shard
    config = PackConfig(samples_per_shard=5, prefixes=4, shards_in_flight=1, workers=1)
    with pytest.raises(SourceError):
        pack(tmp_path / "src", tmp_path / "ds", config=config)
    assert not (tmp_path / "ds" / "index.json").exists()
    images[-1].write_bytes(good)
    with pytest.raises(StokerError, match="already holds a pack of other input"):
        pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=5))
    report = pack(tmp_path / "src", tmp_path / "ds", config=config)
    assert 0 < report.shards_reused < report.shards == 8
    dataset = open_dataset(tmp_path / "ds")
    assert _prefix_counts([s.name for s in dataset.shards]) == {"00": 2, "40": 2, "80": 2, "c0": 2}
    assert {s["key"]: s["jpg"] for s in dataset.read_many(range(40))} == _originals(
        tmp_path / "src"
    )
    assert dataset.verify().ok


def test_loader_and_disk_cache_read_a_spread_dataset(s3_bucket, tmp_path: Path) -> None:
    """Every sample once per epoch over 4 prefixes on S3; epoch 2 comes from the disk cache."""
    write_image_folder(tmp_path / "src", files=48, classes=2, width=64, height=48)
    options = s3_bucket.options()
    url = f"{s3_bucket.url}/ds"
    config = PackConfig(samples_per_shard=6, prefixes=4)
    pack(tmp_path / "src", url, config=config, storage_options=options)
    settings: dict[str, Any] = {
        "batch_size": 8,
        "transform": RandomResizedCrop(8),
        "cache": CacheConfig(dir=tmp_path / "cache"),
        "storage_options": options,
    }
    with Loader(url, **settings) as loader:
        first = [k for batch in loader for k in batch["key"]]
        cold = loader.stats().requests["requests.get"]
        loader.set_epoch(1)
        second = [k for batch in loader for k in batch["key"]]
        warm = loader.stats()
    assert sorted(first) == sorted(second) == sorted(_originals(tmp_path / "src"))
    assert warm.requests["requests.get"] == cold
    assert warm.disk_cache["cache.hits"] > 0


def test_stoker_index_reads_shards_under_prefixes(tmp_path: Path) -> None:
    """`stoker index` finds tars in prefix folders, and names them by their full keys."""
    write_image_folder(tmp_path / "src", files=20, classes=2)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=5, prefixes=4))
    for name in ("index.json", "index.bin"):
        (tmp_path / "ds" / name).unlink()
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    dataset = open_dataset(tmp_path / "ds")
    assert sorted(s.name for s in dataset.shards) == [shard_key(n, prefixes=4) for n in range(4)]
    assert {s["key"]: s["jpg"] for s in dataset.read_many(range(20))} == _originals(
        tmp_path / "src"
    )
