"""Shard writer, index and reader: round trips, tar compatibility, corruption."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.errors import CorruptShardError, ShardFormatError
from stoker.format.foreign.base import Sample
from stoker.format.index import DatasetIndex, read_index, write_index
from stoker.format.reader import ShardDataset
from stoker.format.runs import plan_runs
from stoker.format.spec import check_key
from stoker.format.tar import member_header, parse_members
from stoker.format.writer import ShardWriter
from stoker.storage import MemoryStore

keys = st.from_regex(r"[a-z0-9_][a-z0-9_/-]{0,30}", fullmatch=True).filter(
    lambda k: "//" not in k and not k.endswith("/") and ".." not in k
)
extensions = st.sampled_from(["jpg", "png", "cls", "json", "txt", "npy"])
samples = st.lists(
    st.tuples(
        keys,
        st.dictionaries(extensions, st.binary(max_size=3000), min_size=1, max_size=3),
        st.integers(-1, 1000),
    ),
    min_size=1,
    max_size=40,
    unique_by=lambda t: t[0],
)


def _pack(store: MemoryStore, items: list[tuple[str, dict[str, bytes], int]], per_shard: int):
    records = []
    for start in range(0, len(items), per_shard):
        writer = ShardWriter(store, f"shard-{start // per_shard:06d}.tar")
        for key, fields, label in items[start : start + per_shard]:
            writer.add(Sample(key=key, fields=fields, label=label))
        records.append(writer.close())
    index = DatasetIndex.from_shards(records, class_names=["a", "b"], fields={})
    write_index(store, index)
    return records


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=samples, per_shard=st.integers(1, 7))
def test_round_trip_bytes_and_labels(items, per_shard: int) -> None:
    store = MemoryStore("roundtrip")
    records = _pack(store, items, per_shard)
    dataset = ShardDataset(store, read_index(store))
    assert len(dataset) == len(items)
    for i, (key, fields, label) in enumerate(items):
        got = dataset[i]
        assert got["key"] == key
        assert got["label"] == label
        assert {k: v for k, v in got.items() if k not in ("key", "label")} == fields
    many = dataset.read_many(list(reversed(range(len(items)))))
    assert [m["key"] for m in many] == [k for k, _, _ in reversed(items)]
    # Python's tarfile reads the same members with the same bytes.
    for record in records:
        data = bytes(store.get(record.name))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = tar.getnames()
            for member in tar.getmembers():
                key, ext = member.name.split(".", 1)
                original = next(f for k, f, _ in items if k == key)
                extracted = tar.extractfile(member)
                assert extracted is not None
                assert extracted.read() == original[ext]
        assert names == [
            f"{s.key}.{e}"
            for s in record.samples
            for e in next(f for k, f, _ in items if k == s.key)
        ]


def test_webdataset_library_reads_our_shards() -> None:
    import gc
    import warnings

    import webdataset

    store = MemoryStore("wds-compat")
    items = [
        (f"s{i:03d}", {"jpg": bytes([i]) * (100 + i), "cls": str(i % 3).encode()}, i % 3)
        for i in range(25)
    ]
    _pack(store, items, 10)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("shard-000000.tar", "shard-000001.tar", "shard-000002.tar"):
            Path(tmp, name).write_bytes(bytes(store.get(name)))
        urls = [str(Path(tmp, f"shard-{i:06d}.tar")) for i in range(3)]
        with warnings.catch_warnings():
            # webdataset leaves its shard files for the garbage collector to close.
            warnings.simplefilter("ignore", ResourceWarning)
            pipeline = webdataset.WebDataset(urls, shardshuffle=False, empty_check=False)
            seen = list(pipeline)
            del pipeline
            gc.collect()
    assert [s["__key__"] for s in seen] == [k for k, _, _ in items]
    for got, (_, fields, _) in zip(seen, items, strict=True):
        assert got["jpg"] == fields["jpg"]
        assert got["cls"] == fields["cls"]


def test_duplicate_and_invalid_keys_are_refused() -> None:
    writer = ShardWriter(MemoryStore("dups"), "s.tar")
    writer.add(Sample(key="a", fields={"txt": b"1"}))
    with pytest.raises(ValueError, match="duplicate"):
        writer.add(Sample(key="a", fields={"txt": b"2"}))
    for bad in ["a.b", "v1.2/a.b", "/abs", "x/../y", "x/./y", "", "x//y", ".hidden"]:
        with pytest.raises(ValueError, match="invalid sample key"):
            check_key(bad)
    for good in ["v1.2/a", "data.v2/part.1/0001", "a/.cache/b"]:
        check_key(good)  # folders may have dots, as in WebDataset


def test_long_names_use_the_ustar_prefix() -> None:
    key = "d" * 90 + "/" + "k" * 60
    header = member_header(f"{key}.jpg", 3)
    span = header + b"abc" + bytes(509)
    assert parse_members(span, where="t") == {"jpg": b"abc"}


def test_corrupt_sample_is_named() -> None:
    store = MemoryStore("corrupt")
    _pack(store, [(f"k{i}", {"bin": bytes([i]) * 600}, i) for i in range(6)], 3)
    shard = bytearray(bytes(store.get("shard-000001.tar")))
    index = read_index(store)
    position = int(index.offset[4]) + 512 + 10  # inside the data of sample k4
    shard[position] ^= 0xFF
    store.put("shard-000001.tar", bytes(shard))
    dataset = ShardDataset(store, read_index(store))
    assert dataset[3]["key"] == "k3"
    with pytest.raises(CorruptShardError, match=r"shard-000001\.tar: sample 'k4'"):
        dataset[4]
    report = dataset.verify()
    assert report.corrupt == [("shard-000001.tar", "k4", "sample bytes fail their CRC-32")]
    assert report.shards == 2


def test_verify_names_missing_and_truncated_shards() -> None:
    store = MemoryStore("truncated")
    _pack(store, [(f"k{i}", {"bin": b"x" * 700}, 0) for i in range(4)], 2)
    store.put("shard-000000.tar", bytes(store.get("shard-000000.tar"))[:900])
    store.delete("shard-000001.tar")
    report = ShardDataset(store, read_index(store)).verify()
    assert ("shard-000001.tar", "", "shard is missing") in report.corrupt
    assert any(c[0] == "shard-000000.tar" and "size" in c[2] for c in report.corrupt)
    assert not report.ok


def test_index_from_another_dataset_or_newer_version_is_refused() -> None:
    a, b = MemoryStore("idx-a"), MemoryStore("idx-b")
    _pack(a, [("x", {"bin": b"1"}, 0)], 1)
    _pack(b, [("y", {"bin": b"22"}, 0), ("z", {"bin": b"3"}, 1)], 1)
    a.put("index.bin", bytes(b.get("index.bin")))
    with pytest.raises(ShardFormatError, match="checksum does not match"):
        read_index(a)
    manifest = json.loads(bytes(b.get("index.json")))
    manifest["version"] = 99
    b.put("index.json", json.dumps(manifest).encode())
    with pytest.raises(ShardFormatError, match="newer than this stoker reads"):
        read_index(b)
    with pytest.raises(FileNotFoundError, match="no index"):
        read_index(MemoryStore("empty"))


def test_runs_coalesce_neighbours_and_respect_limits() -> None:
    store = MemoryStore("runs")
    _pack(store, [(f"k{i}", {"bin": b"x" * 1000}, 0) for i in range(10)], 5)
    index = read_index(store)
    runs = plan_runs(index, range(10), max_gap_bytes=0, max_run_bytes=1 << 20)
    assert [(r.shard, r.samples) for r in runs] == [(0, [0, 1, 2, 3, 4]), (1, [5, 6, 7, 8, 9])]
    runs = plan_runs(index, [0, 2, 4], max_gap_bytes=0, max_run_bytes=1 << 20)
    assert len(runs) == 3
    runs = plan_runs(index, range(5), max_gap_bytes=0, max_run_bytes=3100)
    assert [r.samples for r in runs] == [[0, 1], [2, 3], [4]]


def test_index_opens_with_two_gets_and_no_list() -> None:
    store = MemoryStore("two-gets")
    _pack(store, [(f"k{i}", {"bin": b"x"}, 0) for i in range(100)], 10)
    before = store.counters.snapshot()
    read_index(store)
    after = store.counters.snapshot()
    assert after["requests.get"] - before.get("requests.get", 0) == 2
    assert after.get("requests.list", 0) == before.get("requests.list", 0)
