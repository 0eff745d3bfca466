"""index_webdataset's report."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from stoker.errors import SourceError
from stoker.pack.indexer import IndexReport, index_webdataset
from stoker.pack.packer import pack
from stoker.testing.images import write_image_folder


def make_tar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_report_to_dict_is_plain_json() -> None:
    report = IndexReport("s3://bucket/wds", 2, 30, 123_456, 1.23456)
    data = report.to_dict()
    assert data == {
        "url": "s3://bucket/wds",
        "shards": 2,
        "samples": 30,
        "bytes": 123_456,
        "seconds": 1.235,
    }
    assert json.loads(json.dumps(data)) == data


def test_report_of_an_indexed_dataset(tmp_path: Path) -> None:
    tars = [
        make_tar([("a.txt", b"alpha"), ("a.cls", b"1"), ("b.txt", b"beta"), ("b.cls", b"0")]),
        make_tar([("c.txt", b"gamma"), ("c.cls", b"1")]),
    ]
    for number, data in enumerate(tars):
        (tmp_path / f"shard-{number}.tar").write_bytes(data)
    report = index_webdataset(tmp_path, class_names=["zero", "one"])
    data = report.to_dict()
    assert (data["url"], data["shards"], data["samples"]) == (report.url, 2, 3)
    assert data["bytes"] == sum(len(t) for t in tars)
    assert data["seconds"] == round(report.seconds, 3)


def test_reindexing_replaces_its_own_index(tmp_path: Path) -> None:
    (tmp_path / "a.tar").write_bytes(make_tar([("a.txt", b"alpha")]))
    index_webdataset(tmp_path)
    (tmp_path / "b.tar").write_bytes(make_tar([("b.txt", b"beta")]))
    assert index_webdataset(tmp_path).samples == 2


@pytest.mark.parametrize("name", ["index.json", "index.bin"])
def test_index_refuses_to_overwrite_the_users_own_index_files(tmp_path: Path, name: str) -> None:
    (tmp_path / "a.tar").write_bytes(make_tar([("a.txt", b"alpha")]))
    (tmp_path / name).write_bytes(b'{"mine": true}')
    with pytest.raises(SourceError, match=rf"{name} exists and is not a stoker index"):
        index_webdataset(tmp_path)
    assert (tmp_path / name).read_bytes() == b'{"mine": true}'


def test_index_refuses_a_packed_dataset(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=4, classes=2, width=16, height=16)
    pack(tmp_path / "src", tmp_path / "ds")
    before = (tmp_path / "ds" / "index.json").read_bytes()
    with pytest.raises(SourceError, match="written by stoker pack"):
        index_webdataset(tmp_path / "ds")
    assert (tmp_path / "ds" / "index.json").read_bytes() == before
