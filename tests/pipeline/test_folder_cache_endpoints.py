"""A disk cache shared by stores at different endpoints keeps their folders apart (issue
32 item 2).

Two stores with one bucket and prefix at different endpoints (a test server and
production, R2 and AWS) hold different objects. The folder listing kept in the disk cache
was keyed by ``storage_options["endpoint_url"]``, empty when the endpoint came from
``AWS_ENDPOINT_URL`` or a profile, so the second store was served the first's listing and,
through its ETags, the first's cached images. Here the two stores are the SeaweedFS server
reached directly and through a loopback proxy on another port (endpoints that differ and
nothing else), the folder rewritten with other images between the two: the second store
must see its own images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import CacheConfig
from stoker.pipeline.listing import listing_key
from stoker.pipeline.loader import Loader
from stoker.storage import open_store
from stoker.storage.cache import DiskCache
from stoker.storage.cached import CachedStore, store_endpoint
from stoker.storage.transfer import upload
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import NetProxy

FILES = 6


def _env_options(s3_bucket: Any, monkeypatch: pytest.MonkeyPatch, endpoint: str) -> dict[str, Any]:
    """Options without an endpoint: the endpoint comes from ``AWS_ENDPOINT_URL``."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    options: dict[str, Any] = s3_bucket.options()
    del options["endpoint_url"]
    return options


def _shapes(url: str, options: dict[str, Any], cache: CacheConfig) -> set[tuple[int, ...]]:
    with Loader(url, batch_size=FILES, storage_options=options, cache=cache) as loader:
        return {tuple(np.asarray(image).shape) for batch in loader for image in batch["image"]}


def test_a_folder_at_another_endpoint_is_not_served_the_cached_one(
    s3_bucket: Any,
    proxy: NetProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"{s3_bucket.url}/train"
    first, second = tmp_path / "first", tmp_path / "second"
    write_image_folder(first, files=FILES, classes=2, width=40, height=30)
    write_image_folder(second, files=FILES, classes=2, width=48, height=36, seed=1)
    cache = CacheConfig(dir=str(tmp_path / "cache"))

    upload(first, s3_bucket.store("train"))
    direct = _env_options(s3_bucket, monkeypatch, s3_bucket.server.endpoint)
    assert _shapes(url, direct, cache) == {(30, 40, 3)}  # listed, images cached

    upload(second, s3_bucket.store("train"))  # the "other store": same keys, other images
    proxied = _env_options(s3_bucket, monkeypatch, proxy.endpoint)
    assert _shapes(url, proxied, cache) == {(36, 48, 3)}

    keys = {
        listing_key(open_store(url, storage_options=direct | {"endpoint_url": endpoint}))
        for endpoint in (s3_bucket.server.endpoint, proxy.endpoint)
    }
    assert len(keys) == 2


def test_cached_pages_are_kept_apart_by_endpoint(
    s3_bucket: Any, proxy: NetProxy, tmp_path: Path
) -> None:
    """An ETag names a version at its own endpoint only: pages cached under it for one
    store are not another's."""
    disk = DiskCache(tmp_path / "cache", max_bytes=1 << 24)
    direct = s3_bucket.store("p")
    meta = direct.put("obj", b"a" * 1000)
    version = {"obj": (f"etag:{meta.etag}", 1000)}
    assert bytes(CachedStore(direct, disk, objects=version).get_range("obj", start=0, end=10)) == (
        b"a" * 10
    )
    direct.put("obj", b"b" * 1000)  # what the store at the other endpoint holds
    other = s3_bucket.store("p", endpoint=proxy.endpoint)
    assert store_endpoint(other) != store_endpoint(direct)
    read = CachedStore(other, disk, objects=version).get_range("obj", start=0, end=10)
    assert bytes(read) == b"b" * 10
    disk.close()


def test_the_endpoint_of_a_store_is_the_resolved_one_and_holds_no_password(
    s3_bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = _env_options(s3_bucket, monkeypatch, "http://user:SECRET@127.0.0.1:9")
    store = open_store(f"{s3_bucket.url}/p", storage_options=options)
    assert store.options.endpoint_url is None
    assert store_endpoint(store) == "http://***@127.0.0.1:9"
