"""Packing records that are not (only) images: Parquet files and files grouped by name,
local and in a bucket, through `stoker pack` and `stoker.pack`; every member read back
equals what pyarrow reads, or the file's bytes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.errors import SourceError
from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.pack.sources import guess_format
from stoker.testing.images import make_jpeg

RNG = np.random.default_rng(61)


def _records(rows: int, first: int = 0) -> pa.Table:
    """An image binary column, a caption, an integer label and a float list (ragged)."""
    return pa.table(
        {
            "image": pa.array(
                [make_jpeg(RNG, width=16 + i % 5, height=12) for i in range(rows)], pa.binary()
            ),
            "caption": [f"photo {first + i}: a cat, ü" for i in range(rows)],
            "label": pa.array([(first + i) % 3 for i in range(rows)], pa.int64()),
            "emb": pa.array(
                [RNG.standard_normal(2 + i % 3).astype(np.float32) for i in range(rows)],
                pa.list_(pa.float32()),
            ),
        }
    )


def _rows(path: Path, stem: str) -> dict[str, dict[str, Any]]:
    """pyarrow's own read of a file, by the key each row gets."""
    return {f"{stem}_{i:08d}": row for i, row in enumerate(pq.read_table(path).to_pylist())}


def _assert_packed(url: str, rows: dict[str, dict[str, Any]], **options: Any) -> None:
    dataset = open_dataset(url, **options)
    assert dataset.verify().ok
    samples = dataset.read_many(range(len(dataset)))
    assert sorted(s["key"] for s in samples) == sorted(rows)
    for sample in samples:
        row = rows[sample["key"]]
        assert set(sample) == {"key", "label", "jpg", "txt", "cls", "emb.npy"}
        assert sample["jpg"] == row["image"]
        assert sample["txt"] == row["caption"].encode()
        assert sample["label"] == row["label"]
        assert sample["cls"] == str(row["label"]).encode()
        emb = np.load(io.BytesIO(sample["emb.npy"]), allow_pickle=False)
        assert emb.dtype == np.float32
        assert np.array_equal(emb, np.asarray(row["emb"], dtype=np.float32))


def test_pack_a_parquet_file_with_the_cli_and_in_python(tmp_path: Path) -> None:
    path = tmp_path / "records.parquet"
    pq.write_table(_records(40), path, row_group_size=16)
    rows = _rows(path, "records")
    result = CliRunner().invoke(
        cli, ["pack", str(path), str(tmp_path / "cli"), "--samples-per-shard", "15"]
    )
    assert result.exit_code == 0, result.output
    assert "as parquet" in result.output
    _assert_packed(str(tmp_path / "cli"), rows)
    report = pack(path, tmp_path / "py", config=PackConfig(samples_per_shard=15))
    assert (report.source_format, report.samples, report.shards) == ("parquet", 40, 3)
    _assert_packed(str(tmp_path / "py"), rows)


def _hugging_face_layout(root: Path) -> dict[str, dict[str, Any]]:
    (root / "data").mkdir(parents=True)
    (root / "README.md").write_text("---\nlicense: cc0\n---\n")
    rows: dict[str, dict[str, Any]] = {}
    for shard, first in ((0, 0), (1, 30)):
        name = f"train-{shard:05d}-of-00002"
        pq.write_table(_records(30, first), root / "data" / f"{name}.parquet", row_group_size=8)
        rows |= _rows(root / "data" / f"{name}.parquet", f"data/{name}")
    return rows


def test_pack_the_hugging_face_layout_as_it_is(tmp_path: Path) -> None:
    rows = _hugging_face_layout(tmp_path / "hf")
    assert guess_format(str(tmp_path / "hf")) == "parquet"
    report = pack(tmp_path / "hf", tmp_path / "ds", config=PackConfig(samples_per_shard=25))
    assert (report.source_format, report.samples) == ("parquet", 60)
    assert "2 files, 60 rows" in report.source
    _assert_packed(str(tmp_path / "ds"), rows)


def test_pack_parquet_from_a_bucket(s3_bucket: Any, tmp_path: Path) -> None:
    rows = _hugging_face_layout(tmp_path / "hf")
    store = s3_bucket.store("hf")
    for path in sorted((tmp_path / "hf").rglob("*")):
        if path.is_file():
            store.put(path.relative_to(tmp_path / "hf").as_posix(), path.read_bytes())
    options = s3_bucket.options()
    source = f"{s3_bucket.url}/hf"
    assert guess_format(source, storage_options=options) == "parquet"
    report = pack(
        source,
        f"{s3_bucket.url}/ds",
        storage_options=options,
        config=PackConfig(samples_per_shard=25),
    )
    assert (report.source_format, report.samples) == ("parquet", 60)
    assert report.requests["source"]["requests.get"] > 0  # read through stoker's store
    _assert_packed(f"{s3_bucket.url}/ds", rows, storage_options=options)
    single = pack(
        f"{source}/data/train-00001-of-00002.parquet",
        f"{s3_bucket.url}/one",
        storage_options=options,
    )
    assert single.samples == 30


def _grouped_files() -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for i in range(12):
        array = RNG.standard_normal((i % 4 + 1, 3)).astype(np.float32)
        out = io.BytesIO()
        np.save(out, array, allow_pickle=False)
        files[f"part{i % 2}/{i:04d}.npy"] = out.getvalue()
        files[f"part{i % 2}/{i:04d}.cls"] = str(i % 3).encode()
        files[f"part{i % 2}/{i:04d}.txt"] = f"document {i} ü".encode()
    return files


def _assert_grouped(url: str, files: dict[str, bytes], **options: Any) -> None:
    dataset = open_dataset(url, **options)
    assert dataset.verify().ok
    samples = dataset.read_many(range(len(dataset)))
    assert len(samples) == 12
    for sample in samples:
        assert set(sample) == {"key", "label", "npy", "cls", "txt"}
        for ext in ("npy", "cls", "txt"):
            assert sample[ext] == files[f"{sample['key']}.{ext}"]
        assert sample["label"] == int(files[f"{sample['key']}.cls"])


def test_pack_a_local_folder_of_grouped_files(tmp_path: Path) -> None:
    files = _grouped_files()
    for relative, data in files.items():
        (tmp_path / "in" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / relative).write_bytes(data)
    assert guess_format(str(tmp_path / "in")) == "files"
    result = CliRunner().invoke(
        cli, ["pack", str(tmp_path / "in"), str(tmp_path / "ds"), "--samples-per-shard", "5"]
    )
    assert result.exit_code == 0, result.output
    assert "as files" in result.output
    _assert_grouped(str(tmp_path / "ds"), files)


def test_pack_a_bucket_folder_of_grouped_files(s3_bucket: Any) -> None:
    files = _grouped_files()
    store = s3_bucket.store("in")
    for relative, data in files.items():
        store.put(relative, data)
    options = s3_bucket.options()
    assert guess_format(f"{s3_bucket.url}/in", storage_options=options) == "files"
    report = pack(
        f"{s3_bucket.url}/in",
        f"{s3_bucket.url}/ds",
        storage_options=options,
        config=PackConfig(samples_per_shard=5),
    )
    assert (report.source_format, report.samples, report.shards) == ("files", 12, 3)
    _assert_grouped(f"{s3_bucket.url}/ds", files, storage_options=options)


def _tree(root: Path, names: list[str]) -> str:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    return str(root)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["cat/1.jpg", "cat/2.jpg", "dog/3.png", "README.txt", "labels.csv"], "imagefolder"),
        (["1.jpg", "2.jpeg"], "imagefolder"),
        (["train/cat.0.jpg", "train/cat.1.jpg", "train/dog.0.jpg"], "imagefolder"),
        (["1.jpg", "1.txt", "2.jpg", "2.txt"], "files"),
        (["0001.npy", "0002.npy", "README.md"], "files"),
        (["a/0001.npy", "a/0001.cls", "a/0002.npy", "cat/1.jpg"], "files"),
        (["README.md", "data/train-00000-of-00001.parquet"], "parquet"),
        (["train/shard-0.tar", "train/shard-1.tar"], "webdataset"),
        # Tars that `stoker index` indexed in place: its index is not input.
        (["pairs-0000.tar", "pairs-0001.tar", "index.json", "index.bin"], "webdataset"),
    ],
)
def test_guess_tells_image_folders_from_grouped_files(
    tmp_path: Path, names: list[str], expected: str
) -> None:
    assert guess_format(_tree(tmp_path / "in", names)) == expected


def test_a_folder_with_nothing_usable_says_what_was_looked_for(tmp_path: Path) -> None:
    location = _tree(tmp_path / "in", ["README.md", "notes/list.csv", ".cache/1.npy"])
    with pytest.raises(SourceError) as caught:
        guess_format(location)
    message = str(caught.value)
    for looked_for in ("imagefolder", ".jpg", "grouped", "0001.npy", "parquet", ".tar", ".h5"):
        assert looked_for in message
    assert "found 2 file(s) ('README.md', 'notes/list.csv')" in message
    result = CliRunner().invoke(cli, ["pack", location, str(tmp_path / "ds")])
    assert result.exit_code == 1
    assert "nothing to pack: looked for images" in result.output
    assert "Traceback" not in result.output
