"""What a folder's listing holds and what its reads check (issue 22.10, 22.11).

Keys that no request can name (a tab, a newline) are left out at listing, with a warning
that counts them and names them escaped; they used to be listed as images and fail the
first batch, ``on_error="skip"`` or not. An object rewritten with another size since its
listing was kept in the disk cache is named, with `stoker cache clear`, and skipped with
``on_error="skip"``: one that grew was read short (a sound image reported as a truncated
JPEG), one that shrank failed with "range ends past the object", which skip did not skip.
All against the real SeaweedFS server.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import CacheConfig, DecodeConfig
from stoker.errors import SourceError
from stoker.pipeline.folder import open_folder
from stoker.pipeline.listing import ListedStore
from stoker.pipeline.loader import Loader
from stoker.storage.transfer import upload
from stoker.testing.images import make_jpeg, write_image_folder
from stoker.testing.sigv4 import signed_request

FILES, CLASSES = 12, 3


@pytest.fixture(scope="module")
def local_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("folder") / "train"
    write_image_folder(root, files=FILES, classes=CLASSES, width=40, height=30)
    return root


def _put_raw(s3_bucket: Any, key_path: str, body: bytes) -> None:
    """PUT by URL-encoded path: obstore refuses to send a key with a control character."""
    options = s3_bucket.options()
    status = signed_request(
        "PUT",
        "127.0.0.1",
        s3_bucket.server.port,
        f"/{s3_bucket.name}/{key_path}",
        access_key=options["access_key_id"],
        secret_key=options["secret_access_key"],
        region="us-east-1",
        body=body,
    )
    assert status == 200


def _keys(loader: Loader) -> list[str]:
    return [k for batch in loader for k in batch["key"]]


def _all_keys(root: Path) -> set[str]:
    return {p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.jpg")}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_keys_no_request_can_name_are_left_out_at_listing(
    s3_bucket: Any, local_folder: Path, caplog: pytest.LogCaptureFixture, on_error: str
) -> None:
    upload(local_folder, s3_bucket.store("train"))
    image = (local_folder / "class_00" / "img_000000.jpg").read_bytes()
    _put_raw(s3_bucket, "train/class_00/tab%09key.jpg", image)
    _put_raw(s3_bucket, "train/class_01/new%0Aline.jpg", image)
    url, options = f"{s3_bucket.url}/train", s3_bucket.options()
    caplog.set_level(logging.WARNING, logger="stoker.pipeline.folder")
    decode = DecodeConfig(on_error=on_error)  # type: ignore[arg-type]
    with Loader(url, batch_size=5, storage_options=options, decode=decode) as loader:
        assert len(loader.dataset) == FILES
        assert sorted(_keys(loader)) == sorted(_all_keys(local_folder))
        assert loader.stats().skipped == []
    warnings = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warnings) == 1
    assert "left out 2 object(s) whose keys no request can name" in warnings[0]
    assert "'class_00/tab\\tkey.jpg'" in warnings[0]
    assert "'class_01/new\\nline.jpg'" in warnings[0]
    assert "\t" not in warnings[0]
    assert "\n" not in warnings[0]


def _replace_two(s3_bucket: Any, local_folder: Path) -> tuple[str, str]:
    """Rewrite one image larger and one smaller, both sound JPEGs."""
    store = s3_bucket.store("train")
    grown, shrunk = "class_01/img_000001.jpg", "class_02/img_000002.jpg"
    rng = np.random.default_rng(5)
    bigger = make_jpeg(rng, width=120, height=90)
    smaller = make_jpeg(rng, width=8, height=8)
    assert len(bigger) > (local_folder / grown).stat().st_size
    assert len(smaller) < (local_folder / shrunk).stat().st_size
    store.put(grown, bigger)
    store.put(shrunk, smaller)
    return grown, shrunk


def test_an_object_resized_since_a_cached_listing_is_named_and_skipped(
    s3_bucket: Any, local_folder: Path, tmp_path: Path
) -> None:
    upload(local_folder, s3_bucket.store("train"))
    url, options = f"{s3_bucket.url}/train", s3_bucket.options()
    cache = CacheConfig(dir=str(tmp_path / "cache"))
    Loader(url, batch_size=4, storage_options=options, cache=cache).close()  # lists, caches
    replaced = _replace_two(s3_bucket, local_folder)

    changed = (
        r"class_0[12]/img_00000[12]\.jpg: changed since the folder was listed \(listed \d+ "
        r"bytes, now \d+\): the listing kept in the disk cache is stale; empty it with "
        r"`stoker cache clear DIR`"
    )
    with (
        Loader(url, batch_size=4, storage_options=options, cache=cache) as loader,
        pytest.raises(ValueError, match=changed),
    ):
        list(loader)
    skip = DecodeConfig(on_error="skip")
    with Loader(url, batch_size=4, storage_options=options, cache=cache, decode=skip) as loader:
        assert len(_keys(loader)) == FILES - 2
        skipped = dict(loader.stats().skipped)
    assert sorted(f"{key}.jpg" for key in skipped) == sorted(replaced)
    for key, reason in skipped.items():
        assert f"{key}.jpg: changed since the folder was listed" in reason
        assert "stoker cache clear" in reason


def test_an_object_resized_while_a_fresh_listing_is_read_is_named(
    s3_bucket: Any, local_folder: Path
) -> None:
    upload(local_folder, s3_bucket.store("train"))
    url, options = f"{s3_bucket.url}/train", s3_bucket.options()
    dataset = open_folder(url, storage_options=options, cache=None, page_bytes=1 << 20).dataset
    grown, shrunk = _replace_two(s3_bucket, local_folder)
    for key in (grown, shrunk):
        listed = int(dataset.sizes[dataset.objects.index(key)])
        [sample] = dataset.store.engine.run(dataset.read_many_async([dataset.objects.index(key)]))
        error = str(sample["error"])
        assert f"{url}/{key}: changed since the folder was listed (listed {listed} bytes" in error
        assert "rewritten while being read" in error


def test_listed_store_checks_whole_and_partial_reads_against_the_listing(s3_bucket: Any) -> None:
    store = s3_bucket.store("p")
    store.put("grew", b"g" * 150)
    store.put("shrank", b"s" * 60)
    store.put("same", b"x" * 100)
    listed = ListedStore(store, {"grew": 100, "shrank": 100, "same": 100})
    assert bytes(listed.get_range("same", start=0, end=100)) == b"x" * 100
    assert bytes(listed.get_range("same", start=40, end=100)) == b"x" * 60
    with pytest.raises(
        SourceError, match=r"p/grew: changed since .* \(listed 100 bytes, now 150\)"
    ):
        listed.get_range("grew", start=0, end=100)
    with pytest.raises(
        SourceError, match=r"p/shrank: changed since .* \(listed 100 bytes, now 60\)"
    ):
        listed.get_range("shrank", start=0, end=100)
    with pytest.raises(
        SourceError, match=r"p/shrank: changed since .* \(listed 100 bytes, now 60\)"
    ):
        listed.get_range("shrank", start=50, end=100)  # a later page of it
    with pytest.raises(ValueError, match="ends past the object") as caught:
        listed.get_range("same", start=50, end=120)  # the caller's range is wrong, not the listing
    assert not isinstance(caught.value, SourceError)
