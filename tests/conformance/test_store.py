"""The Store contract, run against every backend: memory, local files, S3 on SeaweedFS, and a
disk-caching store over memory."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stoker.storage import CachedStore, DiskCache, MemoryStore, Store, open_store
from stoker.storage.transfer import TransferConfig, upload

_memory_names = itertools.count()
MiB = 1024 * 1024


@pytest.fixture(params=["memory", "local", "s3", "cached"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    kind = request.param
    if kind == "memory":
        yield MemoryStore(f"conformance-{next(_memory_names)}")
    elif kind == "cached":
        inner = MemoryStore(f"conformance-{next(_memory_names)}")
        yield CachedStore(inner, DiskCache(tmp_path / "cache", max_bytes=64 * MiB), page_bytes=100)
    elif kind == "local":
        yield open_store(tmp_path / "root")
    else:
        bucket = request.getfixturevalue("s3_bucket")
        # Small parts so that multipart paths run on modest data.
        yield bucket.store("root", part_size_bytes=5 * MiB, multipart_threshold_bytes=5 * MiB)


def test_put_then_get_returns_the_same_bytes(store: Store) -> None:
    meta = store.put("a/b.bin", b"hello world")
    assert meta.size == 11
    assert bytes(store.get("a/b.bin")) == b"hello world"


def test_overwrite_replaces_the_object(store: Store) -> None:
    store.put("k", b"first")
    store.put("k", b"second!")
    assert bytes(store.get("k")) == b"second!"
    assert store.head("k").size == 7


def test_empty_object(store: Store) -> None:
    store.put("empty", b"")
    assert bytes(store.get("empty")) == b""
    assert store.head("empty").size == 0
    with pytest.raises(ValueError, match="past the object"):
        store.get_range("empty", start=0, end=1)


def test_keys_with_spaces_and_non_ascii(store: Store) -> None:
    keys = ["with space/file name.txt", "ünïcödé/日本語.bin", "sym+bols/a=b&c.txt"]
    for i, key in enumerate(keys):
        store.put(key, f"payload {i}".encode())
    for i, key in enumerate(keys):
        assert bytes(store.get(key)) == f"payload {i}".encode()
        assert store.head(key).key == key
    assert sorted(m.key for m in store.list()) == sorted(keys)


def test_get_range_and_ranges(store: Store) -> None:
    data = bytes(range(256)) * 4
    store.put("r", data)
    assert bytes(store.get_range("r", start=10, end=20)) == data[10:20]
    assert bytes(store.get_range("r", start=0, end=len(data))) == data
    views = store.get_ranges("r", starts=[0, 100, 1000], ends=[5, 300, 1024])
    assert [bytes(v) for v in views] == [data[0:5], data[100:300], data[1000:1024]]


def test_range_past_the_end_is_an_error(store: Store) -> None:
    store.put("short", b"0123456789")
    with pytest.raises(ValueError, match="past the object"):
        store.get_range("short", start=5, end=50)


def test_bad_range_is_refused(store: Store) -> None:
    store.put("r", b"0123456789")
    with pytest.raises(ValueError, match="bad byte range"):
        store.get_range("r", start=5, end=5)


def test_missing_object_is_file_not_found_naming_it(store: Store) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope/missing\.bin"):
        store.get("nope/missing.bin")
    with pytest.raises(FileNotFoundError, match=r"nope/missing\.bin"):
        store.head("nope/missing.bin")
    with pytest.raises(FileNotFoundError):
        store.get_range("nope/missing.bin", start=0, end=1)


def test_head_reports_size_and_etag(store: Store) -> None:
    store.put("h", b"x" * 1234)
    meta = store.head("h")
    assert meta.size == 1234
    assert meta.key == "h"
    assert meta.etag


def test_list_is_recursive_and_segment_based(store: Store) -> None:
    for key in ["d/1", "d/sub/2", "d/sub/deeper/3", "dx/4", "top"]:
        store.put(key, b"x")
    assert sorted(m.key for m in store.list("d")) == ["d/1", "d/sub/2", "d/sub/deeper/3"]
    assert sorted(m.key for m in store.list("")) == [
        "d/1",
        "d/sub/2",
        "d/sub/deeper/3",
        "dx/4",
        "top",
    ]
    assert list(store.list("no-such-prefix")) == []


def test_list_many_pages(store: Store, tmp_path: Path) -> None:
    keys = [f"many/{i:05d}" for i in range(2100)]
    local = tmp_path / "upload"
    (local / "many").mkdir(parents=True)
    for key in keys:
        (local / key).write_bytes(b"")
    upload(local, store, config=TransferConfig(workers=64))
    # S3 and memory list in key order; a local directory's order is the filesystem's.
    assert sorted(m.key for m in store.list("many")) == keys


def test_list_dir_shows_one_level(store: Store) -> None:
    for key in ["p/a.txt", "p/b.txt", "p/q/c.txt", "p/r/s/d.txt", "other"]:
        store.put(key, b"x")
    listing = store.list_dir("p")
    assert listing.prefixes == ["p/q", "p/r"]
    assert sorted(m.key for m in listing.objects) == ["p/a.txt", "p/b.txt"]
    root = store.list_dir("")
    assert root.prefixes == ["p"]
    assert [m.key for m in root.objects] == ["other"]


def test_delete_is_idempotent(store: Store) -> None:
    store.put("gone", b"x")
    store.delete("gone")
    store.delete("gone")
    with pytest.raises(FileNotFoundError):
        store.get("gone")


def test_large_object_multipart_and_parallel_ranged_get(store: Store, tmp_path: Path) -> None:
    data = os.urandom(12 * MiB + 12345)
    local = tmp_path / "large.bin"
    local.write_bytes(data)
    meta = store.put("large/from-file.bin", local)
    assert meta.size == len(data)
    store.put("large/from-bytes.bin", data)
    before = store.counters.get("requests.get")
    assert bytes(store.get("large/from-file.bin")) == data
    assert bytes(store.get("large/from-bytes.bin")) == data
    if not isinstance(store, MemoryStore) and store.url.startswith("s3://"):
        # 12 MiB in 5 MiB parts: three ranged GETs per object.
        assert store.counters.get("requests.get") - before == 6


def test_counters_count_requests_and_bytes(store: Store) -> None:
    store.put("c", b"abc")
    store.get("c")
    counts = store.counters.snapshot()
    assert counts["requests.put"] >= 1
    assert counts["requests.get"] >= 1
    assert counts["bytes.read"] >= 3
    assert counts["bytes.written"] >= 3


def test_invalid_keys_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="invalid object key"):
        store.put("", b"x")
    with pytest.raises(ValueError, match="invalid object key"):
        store.put("dir/", b"x")


def test_blocking_and_async_forms_agree(store: Store) -> None:
    data = bytes(range(256)) * 8

    meta = store.engine.run(store.put_async("ab/x.bin", data))
    store.put("ab/c/y.bin", b"y")

    async def async_forms() -> tuple[object, ...]:
        pages = [page async for page in store.list_async("ab")]
        return (
            bytes(await store.get_async("ab/x.bin")),
            bytes(await store.get_range_async("ab/x.bin", start=3, end=1500)),
            [
                bytes(v)
                for v in await store.get_ranges_async("ab/x.bin", starts=[0, 9], ends=[5, 2048])
            ],
            (await store.head_async("ab/x.bin")).size,
            sorted(m.key for page in pages for m in page),
            await store.list_dir_async("ab"),
        )

    blocking = (
        bytes(store.get("ab/x.bin")),
        bytes(store.get_range("ab/x.bin", start=3, end=1500)),
        [bytes(v) for v in store.get_ranges("ab/x.bin", starts=[0, 9], ends=[5, 2048])],
        store.head("ab/x.bin").size,
        sorted(m.key for m in store.list("ab")),
        store.list_dir("ab"),
    )
    assert store.engine.run(async_forms()) == blocking
    assert blocking[:4] == (data, data[3:1500], [data[:5], data[9:]], meta.size)
    assert blocking[4] == ["ab/c/y.bin", "ab/x.bin"]
    assert blocking[5].prefixes == ["ab/c"]

    store.engine.run(store.delete_async("ab/x.bin"))
    with pytest.raises(FileNotFoundError):
        store.head("ab/x.bin")
    with pytest.raises(FileNotFoundError):
        store.engine.run(store.head_async("ab/x.bin"))


def test_engine_cache_and_options(store: Store) -> None:
    assert not store.engine.closed
    assert store.options.part_size_bytes >= 5 * MiB
    assert (store.cache is not None) == isinstance(store, CachedStore)
