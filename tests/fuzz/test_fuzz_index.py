"""Fuzzing the index reader, and the reader behind it, with hostile index.json and index.bin.

A small valid dataset is packed, then its manifest, arrays and shards are mutated: fields
replaced by arbitrary JSON, array entries set to arbitrary numbers (with the manifest's
SHA-256 updated so the arrays are decoded), bytes flipped, files truncated. Opening must
raise only our errors; an index that opens must read each sample or raise our errors; and a
dataset that ``verify()`` passes must read without error.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.errors import ShardFormatError
from stoker.format.foreign.base import Sample
from stoker.format.index import DatasetIndex, read_index
from stoker.format.reader import ShardDataset
from stoker.format.writer import ShardWriter
from stoker.storage import MemoryStore

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.sampled_from(["../x", "/abs", "a\\b", "index.bin", "shard-000000.tar", "0" * 64]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
MANIFEST_PATHS: list[tuple[Any, ...]] = [
    ("format",),
    ("version",),
    ("samples",),
    ("shards",),
    ("shards", 0),
    ("shards", 0, "name"),
    ("shards", 0, "samples"),
    ("shards", 0, "bytes"),
    ("shards", 0, "sha256"),
    ("shards", 1, "bytes"),
    ("arrays",),
    ("arrays", "name"),
    ("arrays", "sha256"),
    ("class_names",),
    ("fields",),
    ("packed_with",),
    ("skipped",),
]
COLUMNS = ["shard", "offset", "length", "label", "crc32"]


def _dataset() -> tuple[MemoryStore, DatasetIndex]:
    store = MemoryStore("fuzz-index")
    records = []
    for number in range(2):
        writer = ShardWriter(store, f"shard-{number:06d}.tar")
        for i in range(3):
            key = f"s{number}_{i}"
            writer.add(Sample(key=key, fields={"jpg": key.encode() * (i + 1), "cls": b"1"}))
        records.append(writer.close())
    return store, DatasetIndex.from_shards(records, class_names=["a"], fields={"jpg": 6})


def _flip(data: bytes, draw: st.DrawFn) -> bytes:
    if not data:
        return data
    position = draw(st.integers(0, len(data) - 1))
    return (
        data[:position] + bytes([data[position] ^ draw(st.integers(1, 255))]) + data[position + 1 :]
    )


def _set(document: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    *parents, last = path
    for step in parents:
        if (isinstance(document, dict) and isinstance(step, str) and step in document) or (
            isinstance(document, list) and isinstance(step, int) and step < len(document)
        ):
            document = document[step]
        else:
            return
    if isinstance(document, dict) and isinstance(last, str):
        if delete:
            document.pop(last, None)
        else:
            document[last] = value
    elif isinstance(document, list) and isinstance(last, int) and last < len(document):
        document[last] = value


@st.composite
def datasets(draw: st.DrawFn) -> MemoryStore:
    store, index = _dataset()
    # Structured damage to the arrays: an entry of one column set to any number.
    for _ in range(draw(st.integers(0, 2))):
        column = draw(st.sampled_from(COLUMNS))
        values = getattr(index, column).copy()
        info = np.iinfo(values.dtype)
        values[draw(st.integers(0, len(values) - 1))] = draw(st.integers(info.min, info.max))
        setattr(index, column, values)
    if draw(st.integers(0, 4)) == 0:
        index.keys[draw(st.integers(0, len(index.keys) - 1))] = draw(st.text(max_size=5))
    arrays = index.arrays_bytes()
    damage = draw(st.sampled_from(["none", "none", "flip", "truncate", "random"]))
    if damage == "flip":
        arrays = _flip(arrays, draw)
    elif damage == "truncate":
        arrays = arrays[: draw(st.integers(0, len(arrays)))]
    elif damage == "random":
        arrays = b"STKIDX01" + draw(st.binary(max_size=200))
    manifest = index.manifest(arrays)
    if draw(st.integers(0, 5)) == 0:  # the manifest still describes the original arrays
        manifest["arrays"]["sha256"] = hashlib.sha256(index.arrays_bytes()).hexdigest()
    for _ in range(draw(st.integers(0, 2))):
        path = draw(st.sampled_from(MANIFEST_PATHS))
        _set(manifest, path, draw(json_values), delete=draw(st.booleans()))
    text = json.dumps(manifest).encode()
    manifest_damage = draw(st.sampled_from(["none", "none", "none", "flip", "cut", "random"]))
    if manifest_damage == "flip":
        text = _flip(text, draw)
    elif manifest_damage == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif manifest_damage == "random":
        text = draw(st.one_of(st.binary(max_size=100), st.just(b"[" * 100_000)))
    store.put("index.bin", arrays)
    store.put("index.json", text)
    shard_damage = draw(st.sampled_from(["none", "none", "flip", "truncate", "delete"]))
    name = f"shard-{draw(st.integers(0, 1)):06d}.tar"
    data = bytes(store.get(name))
    if shard_damage == "flip":
        store.put(name, _flip(data, draw))
    elif shard_damage == "truncate":
        store.put(name, data[: draw(st.integers(1, len(data)))])
    elif shard_damage == "delete":
        store.delete(name)
    return store


@FUZZ
@given(store=datasets())
def test_index_and_reads_raise_only_our_errors(store: MemoryStore) -> None:
    try:
        index = read_index(store)
    except (ShardFormatError, FileNotFoundError):
        return
    dataset = ShardDataset(store, index)
    report = dataset.verify()
    try:
        samples = dataset.read_many(range(len(dataset)))
    except (ShardFormatError, FileNotFoundError):
        assert not report.ok, "verify() passed a dataset that cannot be read"
        samples = None
    if samples is not None:
        assert [s["key"] for s in samples] == index.keys
    # Keeping the errors in place gives, sample by sample, what reading one at a time gives.
    try:
        kept = ShardDataset(store, index).read_many(range(len(dataset)), return_errors=True)
    except FileNotFoundError:  # a missing shard is a storage error, raised either way
        return
    for i, outcome in enumerate(kept):
        try:
            single = ShardDataset(store, index)[i]
        except (ShardFormatError, FileNotFoundError):
            continue
        assert outcome == single
