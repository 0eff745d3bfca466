"""TFRecordReader and write_tfrecord against an independent writer (the `tfrecord` package)."""

from __future__ import annotations

import json
import math
import pickle
import struct
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.errors import SourceError
from stoker.format.foreign import tfrecord as tfrecord_module
from stoker.format.foreign.base import SampleRef
from stoker.format.foreign.tfrecord import TFRecordReader, write_tfrecord

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(60))
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 30
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"\x01" * 20


# An independent framing and Example encoding, so the reader is not checked only against
# the module's own writer.


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32)


def _frame(records: Iterable[bytes]) -> bytes:
    out = b""
    for data in records:
        length = struct.pack("<Q", len(data))
        out += length + _masked_crc(length) + data + _masked_crc(data)
    return out


def _varint(value: int) -> bytes:
    value &= 2**64 - 1
    out = b""
    while value >= 0x80:
        out += bytes([value & 0x7F | 0x80])
        value >>= 7
    return out + bytes([value])


def _delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example(features: dict[str, tuple[int, bytes]]) -> bytes:
    """Encode an Example from ``name -> (Feature field number, encoded list body)``."""
    entries = b"".join(
        _delimited(1, _delimited(1, name.encode()) + _delimited(2, _delimited(kind, body)))
        for name, (kind, body) in features.items()
    )
    return _delimited(1, entries)


def _reference_write(path: Path, records: list[dict[str, tuple[Any, str]]]) -> None:
    """Write with the `tfrecord` package: protobuf's own Example encoding and crc32c's CRC."""
    import tfrecord as reference

    writer = reference.TFRecordWriter(str(path))
    try:
        for record in records:
            writer.write(record)
    finally:
        writer.close()


def _imagenet_style(count: int) -> list[dict[str, tuple[Any, str]]]:
    return [
        {
            "image/encoded": (JPEG + bytes([i]), "byte"),
            "image/class/label": (i % 3, "int"),
            "image/class/text": (["cat", "dog", "emu"][i % 3].encode(), "byte"),
            "image/height": (32 + i, "int"),
            "image/object/bbox/xmin": ([0.1, 0.5], "float"),
        }
        for i in range(count)
    ]


def test_reference_writer_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "train.tfrecord"
    _reference_write(path, _imagenet_style(5))
    reader = TFRecordReader(str(path))
    refs = reader.refs()
    assert [ref.key for ref in refs] == [f"train_{i:08d}" for i in range(5)]
    assert [ref.label for ref in refs] == [0, 1, 2, 0, 1]
    assert reader.class_names == ["cat", "dog", "emu"]
    assert reader.description == f"TFRecord {path} (1 file, 5 records)"
    sample = reader.read(refs[3])
    assert sample.key == "train_00000003"
    assert sample.label == 0
    assert list(sample.fields) == ["jpg", "cls", "json"]
    assert sample.fields["jpg"] == JPEG + b"\x03"
    assert sample.fields["cls"] == b"0"
    assert json.loads(sample.fields["json"]) == {
        "image/class/text": "cat",
        "image/height": 35,
        "image/object/bbox/xmin": [0.1, 0.5],
    }
    offset = path.read_bytes().index(JPEG + b"\x03")
    assert refs[3].start < offset < refs[3].start + refs[3].length


def test_write_tfrecord_is_read_by_the_reference_parser(tmp_path: Path) -> None:
    from tfrecord import example_pb2

    path = tmp_path / "mine.tfrecord"
    examples = [
        {"image": PNG, "label": 7, "name": "a.png", "scores": [0.25, 1.0], "ids": [-3, 2**40]},
        {"image": WEBP, "label": 0, "name": b"b", "scores": 2.5, "ids": [1, 2, 3]},
        {"image": b"raw", "label": -5, "name": "c", "scores": [1, 2.5], "ids": 0},
    ]
    write_tfrecord(path, examples)
    reader = TFRecordReader(str(path))
    refs = reader.refs()
    data = path.read_bytes()
    parsed = example_pb2.Example.FromString(data[refs[0].start : refs[0].start + refs[0].length])
    feature = parsed.features.feature
    assert feature["image"].bytes_list.value == [PNG]
    assert feature["label"].int64_list.value == [7]
    assert feature["name"].bytes_list.value == [b"a.png"]
    assert list(feature["scores"].float_list.value) == [0.25, 1.0]
    assert feature["ids"].int64_list.value == [-3, 2**40]
    assert _frame([data[ref.start : ref.start + ref.length] for ref in refs]) == data

    samples = [reader.read(ref) for ref in refs]
    assert [next(iter(s.fields)) for s in samples] == ["png", "webp", "bin"]
    assert all(list(s.fields)[1:] == ["cls", "json"] for s in samples)
    assert [s.label for s in samples] == [7, 0, -5]
    assert samples[2].fields["cls"] == b"-5"
    assert json.loads(samples[1].fields["json"]) == {"ids": [1, 2, 3], "name": "b", "scores": 2.5}
    assert reader.class_names == []


def test_directory_of_files_in_sorted_order(tmp_path: Path) -> None:
    names = ["b.tfrecords", "a.tfrecord", "c.TFR", "train.tfrecord-00001-of-00002", "x.y.tfr"]
    for number, name in enumerate(names):
        write_tfrecord(tmp_path / name, [{"image": JPEG, "label": number}] * 2)
    (tmp_path / "sub").mkdir()
    write_tfrecord(tmp_path / "sub" / "a.tfrecord", [{"image": JPEG, "label": 9}])
    (tmp_path / "notes.txt").write_text("not a record")
    (tmp_path / "a.tfrecord.gz").write_bytes(b"compressed")
    reader = TFRecordReader(str(tmp_path))
    keys = [ref.key for ref in reader.refs()]
    assert keys == [
        "a_00000000", "a_00000001", "b_00000000", "b_00000001", "c_00000000", "c_00000001",
        "sub/a_00000000",
        "train-00001-of-00002_00000000", "train-00001-of-00002_00000001",
        "x_y_00000000", "x_y_00000001",
    ]  # fmt: skip
    assert [ref.label for ref in reader.refs()][:6] == [1, 1, 0, 0, 2, 2]
    assert reader.description == f"TFRecord {tmp_path} (6 files, 11 records)"
    assert TFRecordReader(f"file://{tmp_path}").refs() == reader.refs()


def test_s3_prefix(tmp_path: Path, s3_bucket: Any) -> None:
    store = s3_bucket.store()
    _reference_write(tmp_path / "one.tfrecord", _imagenet_style(3))
    write_tfrecord(tmp_path / "two.tfrecord", [{"image/encoded": PNG, "image/class/label": 4}])
    store.put("train/part-1.tfrecord", (tmp_path / "one.tfrecord").read_bytes())
    store.put("train/part-2.tfrecord", (tmp_path / "two.tfrecord").read_bytes())
    store.put("train/README", b"skip me")
    store.put("other/part-3.tfrecord", (tmp_path / "two.tfrecord").read_bytes())

    location = f"{s3_bucket.url}/train"
    reader = TFRecordReader(location, storage_options=s3_bucket.options())
    refs = reader.refs()
    assert [ref.key for ref in refs] == [
        "part-1_00000000", "part-1_00000001", "part-1_00000002", "part-2_00000000"
    ]  # fmt: skip
    assert refs[3].location == f"{s3_bucket.url}/train/part-2.tfrecord"
    assert reader.description == f"TFRecord {location} (2 files, 4 records)"
    assert reader.read(refs[1]).fields["jpg"] == JPEG + b"\x01"

    copy = pickle.loads(pickle.dumps(reader))  # noqa: S301 (our own object)
    assert copy.read(refs[3]).fields == {"png": PNG, "cls": b"4"}
    assert copy.class_names == ["cat", "dog", "emu", "3", "4"]

    one = TFRecordReader(f"{location}/part-2.tfrecord", storage_options=s3_bucket.options())
    assert [ref.key for ref in one.refs()] == ["part-2_00000000"]


def _three_records(path: Path) -> bytes:
    write_tfrecord(path, [{"image": JPEG + bytes([i]) * 50, "label": i} for i in range(3)])
    return path.read_bytes()


def test_flipped_data_byte_names_file_record_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "bad.tfrecord"
    data = bytearray(_three_records(path))
    record_1 = TFRecordReader(str(path)).refs()[1]
    data[data.index(JPEG + b"\x01") + 10] ^= 0xFF
    path.write_bytes(data)
    offset = record_1.start - 12
    with pytest.raises(
        SourceError, match=rf"bad\.tfrecord: record 1 at byte offset {offset}: bad data CRC"
    ):
        TFRecordReader(str(path)).refs()
    with pytest.raises(SourceError, match="bad data CRC"):
        TFRecordReader(str(path)).read(record_1)

    lenient = TFRecordReader(str(path), verify_crc=False)
    refs = lenient.refs()
    assert [ref.label for ref in refs] == [0, 1, 2]
    image = lenient.read(refs[1]).fields["jpg"]
    assert image != JPEG + b"\x01" * 50
    assert len(image) == len(JPEG) + 50


def test_bad_length_crc_is_an_error_even_without_verify_crc(tmp_path: Path) -> None:
    path = tmp_path / "bad.tfrecord"
    data = bytearray(_three_records(path))
    second = TFRecordReader(str(path)).refs()[2].start - 12
    data[second] ^= 0x01
    path.write_bytes(data)
    with pytest.raises(SourceError, match=rf"record 2 at byte offset {second}: bad length CRC"):
        TFRecordReader(str(path), verify_crc=False).refs()


@pytest.mark.parametrize("cut", [1, 5, 14, 16])
def test_truncated_file(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "short.tfrecord"
    data = _three_records(path)
    last = TFRecordReader(str(path)).refs()[2].start - 12
    path.write_bytes(data[:-cut] if cut < 16 else data[: last + 5])
    with pytest.raises(
        SourceError, match=rf"short\.tfrecord: record 2 at byte offset {last}: truncated"
    ):
        TFRecordReader(str(path)).refs()


@pytest.mark.parametrize(
    ("image", "label"),
    [("image", "label"), ("image_raw", "target"), ("img", "y"), ("jpeg", "class"),
     ("encoded", "image/class/label")],
)  # fmt: skip
def test_feature_auto_detection(tmp_path: Path, image: str, label: str) -> None:
    path = tmp_path / "auto.tfrecord"
    write_tfrecord(path, [{"caption": "hi", image: JPEG, label: 3, "pixels": b"\xff\xfe"}])
    reader = TFRecordReader(str(path))
    (ref,) = reader.refs()
    assert ref.label == 3
    sample = reader.read(ref)
    assert sample.fields == {"jpg": JPEG, "cls": b"3", "json": b'{"caption": "hi"}'}


def test_auto_detection_prefers_earlier_names_and_needs_one_label(tmp_path: Path) -> None:
    path = tmp_path / "both.tfrecord"
    write_tfrecord(path, [{"image": PNG, "image/encoded": JPEG, "label": [1, 2], "y": 5}])
    reader = TFRecordReader(str(path))
    sample = reader.read(reader.refs()[0])
    assert sample.fields["jpg"] == JPEG
    assert sample.label == 5
    assert json.loads(sample.fields["json"]) == {"label": [1, 2]}


def test_explicit_features(tmp_path: Path) -> None:
    path = tmp_path / "named.tfrecord"
    write_tfrecord(path, [{"image": JPEG, "photo": PNG, "label": 1, "species": 8}])
    reader = TFRecordReader(str(path), image_feature="photo", label_feature="species")
    sample = reader.read(reader.refs()[0])
    # "image" is not UTF-8, so it has no place in the JSON document.
    assert sample.fields == {"png": PNG, "cls": b"8", "json": b'{"label": 1}'}
    with pytest.raises(SourceError, match=r"label feature 'weight' is not an int64_list"):
        TFRecordReader(str(path), label_feature="weight").refs()


def test_missing_image_feature_lists_existing_features(tmp_path: Path) -> None:
    path = tmp_path / "noimage.tfrecord"
    write_tfrecord(path, [{"pixels": b"abc", "height": 2, "mean": 0.5}])
    with pytest.raises(SourceError, match=r"record 0 at byte offset 0: no image feature") as info:
        TFRecordReader(str(path)).refs()
    assert "height (int64_list), mean (float_list), pixels (bytes_list)" in str(info.value)
    with pytest.raises(SourceError, match=r"no image feature \('photo'\)"):
        TFRecordReader(str(path), image_feature="photo").refs()


def test_packed_and_unpacked_numeric_lists(tmp_path: Path) -> None:
    ints = [0, 1, -1, 300, 2**63 - 1, -(2**63)]
    floats = [0.5, -2.0, math.inf, math.nan]
    unpacked_ints = b"".join(_varint(1 << 3 | 0) + _varint(v) for v in ints)
    unpacked_floats = b"".join(b"\x0d" + struct.pack("<f", v) for v in floats)
    packed_ints = _delimited(1, b"".join(_varint(v) for v in ints))
    packed_floats = _delimited(1, struct.pack("<4f", *floats))
    record = _example(
        {
            "image": (1, _delimited(1, JPEG)),
            "label": (3, _varint(1 << 3 | 0) + _varint(2)),
            "u_ints": (3, unpacked_ints),
            "p_ints": (3, packed_ints),
            "mixed": (
                3,
                _delimited(1, _varint(0) + _varint(1)) + _varint(1 << 3 | 0) + _varint(-7),
            ),
            "u_floats": (2, unpacked_floats),
            "p_floats": (2, packed_floats),
        }
    )
    path = tmp_path / "lists.tfrecord"
    path.write_bytes(_frame([record]))
    reader = TFRecordReader(str(path))
    sample = reader.read(reader.refs()[0])
    assert sample.label == 2
    doc = json.loads(sample.fields["json"])
    assert doc["u_ints"] == doc["p_ints"] == ints
    assert doc["mixed"] == [0, 1, -7]
    assert doc["u_floats"] == doc["p_floats"] == [0.5, -2.0, None, None]


def test_malformed_example_is_a_source_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.tfrecord"
    path.write_bytes(_frame([_example({"image": (1, _delimited(1, JPEG))}), b"\x0a\xff"]))
    with pytest.raises(SourceError, match=r"record 1 at byte offset \d+: not a tf.train.Example"):
        TFRecordReader(str(path)).refs()


def test_chunked_scan_matches_whole_file_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "chunks.tfrecord"
    write_tfrecord(path, [{"image": JPEG * (i + 1), "label": i} for i in range(20)])
    whole = TFRecordReader(str(path)).refs()
    monkeypatch.setattr(tfrecord_module, "_CHUNK_BYTES", 7)
    assert TFRecordReader(str(path)).refs() == whole


def test_class_names(tmp_path: Path) -> None:
    one_based = tmp_path / "one_based.tfrecord"
    texts = {1: b"cat", 3: b"emu"}
    write_tfrecord(
        one_based, [{"image": JPEG, "label": i, "image/class/text": t} for i, t in texts.items()]
    )
    reader = TFRecordReader(str(one_based))
    assert [ref.label for ref in reader.refs()] == [1, 3]
    assert reader.class_names == ["0", "cat", "2", "emu"]
    assert TFRecordReader(str(one_based), class_names=["a", "b"]).class_names == ["a", "b"]

    clash = tmp_path / "clash.tfrecord"
    write_tfrecord(clash, [{"image": JPEG, "label": 1, "image/class/text": t} for t in ("a", "b")])
    with pytest.raises(SourceError, match=r"record 1 at byte offset \d+: label 1 is 'b'"):
        _ = TFRecordReader(str(clash)).class_names


def test_pickled_reader_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "p.tfrecord"
    _reference_write(path, _imagenet_style(4))
    reader = TFRecordReader(str(path))
    refs = reader.refs()
    copy = pickle.loads(pickle.dumps(reader))  # noqa: S301 (our own object)
    assert [copy.read(ref) for ref in refs] == [reader.read(ref) for ref in refs]
    assert copy.class_names == reader.class_names
    assert copy.refs() == refs
    fresh = pickle.loads(pickle.dumps(TFRecordReader(str(path))))  # noqa: S301 (our own object)
    assert fresh.read(refs[2]) == reader.read(refs[2])


def test_input_errors(tmp_path: Path) -> None:
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    assert TFRecordReader(str(tmp_path / "empty.tfrecord")).refs() == []
    with pytest.raises(SourceError, match=r"no files ending in \.tfrecord"):
        TFRecordReader(str(tmp_path / "missing")).refs()
    write_tfrecord(tmp_path / "a.tfr", [{"image": JPEG}])
    write_tfrecord(tmp_path / "a.tfrecord", [{"image": JPEG}])
    with pytest.raises(SourceError, match=r"both give keys a_\*"):
        TFRecordReader(str(tmp_path)).refs()
    with pytest.raises(ValueError, match="empty list"):
        write_tfrecord(tmp_path / "x.tfr", [{"image": []}])
    with pytest.raises(ValueError, match="outside int64"):
        write_tfrecord(tmp_path / "x.tfr", [{"label": 2**63}])
    gone = SampleRef("a_00000005", str(tmp_path / "a.tfr"), 10, start=10_000, length=10)
    with pytest.raises(SourceError, match=r"expected 14 bytes at offset 10000"):
        TFRecordReader(str(tmp_path / "a.tfr")).read(gone)


def test_missing_crc32c_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    with pytest.raises(ImportError, match=r"pip install 'stoker\[tfrecord\]'"):
        write_tfrecord(tmp_path / "x.tfrecord", [{"image": JPEG}])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.binary(max_size=300), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
        max_size=8,
    )
)
def test_payloads_and_labels_round_trip(records: list[tuple[bytes, int]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "prop.tfrecord")
        write_tfrecord(path, [{"image": payload, "label": label} for payload, label in records])
        reader = TFRecordReader(str(path))
        refs = reader.refs()
        assert len(refs) == len(records)
        for ref, (payload, label) in zip(refs, records, strict=True):
            sample = reader.read(ref)
            assert ref.label == sample.label == label
            image_fields = [
                v for k, v in sample.fields.items() if k in ("jpg", "png", "webp", "bin")
            ]
            assert image_fields == [payload]
            assert sample.fields.get("cls") == (None if label == -1 else str(label).encode())
            assert "json" not in sample.fields
