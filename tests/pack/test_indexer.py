"""index_webdataset's report."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from stoker.pack.indexer import IndexReport, index_webdataset


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
