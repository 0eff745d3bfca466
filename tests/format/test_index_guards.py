"""The index guards itself: checksums over its manifest's entries, a size cap, gzip refused,
and one sample key per member name (issue 15, item 8)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.errors import ShardFormatError
from stoker.format.index import CHECKSUMS_KEY, read_index
from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.storage import open_store
from stoker.testing.images import write_image_folder


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    write_image_folder(tmp_path / "src", files=8, classes=2, width=32, height=24)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=4))
    return tmp_path / "ds"


def test_verify_detects_edited_class_names(dataset: Path) -> None:
    ok = CliRunner().invoke(cli, ["verify", str(dataset)])
    assert ok.exit_code == 0, ok.output
    manifest_path = dataset / "index.json"
    manifest = json.loads(manifest_path.read_text())
    assert set(manifest[CHECKSUMS_KEY]) == set(manifest) - {CHECKSUMS_KEY}
    manifest["class_names"] = ["class_01", "class_00"]  # swapped: every label now lies
    manifest_path.write_text(json.dumps(manifest, indent=1))
    assert open_dataset(dataset).index.edited == ["class_names"]
    result = CliRunner().invoke(cli, ["verify", str(dataset), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["corrupt"] == [
        {
            "shard": "index.json",
            "sample": "",
            "problem": "class_names edited since the index was written (checksums differ)",
        }
    ]


def test_an_index_from_before_checksums_still_reads_and_verifies(dataset: Path) -> None:
    manifest_path = dataset / "index.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest[CHECKSUMS_KEY]
    manifest_path.write_text(json.dumps(manifest, indent=1))
    assert open_dataset(dataset).index.edited is None
    result = CliRunner().invoke(cli, ["verify", str(dataset)])
    assert result.exit_code == 0, result.output


def test_an_absurd_index_is_refused_before_parsing(dataset: Path) -> None:
    size = (dataset / "index.json").stat().st_size
    store = open_store(dataset)
    assert len(read_index(store, max_manifest_bytes=size)) == 8
    with pytest.raises(ShardFormatError, match=f"{size:,} bytes, more than an index may be"):
        read_index(store, max_manifest_bytes=size - 1)


def test_gzipped_tars_are_refused_with_a_message_saying_so(tmp_path: Path) -> None:
    plain = _tar([("a.txt", b"alpha"), ("a.cls", b"0")])
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "shard-0.tar.gz").write_bytes(gzip.compress(plain))
    index = CliRunner().invoke(cli, ["index", str(tmp_path / "gz")])
    assert index.exit_code == 1
    assert "compressed ones (shard-0.tar.gz, ...)" in index.output
    assert "decompress them first" in index.output
    packed = CliRunner().invoke(cli, ["pack", str(tmp_path / "gz"), str(tmp_path / "out")])
    assert packed.exit_code == 1
    assert "compressed ones" in packed.output
    # gzip data under a plain .tar name
    (tmp_path / "named").mkdir()
    (tmp_path / "named" / "shard-0.tar").write_bytes(gzip.compress(plain))
    for args in (
        ["index", str(tmp_path / "named")],
        ["pack", str(tmp_path / "named"), str(tmp_path / "o2")],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1
        assert "shard-0.tar: a gzip-compressed tar" in result.output


def test_keys_that_would_collide_are_refused_naming_both(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=2, classes=1, width=32, height=24)
    image = next((tmp_path / "src" / "class_00").glob("*.jpg")).read_bytes()
    (tmp_path / "src" / "class_00" / "x.y.z.jpg").write_bytes(image)
    (tmp_path / "src" / "class_00" / "x.y_z.jpg").write_bytes(image)
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "src"), str(tmp_path / "ds")])
    assert result.exit_code == 1
    assert "duplicate key 'class_00/x_y_z'" in result.output
    assert "x.y.z.jpg" in result.output
    assert "x.y_z.jpg" in result.output
    skip = ["pack", str(tmp_path / "src"), str(tmp_path / "ds2"), "--on-error", "skip"]
    skipped = CliRunner().invoke(cli, skip)
    assert skipped.exit_code == 0, skipped.output
    dataset = open_dataset(tmp_path / "ds2")
    assert len(dataset) == 3
    assert len(set(dataset.index.keys)) == 3
    assert [s["key"] for s in dataset.index.skipped] == ["class_00/x_y_z"]
