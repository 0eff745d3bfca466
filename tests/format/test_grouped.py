"""GroupedFilesReader: files grouped into samples by the WebDataset rule, local and in a bucket."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker.errors import SourceError
from stoker.format.foreign.grouped import GroupedFilesReader, split_name
from stoker.storage.engine import default_engine
from stoker.testing.images import make_jpeg

RNG = np.random.default_rng(5)


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


#: relative path -> bytes; what the readers below must give back, member by member.
FILES: dict[str, bytes] = {
    "a/0001.npy": _npy(np.arange(6, dtype=np.float32).reshape(2, 3)),
    "a/0001.cls": b"3\n",
    "a/0001.txt": "first ü".encode(),
    "a/0002.npy": _npy(np.arange(4, dtype=np.int64)),
    "a/0002.txt": b"second, no label",
    "b.v2/0003.JPEG": make_jpeg(RNG, width=16, height=12),
    "b.v2/0003.seg.png": b"\x89PNG\r\n\x1a\n not really",
    "b.v2/0003.cls": b"0",
    "c/x#1.npy": _npy(np.zeros(2, np.uint8)),  # '#' is part of the key, never a fragment
}
EXPECTED = {
    "a/0001": ({"npy": FILES["a/0001.npy"], "cls": b"3", "txt": FILES["a/0001.txt"]}, 3),
    "a/0002": ({"npy": FILES["a/0002.npy"], "txt": FILES["a/0002.txt"]}, -1),
    "b.v2/0003": (  # folders keep their dots, as in a tar of the folder
        {"jpg": FILES["b.v2/0003.JPEG"], "seg.png": FILES["b.v2/0003.seg.png"], "cls": b"0"},
        0,
    ),
    "c/x#1": ({"npy": FILES["c/x#1.npy"]}, -1),
}
LEFT_OUT = {"README.md": b"about", "a/Makefile": b"all:", ".hidden/0009.npy": b"x"}


def _write_local(root: Path, files: dict[str, bytes]) -> str:
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    return str(root)


def _write_bucket(bucket: Any, files: dict[str, bytes]) -> str:
    store = bucket.store("grouped")
    for relative, data in files.items():
        store.put(relative, data)
    return f"{bucket.url}/grouped"


def _check(reader: GroupedFilesReader, *, use_async: bool = False) -> None:
    refs = reader.refs()
    assert [ref.key for ref in refs] == sorted(EXPECTED)
    for ref in refs:
        # The packer runs read_async on the process's I/O engine, as here.
        sample = default_engine().run(reader.read_async(ref)) if use_async else reader.read(ref)
        fields, label = EXPECTED[ref.key]
        assert (sample.fields, sample.label, ref.label) == (fields, label, label)


def test_split_name_follows_webdataset() -> None:
    assert split_name("a/0001.seg.png") == ("a/0001", "seg.png")
    assert split_name("0001.npy") == ("0001", "npy")
    assert split_name("a/Makefile") is None
    assert split_name("a/.npy") is None


def test_a_local_folder_groups_its_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    location = _write_local(tmp_path / "in", {**FILES, **LEFT_OUT})
    with caplog.at_level(logging.WARNING):
        _check(GroupedFilesReader(location))
    assert "left out 1 file(s) without an extension: 'a/Makefile'" in caplog.text
    assert "left out 1 file(s) documents: 'README.md'" in caplog.text


def test_a_bucket_folder_groups_its_objects_read_by_their_keys(s3_bucket: Any) -> None:
    location = _write_bucket(s3_bucket, {**FILES, **LEFT_OUT})
    reader = GroupedFilesReader(location, storage_options=s3_bucket.options())
    assert reader.reads_remote
    _check(reader)
    _check(reader, use_async=True)
    assert reader.requests()["requests.get"] >= len(FILES)


def test_a_bad_cls_or_a_member_given_twice_is_raised_or_skipped(tmp_path: Path) -> None:
    files = {
        "0001.npy": b"x",
        "0001.cls": b"cat",
        "0002.jpg": b"x",
        "0002.jpeg": b"y",
        "0003.txt": b"fine",
    }
    location = _write_local(tmp_path / "in", files)
    reader = GroupedFilesReader(location, on_error="skip")
    assert [ref.key for ref in reader.refs()] == ["0003"]
    reasons = {problem["key"]: problem["reason"] for problem in reader.problems}
    assert set(reasons) == {"0001", "0002"}
    assert "files 0002.jpeg, 0002.jpg give the member(s) ['jpg'] twice" in reasons["0002"]
    with pytest.raises(SourceError, match=r"0002: files 0002.jpeg, 0002.jpg give the member"):
        GroupedFilesReader(location).refs()
    (tmp_path / "in" / "0002.jpeg").unlink()
    with pytest.raises(SourceError, match=r"0001.cls: cls member is not an integer >= -1: b'cat'"):
        GroupedFilesReader(location).refs()


def test_a_folder_of_nothing_but_documents_says_what_it_looked_for(tmp_path: Path) -> None:
    location = _write_local(tmp_path / "in", {"README.md": b"x", "LICENSE": b"y"})
    with pytest.raises(SourceError, match=r"no files grouped into samples found .*0001.npy"):
        GroupedFilesReader(location).refs()
