"""The Loader over a mix of datasets, over windows of records, and with side tables."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import CacheConfig, DecodeConfig, SourceConfig, World
from stoker.format.reader import open_dataset
from stoker.format.sidetable import write_side_table
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.mixing import MixConfig
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import CenterCrop, RandomResizedCrop
from stoker.pipeline.windows import WindowConfig
from stoker.storage import open_store
from stoker.testing.images import write_image_folder

SMALL = OrderConfig(block_size=4, group_blocks=3)


def _pack(root: Path, name: str, files: int, per_shard: int = 10) -> str:
    write_image_folder(root / f"{name}-src", files=files, classes=3, width=40, height=32)
    # In the input's order: windows are runs of consecutive frames.
    config = PackConfig(samples_per_shard=per_shard, shuffle_seed=None)
    pack(root / f"{name}-src", root / name, config=config)
    return str(root / name)


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("mix")
    return _pack(root, "a", 60), _pack(root, "b", 30)


def _epoch(loader: Loader) -> list[dict[str, Any]]:
    return list(loader)


def _pairs(batches: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(int(s), k) for b in batches for s, k in zip(b["source"], b["key"], strict=True)]


def test_a_weighted_mix_delivers_each_source_once_in_proportion(two: tuple[str, str]) -> None:
    with Loader(
        SourceConfig(list(two), mix=MixConfig(weights=(2, 1))),
        batch_size=9,
        transform=CenterCrop(8),
        order=SMALL,
    ) as loader:
        batches = _epoch(loader)
        shares = loader.mix_shares()
    pairs = _pairs(batches)
    counts = Counter(s for s, _ in pairs)
    assert counts == {0: 60, 1: 30}
    assert len(set(pairs)) == 90  # every sample of each source exactly once
    assert [s.samples for s in shares] == [60, 30]
    keys_a = set(open_dataset(two[0]).index.keys)
    assert {k for s, k in pairs if s == 0} == keys_a
    # Proportions hold along the stream, not only over the epoch.
    first_half = Counter(s for s, _ in pairs[:45])
    assert abs(first_half[0] - 30) <= 8


def test_upsampling_repeats_the_small_source(two: tuple[str, str]) -> None:
    mix = MixConfig(samples_per_epoch=(30, 60), replacement=True)
    with Loader(SourceConfig(list(two), mix=mix), batch_size=10, transform=CenterCrop(8)) as loader:
        pairs = _pairs(_epoch(loader))
    per_key = Counter(k for s, k in pairs if s == 1)
    assert sum(per_key.values()) == 60
    assert set(per_key.values()) == {2}  # every sample of b twice, none three times
    assert sum(1 for s, _ in pairs if s == 0) == 30


def test_a_mixed_epoch_resumes_exactly_and_splits_over_ranks(two: tuple[str, str]) -> None:
    options: dict[str, Any] = {
        "batch_size": 6,
        "transform": CenterCrop(8),
        "order": SMALL,
    }
    mixed = SourceConfig(list(two), mix=MixConfig(weights=(2, 1)))
    with Loader(mixed, **options) as full:
        whole = _pairs(_epoch(full))
    with Loader(mixed, **options) as first:
        it = iter(first)
        head = [next(it) for _ in range(4)]
        state = first.state_dict()
    with Loader(mixed, **options) as second:
        second.load_state_dict(state)
        tail = _epoch(second)
    assert _pairs(head) + _pairs(tail) == whole
    ranks = []
    for rank in range(2):
        with Loader(mixed, **options, world=World(rank=rank, world_size=2)) as loader:
            ranks.append(_pairs(_epoch(loader)))
    assert len(ranks[0]) == len(ranks[1])
    assert set(ranks[0]) | set(ranks[1]) == set(whole)


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _pack(tmp_path_factory.mktemp("frames"), "clip", 50, per_shard=20)


def test_windows_are_consecutive_records_once_per_epoch(frames: str) -> None:
    window = WindowConfig(size=4, shift=2)
    with Loader(
        SourceConfig(frames, window=window), batch_size=5, transform=RandomResizedCrop(8)
    ) as loader:
        batches = _epoch(loader)
    records = np.concatenate([b["records"] for b in batches])
    assert batches[0]["image"].shape == (5, 4, 8, 8, 3)
    assert batches[0]["label"].shape == (5, 4)
    assert (np.diff(records, axis=1) == 1).all()  # consecutive
    # Windows never cross a shard (20 records each): starts every 2, 9 per shard, 8 in the last 10.
    assert sorted(records[:, 0].tolist()) == [
        s for shard in (0, 20, 40) for s in range(shard, min(shard + 20, 50) - 3, 2)
    ]
    dataset = open_dataset(frames)
    labels = dataset.labels
    for batch in batches:
        np.testing.assert_array_equal(batch["label"], labels[batch["records"]])
        assert batch["key"] == [dataset.index.keys[r] for r in batch["records"][:, 0]]


def test_windows_keep_to_their_key_directory(tmp_path: Path) -> None:
    # 50 frames in three folders (17, 17, 16), two shards of 25: the second folder spans the
    # shard boundary, which cross_shards lets windows cross; folder boundaries still hold.
    clips = _pack(tmp_path, "clips", 50, per_shard=25)
    keys = open_dataset(clips).index.keys
    folder = [k.rpartition("/")[0] for k in keys]
    window = WindowConfig(size=4, shift=3, cross_shards=True, sequences="dirname")
    with Loader(
        SourceConfig(clips, window=window), batch_size=4, transform=CenterCrop(8)
    ) as loader:
        records = np.concatenate([b["records"] for b in _epoch(loader)])
    expected = []
    for name in dict.fromkeys(folder):
        members = [r for r, f in enumerate(folder) if f == name]
        assert members == list(range(members[0], members[-1] + 1))  # packed together
        expected += list(range(members[0], members[-1] + 1 - 3, 3))
    assert sorted(records[:, 0].tolist()) == expected
    for row in records.tolist():
        assert len({folder[r] for r in row}) == 1
    assert {folder[r] for r in records[:, 0]} == set(folder)
    assert any(r[0] < 25 <= r[-1] for r in records.tolist())  # one crosses the shard cut


def test_a_window_shares_one_augmentation(tmp_path: Path) -> None:
    # Identical frames: the same crop and flip for every frame gives identical outputs.
    write_image_folder(tmp_path / "src", files=1, classes=1, width=64, height=48)
    (image,) = (tmp_path / "src").rglob("*.jpg")
    for n in range(1, 12):
        (image.parent / f"copy_{n:03d}.jpg").write_bytes(image.read_bytes())
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(shuffle_seed=None))
    with Loader(
        SourceConfig(str(tmp_path / "ds"), window=WindowConfig(size=4)),
        batch_size=3,
        transform=RandomResizedCrop(16, flip=True),
    ) as loader:
        batches = _epoch(loader)
    frames_of = np.concatenate([b["image"] for b in batches])
    assert frames_of.shape == (3, 4, 16, 16, 3)
    for window in frames_of:
        for frame in window[1:]:
            np.testing.assert_array_equal(frame, window[0])
    assert not all(np.array_equal(frames_of[0, 0], w[0]) for w in frames_of[1:])


def test_windows_in_process_mode_equal_threads(frames: str) -> None:
    options: dict[str, Any] = {
        "batch_size": 4,
        "transform": RandomResizedCrop(8, flip=True),
        "seed": 5,
    }
    windows = SourceConfig(frames, window=WindowConfig(size=3))
    with Loader(windows, **options) as threads:
        a = _epoch(threads)
    with Loader(windows, **options, decode=DecodeConfig(threads=2, method="process")) as processes:
        b = _epoch(processes)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x["image"], y["image"])
        np.testing.assert_array_equal(x["records"], y["records"])


def test_side_table_rows_arrive_with_their_samples(frames: str, tmp_path: Path) -> None:
    n = len(open_dataset(frames))
    features = np.random.default_rng(0).standard_normal((n, 8)).astype(np.float16)
    write_side_table(open_store(tmp_path), "features.npy", features)
    url = str(tmp_path / "features.npy")
    for cache_dir in (None, tmp_path / "cache"):
        with Loader(
            SourceConfig(frames, side_tables={"features": url}),
            batch_size=7,
            transform=CenterCrop(8),
            cache=CacheConfig(dir=cache_dir),
        ) as loader:
            for batch in loader:
                np.testing.assert_array_equal(batch["features"], features[batch["index"]])
    with Loader(
        SourceConfig(frames, window=WindowConfig(size=2), side_tables={"features": url}),
        batch_size=3,
        transform=CenterCrop(8),
    ) as windows:
        for batch in windows:
            assert batch["features"].shape == (len(batch["key"]), 2, 8)
            np.testing.assert_array_equal(batch["features"], features[batch["records"]])


def test_a_side_table_of_the_wrong_length_is_refused(frames: str, tmp_path: Path) -> None:
    write_side_table(open_store(tmp_path), "short.npy", np.zeros((3, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="has 3 rows but"):
        Loader(SourceConfig(frames, side_tables={"f": str(tmp_path / "short.npy")}), batch_size=2)


def test_several_datasets_need_a_mix(two: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="mix="):
        Loader(list(two), batch_size=2)


def test_windows_over_a_shuffled_pack_are_refused(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=12, classes=2, width=24, height=20)
    pack(tmp_path / "src", tmp_path / "ds")  # shuffled, by default
    with pytest.raises(ValueError, match="--keep-order"):
        Loader(SourceConfig(str(tmp_path / "ds"), window=WindowConfig(size=4)), batch_size=2)
