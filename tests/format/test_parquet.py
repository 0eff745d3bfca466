"""ParquetReader: each column becomes the member its docstring says, equal to pyarrow's read."""

from __future__ import annotations

import io
import json
import pickle
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker.errors import SourceError
from stoker.format.foreign.parquet import ParquetReader
from stoker.testing.images import make_jpeg

RNG = np.random.default_rng(23)
JPEGS = [make_jpeg(RNG, width=20 + i, height=16) for i in range(6)]


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(RNG.integers(0, 255, (10, 12, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


PNG = _png()


def _write(path: Path, table: pa.Table, **options: object) -> Path:
    pq.write_table(table, path, **options)  # type: ignore[arg-type]
    return path


def _npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def test_every_column_kind_becomes_its_member(tmp_path: Path) -> None:
    images = [*JPEGS[:5], PNG]
    table = pa.table(
        {
            "image": pa.array(images, pa.binary()),
            "caption": [f"a caption, {i} ü" for i in range(6)],
            "text": ["second text column"] * 6,
            "label": pa.array([0, 1, 2, None, 1, 0], pa.int64()),
            "embedding": pa.array([[i / 2] * (i + 1) for i in range(6)], pa.list_(pa.float32())),
            "grid": pa.array([[[i, 1], [2, 3]] for i in range(6)], pa.list_(pa.list_(pa.int16()))),
            "fixed": pa.array([[i, i, i] for i in range(6)], pa.list_(pa.uint8(), 3)),
            "score": [0.5 * i for i in range(6)],
            "flag": [i % 2 == 0 for i in range(6)],
            "meta": [{"w": i, "tags": ["x", "y"]} for i in range(6)],
            "names": [["a", "b"]] * 6,
            "thumb": pa.array(images, pa.large_binary()),
            "raw": [b"\x00\x01 not an image"] * 6,
            "notes": pa.array(["n"] * 5 + [None]),
            "Odd Name/x": ["odd"] * 6,
            "kind": pa.array(["cat", "dog"] * 3).dictionary_encode(),
        }
    )
    reader = ParquetReader(str(_write(tmp_path / "all.parquet", table, row_group_size=4)))
    refs = reader.refs()
    assert [ref.key for ref in refs] == [f"all_{i:08d}" for i in range(6)]
    assert [ref.label for ref in refs] == [0, 1, 2, -1, 1, 0]
    rows = pq.read_table(tmp_path / "all.parquet").to_pylist()
    for ref, row in zip(refs, rows, strict=True):
        sample = reader.read(ref)
        image_ext = "png" if row["image"] == PNG else "jpg"
        expected_names = {
            image_ext,
            "txt",
            "text.txt",
            "embedding.npy",
            "grid.npy",
            "fixed.npy",
            "score.json",
            "flag.json",
            "meta.json",
            "names.json",
            f"thumb.{image_ext}",
            "raw.bin",
            "odd_name_x.txt",
            "kind.txt",
        }
        expected_names |= {"cls"} if row["label"] is not None else set()
        expected_names |= {"notes.txt"} if row["notes"] is not None else set()
        assert set(sample.fields) == expected_names
        f = sample.fields
        assert f[image_ext] == row["image"]
        assert f[f"thumb.{image_ext}"] == row["thumb"]
        assert f["txt"].decode() == row["caption"]
        assert f["text.txt"].decode() == row["text"]
        assert sample.label == (-1 if row["label"] is None else row["label"])
        if row["label"] is not None:
            assert f["cls"] == str(row["label"]).encode()
        embedding = _npy(f["embedding.npy"])
        assert embedding.dtype == np.float32
        assert np.array_equal(embedding, np.array(row["embedding"], np.float32))
        grid = _npy(f["grid.npy"])
        assert grid.dtype == np.int16
        assert grid.tolist() == row["grid"]
        fixed = _npy(f["fixed.npy"])
        assert fixed.dtype == np.uint8
        assert fixed.tolist() == row["fixed"]
        assert json.loads(f["score.json"]) == row["score"]
        assert json.loads(f["flag.json"]) is row["flag"]
        assert json.loads(f["meta.json"]) == row["meta"]
        assert json.loads(f["names.json"]) == row["names"]
        assert f["raw.bin"] == row["raw"]
        assert f["kind.txt"].decode() == row["kind"]


def test_hugging_face_image_and_audio_structs_and_class_labels(tmp_path: Path) -> None:
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": jpeg, "path": f"{i}.jpg"} for i, jpeg in enumerate(JPEGS)], image_type
            ),
            "audio": pa.array(
                [{"bytes": b"fLaC" + bytes([i]), "path": f"clip{i}.FLAC"} for i in range(6)],
                image_type,
            ),
            "label": pa.array([i % 2 for i in range(6)], pa.int64()),
        }
    )
    features = {
        "image": {"_type": "Image"},
        "audio": {"_type": "Audio"},
        "label": {"names": ["cat", "dog"], "_type": "ClassLabel"},
    }
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    _write(tmp_path / "hf.parquet", table.replace_schema_metadata(metadata))
    reader = ParquetReader(str(tmp_path / "hf.parquet"))
    refs = reader.refs()
    assert list(reader.class_names) == ["cat", "dog"]
    for i, ref in enumerate(refs):
        sample = reader.read(ref)
        assert sample.fields == {
            "jpg": JPEGS[i],
            "audio.flac": b"fLaC" + bytes([i]),
            "cls": str(i % 2).encode(),
        }
    given = ParquetReader(str(tmp_path / "hf.parquet"), class_names=["a", "b", "c"])
    assert list(given.class_names) == ["a", "b", "c"]


def test_an_image_struct_with_a_path_and_no_bytes_is_named(tmp_path: Path) -> None:
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array([{"bytes": None, "path": "/x/1.jpg"}], image_type)})
    reader = ParquetReader(str(_write(tmp_path / "paths.parquet", table)))
    (ref,) = reader.refs()
    with pytest.raises(SourceError, match=r"column 'image'.*'/x/1.jpg'.*not embedded"):
        reader.read(ref)


@pytest.mark.parametrize(
    ("values", "arrow_type", "message"),
    [
        ([[[1.0, 2.0], [3.0]]], pa.list_(pa.list_(pa.float64())), "ragged array"),
        ([[1, None, 3]], pa.list_(pa.int32()), "holds 1 null"),
    ],
)
def test_an_array_npy_cannot_hold_is_named(
    tmp_path: Path, values: list[object], arrow_type: pa.DataType, message: str
) -> None:
    table = pa.table({"features": pa.array(values, arrow_type)})
    reader = ParquetReader(str(_write(tmp_path / "bad.parquet", table)))
    (ref,) = reader.refs()
    with pytest.raises(SourceError, match=rf"bad_00000000.*column 'features'.*{message}"):
        reader.read(ref)


def test_files_of_other_columns_and_labels_below_minus_one_are_refused(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", pa.table({"txt": ["x"]}))
    _write(tmp_path / "b.parquet", pa.table({"txt": [1]}))
    with pytest.raises(SourceError, match=r"b.parquet: its columns differ from .*a.parquet"):
        ParquetReader(str(tmp_path)).refs()
    _write(tmp_path / "c.parquet", pa.table({"label": [0, -3]}))
    with pytest.raises(SourceError, match=r"label -3 in column 'label', row 1"):
        ParquetReader(str(tmp_path / "c.parquet")).refs()


def test_a_folder_with_no_parquet_files_says_so(tmp_path: Path) -> None:
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SourceError, match=r"no \.parquet files found"):
        ParquetReader(str(tmp_path)).refs()


def test_missing_pyarrow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"pip install 'stoker\[parquet\]'"):
        ParquetReader("x.parquet")


def test_shuffled_reads_decode_each_row_group_once(tmp_path: Path) -> None:
    rows = 20_000
    table = pa.table(
        {
            "txt": [f"row {i}" for i in range(rows)],
            "label": pa.array([i % 7 for i in range(rows)], pa.int32()),
            "values": pa.array([[i, i + 1] for i in range(rows)], pa.list_(pa.int64())),
        }
    )
    path = _write(tmp_path / "big.parquet", table, row_group_size=1_000)
    reader = ParquetReader(str(path))
    refs = reader.refs()
    order = list(range(rows))
    random.Random(0).shuffle(order)
    with ThreadPoolExecutor(8) as pool:
        samples = list(pool.map(reader.read, [refs[i] for i in order]))
    assert reader.row_groups_decoded == 20  # once each, not once per row
    for i, sample in zip(order, samples, strict=True):
        assert sample.fields["txt"] == f"row {i}".encode()
        assert sample.label == i % 7
        assert _npy(sample.fields["values.npy"]).tolist() == [i, i + 1]
    # A cache of one row group's size decodes again as rows are asked for out of order,
    # and still reads every row right; a reader sent to another process starts empty.
    small = ParquetReader(str(path), cache_bytes=1)
    small_refs = small.refs()
    for i in order[:200]:
        assert small.read(small_refs[i]).fields["txt"] == f"row {i}".encode()
    assert 150 < small.row_groups_decoded <= 200
    copy = pickle.loads(pickle.dumps(small))  # noqa: S301 - our own bytes
    assert copy.row_groups_decoded == 0
    assert copy.read(small_refs[5]).fields["txt"] == b"row 5"
