"""Streaming an unpacked image folder (bucket prefix or local directory) with the Loader."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import CacheConfig, DecodeConfig, World
from stoker.pipeline import folder
from stoker.pipeline.folder import FolderSource
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.storage.transfer import upload
from stoker.testing.images import write_image_folder

FILES, CLASSES = 45, 3


@pytest.fixture(scope="module")
def local_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("folder") / "train"
    write_image_folder(root, files=FILES, classes=CLASSES, width=40, height=30)
    return root


@pytest.fixture
def bucket_folder(s3_bucket: Any, local_folder: Path) -> tuple[str, dict[str, Any]]:
    upload(local_folder, s3_bucket.store("train"))
    return f"{s3_bucket.url}/train", s3_bucket.options()


def _all_keys(root: Path) -> set[str]:
    return {p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.jpg")}


def _keys(loader: Loader) -> list[str]:
    return [k for batch in loader for k in batch["key"]]


@pytest.fixture(params=["local", "bucket"])
def location(request: pytest.FixtureRequest, local_folder: Path) -> tuple[str, dict[str, Any]]:
    if request.param == "local":
        return str(local_folder), {}
    result: tuple[str, dict[str, Any]] = request.getfixturevalue("bucket_folder")
    return result


@pytest.mark.parametrize(("world", "workers"), [(1, 1), (2, 2), (3, 1), (2, 3)])
def test_each_image_once_across_ranks_and_workers(
    location: tuple[str, dict[str, Any]], local_folder: Path, world: int, workers: int
) -> None:
    url, options = location
    per_rank = []
    for rank in range(world):
        keys: list[str] = []
        for worker in range(workers):
            with Loader(
                url,
                batch_size=4,
                transform=RandomResizedCrop(8),
                world=World(rank=rank, world_size=world, worker=worker, num_workers=workers),
                decode=DecodeConfig(threads=2),
                storage_options=options,
            ) as loader:
                assert isinstance(loader.source, FolderSource)
                keys += _keys(loader)
        per_rank.append(keys)
    assert len({len(k) for k in per_rank}) == 1  # equal epochs on every rank
    everything = [k for keys in per_rank for k in keys]
    assert set(everything) == _all_keys(local_folder)
    assert len(everything) - FILES < world  # padding: fewer than world_size repeats


def test_the_order_is_a_pure_function_of_the_listing_seed_and_epoch(
    bucket_folder: tuple[str, dict[str, Any]], local_folder: Path
) -> None:
    url, options = bucket_folder
    orders = []
    for where, opts in ((url, options), (str(local_folder), {})):
        with Loader(where, batch_size=5, seed=7, storage_options=opts) as loader:
            loader.set_epoch(1)
            orders.append(loader.source.epoch_order(loader.order_config, 1).samples.tolist())
            keys = _keys(loader)
        assert len(keys) == FILES
    assert orders[0] == orders[1]  # same sorted listing in a bucket and on disk
    with Loader(url, batch_size=5, seed=7, storage_options=options) as loader:
        other_epoch = loader.source.epoch_order(loader.order_config, 2).samples.tolist()
        reseeded = replace(loader.order_config, seed=8)
        other_seed = loader.source.epoch_order(reseeded, 1).samples.tolist()
    assert other_epoch != orders[0]
    assert other_seed != orders[0]


def test_an_epoch_is_a_full_permutation_one_get_per_image(
    bucket_folder: tuple[str, dict[str, Any]],
) -> None:
    url, options = bucket_folder
    with Loader(url, batch_size=9, seed=1, storage_options=options) as loader:
        loader.read_ahead = False  # count this epoch's GETs only, not the next one's
        order = loader.source.epoch_order(loader.order_config, 0)
        batches = list(loader)
        stats = loader.stats()
    # Blocks of one object: batches mix classes although the listing is sorted by class.
    assert np.mean([len(set(b["label"].tolist())) for b in batches]) > 2
    assert sorted(order.samples.tolist()) == list(range(FILES))
    assert stats.requests["requests.get"] == FILES
    assert stats.requests.get("requests.list", 0) >= 1  # the listing, on the same store


def test_resume_equals_an_uninterrupted_run(bucket_folder: tuple[str, dict[str, Any]]) -> None:
    url, options = bucket_folder
    kwargs: dict[str, Any] = {
        "batch_size": 4,
        "transform": RandomResizedCrop(8),
        "storage_options": options,
    }
    with Loader(url, **kwargs) as loader:
        loader.set_epoch(2)
        full = _keys(loader)
    with Loader(url, **kwargs) as loader:
        loader.set_epoch(2)
        stream = iter(loader)
        head = [k for _ in range(5) for k in next(stream)["key"]]
        state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (2, 5)
    with Loader(url, **kwargs, decode=DecodeConfig(threads=3)) as resumed:
        resumed.load_state_dict(state)
        tail = _keys(resumed)
    assert head + tail == full


def test_resume_onto_a_new_world_size(
    location: tuple[str, dict[str, Any]], local_folder: Path
) -> None:
    url, options = location
    kwargs: dict[str, Any] = {"batch_size": 3, "storage_options": options}
    seen: list[str] = []
    states = []
    for rank in range(2):
        with Loader(url, **kwargs, world=World(rank=rank, world_size=2)) as loader:
            stream = iter(loader)
            seen += [k for _ in range(3) for k in next(stream)["key"]]
            states.append(loader.state_dict())
    assert states[0] == states[1]
    rest: list[str] = []
    for rank in range(3):
        with Loader(url, **kwargs, world=World(rank=rank, world_size=3)) as loader:
            loader.load_state_dict(states[0])
            rest += _keys(loader)
    assert not set(rest) & set(seen)  # nothing repeated
    assert set(rest) | set(seen) == _all_keys(local_folder)  # nothing skipped


def test_labels_and_class_names_come_from_folder_names(
    location: tuple[str, dict[str, Any]],
) -> None:
    url, options = location
    with Loader(url, batch_size=8, storage_options=options) as loader:
        names = loader.dataset.class_names
        batches = list(loader)
    assert names == [f"class_{n:02d}" for n in range(CLASSES)]  # sorted, as pack numbers them
    for batch in batches:
        for key, label in zip(batch["key"], batch["label"].tolist(), strict=True):
            assert names[label] == key.split("/")[0]


def test_neither_index_nor_images_names_both_ways(s3_bucket: Any, tmp_path: Path) -> None:
    s3_bucket.store("notes").put("readme.txt", b"no images here")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("no images here")
    for url, options in (
        (f"{s3_bucket.url}/notes", s3_bucket.options()),
        (str(tmp_path / "notes"), {}),
    ):
        with pytest.raises(FileNotFoundError) as caught:
            Loader(url, batch_size=4, storage_options=options)
        message = str(caught.value)
        assert url in message
        assert "no index.json" in message
        assert f"`stoker pack {url} {url}-packed`" in message  # never into what is there
        assert "class folders" in message


def test_the_listing_is_kept_in_the_disk_cache(
    bucket_folder: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = bucket_folder
    cache = CacheConfig(dir=str(tmp_path / "cache"))
    kwargs: dict[str, Any] = {"batch_size": 8, "storage_options": options, "cache": cache}
    with Loader(url, **kwargs) as first:
        keys = sorted(_keys(first))
        before = first.stats().requests
    assert before.get("requests.list", 0) >= 1
    assert before["requests.get"] == FILES
    with Loader(url, **kwargs) as second:
        assert sorted(_keys(second)) == keys
        after = second.stats().requests
        disk = second.stats().disk_cache
    assert after.get("requests.list", 0) == 0  # the listing came from the disk cache
    assert after.get("requests.get", 0) == 0  # and the images too (versioned by ETag)
    assert after.get("requests.head", 0) == 0
    assert disk.get("cache.hits", 0) >= FILES


def test_an_image_gone_since_a_cached_listing_is_named(
    s3_bucket: Any, local_folder: Path, tmp_path: Path
) -> None:
    store = s3_bucket.store("train")
    upload(local_folder, store)
    url, options = f"{s3_bucket.url}/train", s3_bucket.options()
    cache = CacheConfig(dir=str(tmp_path / "cache"))
    Loader(url, batch_size=8, storage_options=options, cache=cache).close()  # lists, caches
    store.delete("class_01/img_000001.jpg")
    gone = r"class_01/img_000001\.jpg: gone since"
    with (
        Loader(url, batch_size=8, storage_options=options, cache=cache) as loader,
        pytest.raises(ValueError, match=gone),
    ):
        list(loader)
    skip = DecodeConfig(on_error="skip")
    with Loader(url, batch_size=8, storage_options=options, cache=cache, decode=skip) as loader:
        assert len(_keys(loader)) == FILES - 1
        assert [k for k, _ in loader.stats().skipped] == ["class_01/img_000001"]


def test_the_pack_hint_is_logged_once_per_process(
    local_folder: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(folder, "_hinted", set())
    caplog.set_level(logging.WARNING, logger="stoker.pipeline.folder")
    for _ in range(2):
        Loader(str(local_folder), batch_size=4).close()
    hints = [r for r in caplog.records if "stoker pack" in r.getMessage()]
    assert len(hints) == 1
    message = hints[0].getMessage()
    assert f"stoker pack {local_folder} {local_folder}-packed" in message
    assert folder.PACKED_SPEEDUP in message
