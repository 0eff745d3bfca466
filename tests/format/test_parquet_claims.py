"""What a Parquet file may claim and hold (issue 32 items 3 and 4).

A 433-byte file whose footer claims 10^9 rows made ``stoker pack`` make a reference per
claimed row (2.6 GB, then ``SystemError``): it is refused, naming the file, before any row
is read. A value in the ``image`` column that is no image packed as ``image.bin`` without
a word (and failed training later): it is an error naming the file, row and column, which
``on_error="skip"`` skips and lists. A ``label`` column of strings packed every label as
-1: the strings are class names.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from stoker.errors import SourceError
from stoker.format.foreign.parquet import ParquetReader
from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.testing.images import make_jpeg

RNG = np.random.default_rng(3)
JPEGS = [make_jpeg(RNG, width=16, height=12) for _ in range(4)]


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        out.append(low | (0x80 if number else 0))
        if not number:
            return bytes(out)


def lying_footer(rows: int, claimed: int) -> bytes:
    """A real Parquet file of ``rows`` rows whose footer claims ``claimed`` (every
    thrift field that held ``rows``, zigzag-encoded, rewritten)."""
    out = io.BytesIO()
    pq.write_table(pa.table({"label": pa.array([1] * rows, pa.int64())}), out)
    data = out.getvalue()
    length = struct.unpack("<I", data[-8:-4])[0]
    footer = data[-8 - length : -8].replace(_varint(rows * 2), _varint(claimed * 2))
    return data[: -8 - length] + footer + struct.pack("<I", len(footer)) + b"PAR1"


def test_a_footer_claiming_more_rows_than_the_file_holds_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "liar.parquet"
    path.write_bytes(lying_footer(77, 10**9))
    assert pq.ParquetFile(path).metadata.num_rows == 10**9
    claims = rf"{path}: its footer claims 1,000,000,000 rows in a file of {path.stat().st_size}"
    with pytest.raises(SourceError, match=claims):
        ParquetReader(str(path)).refs()
    with pytest.raises(SourceError, match=claims):
        pack(path, tmp_path / "out")


def test_a_footer_within_the_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / "ok.parquet"
    path.write_bytes(lying_footer(77, 77))
    assert len(ParquetReader(str(path)).refs()) == 77


def _gif() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (5, 4), (9, 90, 200)).save(out, "GIF")
    return out.getvalue()


def test_a_value_of_the_image_column_that_is_no_image_is_named(tmp_path: Path) -> None:
    images = [JPEGS[0], b"<html>not found</html>", _gif(), JPEGS[1]]
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()), "n": [0, 1, 2, 3]}), path)
    reader = ParquetReader(str(path))
    refs = reader.refs()
    assert set(reader.read(refs[2]).fields) == {"gif", "n.json"}  # an image Pillow reads
    bad = (
        rf"{path}: sample 'mixed_00000001' \(row group 0, row 1\), column 'image': a column of "
        r"images holds a value that is no image: not an image format Pillow reads \(22 bytes, "
        r"starting b'<html>no'\)"
    )
    with pytest.raises(SourceError, match=bad):
        reader.read(refs[1])
    with pytest.raises(SourceError, match=bad):
        pack(path, tmp_path / "raise")
    report = pack(path, tmp_path / "skip", config=PackConfig(on_error="skip"))
    assert report.samples == 3
    assert [(s["key"], s["source"]) for s in report.skipped] == [("mixed_00000001", str(path))]
    assert "no image" in report.skipped[0]["reason"]


def test_other_binary_columns_keep_bytes_that_are_no_image(tmp_path: Path) -> None:
    path = tmp_path / "blobs.parquet"
    pq.write_table(pa.table({"image": [JPEGS[0]], "blob": [b"\x00\x01raw"]}), path)
    reader = ParquetReader(str(path))
    assert reader.read(reader.refs()[0]).fields == {"jpg": JPEGS[0], "blob.bin": b"\x00\x01raw"}


def test_a_string_label_column_gives_class_names(tmp_path: Path) -> None:
    path = tmp_path / "named.parquet"
    labels = ["dog", "cat", None, "dog"]
    pq.write_table(pa.table({"image": pa.array(JPEGS, pa.binary()), "label": labels}), path)
    reader = ParquetReader(str(path))
    assert list(reader.class_names) == ["cat", "dog"]
    refs = reader.refs()
    assert [ref.label for ref in refs] == [1, 0, -1, 1]
    assert [reader.read(ref).label for ref in refs] == [1, 0, -1, 1]
    assert reader.read(refs[1]).fields["cls"] == b"0"

    pack(path, tmp_path / "ds")
    dataset = open_dataset(tmp_path / "ds")
    assert dataset.index.class_names == ["cat", "dog"]
    assert sorted(dataset.index.label.tolist()) == [-1, 0, 1, 1]

    given = ParquetReader(str(path), class_names=["dog", "cat"])
    assert [ref.label for ref in given.refs()] == [0, 1, -1, 0]
    unknown = ParquetReader(str(path), class_names=["cat", "bird"])
    with pytest.raises(
        SourceError,
        match=rf"{path}: label 'dog' in column 'label', row 0, is not one of the 2 class names",
    ):
        unknown.refs()


def test_string_labels_are_named_across_files(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    for name, labels in (("a", ["zebra", "ant"]), ("b", ["moth", "ant"])):
        table = pa.table({"image": pa.array(JPEGS[:2], pa.binary()), "label": labels})
        pq.write_table(table, tmp_path / "data" / f"{name}.parquet")
    reader = ParquetReader(str(tmp_path / "data"))
    assert [ref.label for ref in reader.refs()] == [2, 0, 1, 0]
    assert list(reader.class_names) == ["ant", "moth", "zebra"]
