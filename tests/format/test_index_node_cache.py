"""A dataset's index read through the node's disk cache: fetched once per node (issue 32
item 8), and read anew when the dataset is packed again."""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path

import pytest

from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.testing.images import write_image_folder


def _pack(tmp_path: Path, files: int) -> str:
    write_image_folder(tmp_path / f"src{files}", files=files, classes=2, width=16, height=16)
    url = str(tmp_path / "ds")
    pack(tmp_path / f"src{files}", url, config=PackConfig(samples_per_shard=4))
    return url


def test_a_second_open_reads_the_index_from_the_cache_after_one_head(tmp_path: Path) -> None:
    url = _pack(tmp_path, 12)
    first = open_dataset(url, cache_dir=tmp_path / "cache")
    assert first.store.counters.get("requests.get") == 2  # index.json, index.bin
    again = open_dataset(url, cache_dir=tmp_path / "cache")
    assert again.store.counters.get("requests.get") == 0
    assert again.store.counters.get("requests.head") == 1  # index.json's version
    assert len(again) == len(first) == 12
    assert again.index.shards == first.index.shards


def test_a_dataset_packed_again_is_read_anew(tmp_path: Path) -> None:
    url = _pack(tmp_path, 12)
    assert len(open_dataset(url, cache_dir=tmp_path / "cache")) == 12
    shutil.rmtree(url)
    _pack(tmp_path, 20)  # the same location, another index
    again = open_dataset(url, cache_dir=tmp_path / "cache")
    assert len(again) == 20
    assert again.store.counters.get("requests.get") == 2


def test_a_directory_that_cannot_hold_a_cache_reads_the_index_from_the_store(
    tmp_path: Path,
) -> None:
    url = _pack(tmp_path, 12)
    assert len(open_dataset(url, cache_dir="/proc/self")) == 12


def _open(url: str, cache_dir: str, out: multiprocessing.Queue[tuple[int, int]]) -> None:
    dataset = open_dataset(url, cache_dir=cache_dir)
    out.put((len(dataset), dataset.store.counters.get("requests.get")))


@pytest.mark.slow
def test_processes_opening_at_once_fetch_the_index_once(tmp_path: Path) -> None:
    """Eight processes open one dataset at once through one cache directory: two GETs in
    all (index.json and index.bin, by the process that claimed each), none by the others."""
    url = _pack(tmp_path, 12)
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[tuple[int, int]] = context.Queue()
    processes = [
        context.Process(target=_open, args=(url, str(tmp_path / "cache"), out)) for _ in range(8)
    ]
    for process in processes:
        process.start()
    results = [out.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert [size for size, _ in results] == [12] * 8
    assert sum(gets for _, gets in results) == 2
