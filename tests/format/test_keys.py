"""Sample keys are decoded from the index's key blob when asked for, not all when the index
opens; the blob is still checked whole when it is read, so a bad key is refused there."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from stoker.errors import ShardFormatError
from stoker.format.index import DatasetIndex, ShardEntry, read_index, write_index
from stoker.format.keys import SampleKeys
from stoker.storage.memory import MemoryStore

SPAN = 512


def _index(keys: list[str]) -> DatasetIndex:
    count = len(keys)
    return DatasetIndex(
        shards=[ShardEntry("shard-000000.tar", count, count * SPAN + 1024, "0" * 64)],
        class_names=[],
        fields={"txt": count},
        shard=np.zeros(count, dtype="<u4"),
        offset=np.arange(count, dtype="<u8") * SPAN,
        length=np.full(count, SPAN, dtype="<u8"),
        label=np.full(count, -1, dtype="<i8"),
        crc32=np.zeros(count, dtype="<u4"),
        keys=keys,
    )


def _read(keys: list[str]) -> DatasetIndex:
    store = MemoryStore("keys")
    write_index(store, _index(keys))
    return read_index(store)


def test_keys_read_back_equal_in_every_way_a_sequence_is_used() -> None:
    keys = ["a/0", "Straße/ü", "東京/夜景", "v1.2/0003", "e\u0301"]
    read = _read(keys).keys
    assert isinstance(read, SampleKeys)
    assert read == keys
    assert keys == read
    assert read != keys[:-1]
    assert list(read) == keys
    assert len(read) == 5
    assert read[1] == "Straße/ü"
    assert read[np.int64(2)] == "東京/夜景"
    assert read[-1] == "e\u0301"
    assert read[1:4] == keys[1:4]
    assert read[::-2] == keys[::-2]
    assert read.index("v1.2/0003") == 3
    assert "a/0" in read
    with pytest.raises(IndexError, match="sample 5 of 5"):
        read[5]
    with pytest.raises(IndexError):
        read[-6]


def test_opening_an_index_makes_no_string_per_key() -> None:
    count = 200_000
    keys = [f"train/{i:07d}" for i in range(count)]
    store = MemoryStore("many")
    write_index(store, _index(keys))
    tracemalloc.start()
    try:
        index = read_index(store)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # What the open index holds: the index file it read (10.6 MB, its columns are views of
    # it) and the key blob (2.6 MB); a list of 200,000 strings of 13 characters would add
    # 200,000 x (62 + 8) bytes.
    assert held < len(index.arrays_bytes()) + count * 20
    assert index.keys[123_456] == "train/0123456"


def test_keys_that_are_not_utf8_are_refused_when_the_index_is_read() -> None:
    blob = "aé".encode()  # b"a\xc3\xa9"
    with pytest.raises(ShardFormatError, match="idx: a sample key is not UTF-8"):
        SampleKeys.checked(b"a\xff", np.array([0, 1, 2], dtype="<u8"), where="idx")
    # Valid as a whole, but the second key starts inside the 'é'.
    with pytest.raises(ShardFormatError, match=r"starts inside a character \(byte 2\)"):
        SampleKeys.checked(blob, np.array([0, 2, 3], dtype="<u8"), where="idx")
    assert SampleKeys.checked(blob, np.array([0, 1, 3], dtype="<u8"), where="idx") == ["a", "é"]


def test_key_offsets_out_of_order_or_off_the_blob_are_refused() -> None:
    with pytest.raises(ShardFormatError, match="not in order"):
        SampleKeys.checked(b"abc", np.array([0, 2, 1, 3], dtype="<u8"), where="idx")
    with pytest.raises(ShardFormatError, match="run from 0 to 2, expected 0 to 3"):
        SampleKeys.checked(b"abc", np.array([0, 1, 2], dtype="<u8"), where="idx")
    with pytest.raises(ShardFormatError, match="run from 1 to 3"):
        SampleKeys.checked(b"abc", np.array([1, 3], dtype="<u8"), where="idx")
