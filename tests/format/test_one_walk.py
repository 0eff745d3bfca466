"""One rule for hidden names, for every reader, locally and in a bucket (issue 33, item 3):
a path with a part beginning with ``.`` or ``_`` is left out, and the listing says so."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker.format.foreign.locations import LocationReader
from stoker.format.reader import open_dataset
from stoker.pack.guess import sample_names
from stoker.pack.packer import pack
from stoker.pack.tokens import pack_tokens
from stoker.testing.images import make_jpeg


def _npy(values: list[int]) -> bytes:
    out = io.BytesIO()
    np.save(out, np.asarray(values, dtype=np.int32))
    return out.getvalue()


def _tree(kind: str) -> dict[str, bytes]:
    """Relative path -> bytes: the kept inputs of ``kind`` and the hidden garbage."""
    rng = np.random.default_rng(0)
    if kind == "images":
        kept = {
            "cat/a.jpg": make_jpeg(rng, width=32, height=24),
            "dog/b.jpg": make_jpeg(rng, width=32, height=24),
        }
        ext = "jpg"
    elif kind == "tokens":
        kept = {"a.npy": _npy([1, 2, 3]), "sub/b.npy": _npy([4, 5])}
        ext = "npy"
    else:
        kept = {"a.tfrecord": b"x" * 10, "sub/b.tfrecord": b"y" * 12}
        ext = "tfrecord"
    garbage = {
        ".DS_Store": b"junk",
        f".cache/c.{ext}": b"junk",
        f"cat/._a.{ext}": b"junk",
        "_SUCCESS": b"",
        f"_stoker/x.{ext}": b"junk",
        f"dog/_draft.{ext}": b"junk",
        f"_tmp/deep/y.{ext}": b"junk",
    }
    return {**kept, **garbage}


def _place(tree: dict[str, bytes], where: str, tmp_path: Path, bucket: Any) -> tuple[str, Any]:
    """Write the tree locally or into the bucket; its location and storage options."""
    if where == "local":
        root = tmp_path / "in"
        for relative, data in tree.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_bytes(data)
        return str(root), None
    store = bucket.store("in")
    for relative, data in tree.items():
        store.put(relative, data)
    return f"{bucket.url}/in", bucket.options()


def _left_out(caplog: pytest.LogCaptureFixture) -> str:
    return " ".join(r.getMessage() for r in caplog.records if "hidden name" in r.getMessage())


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_an_image_pack_leaves_out_hidden_names_and_says_so(
    where: str, tmp_path: Path, s3_bucket: Any, caplog: pytest.LogCaptureFixture
) -> None:
    location, options = _place(_tree("images"), where, tmp_path, s3_bucket)
    caplog.set_level(logging.INFO, logger="stoker")
    report = pack(location, tmp_path / "ds", storage_options=options)
    assert report.skipped == []
    assert sorted(open_dataset(tmp_path / "ds").index.keys) == ["cat/a", "dog/b"]
    said = _left_out(caplog)
    assert "left out 7 hidden name(s)" in said
    assert "_stoker" in said


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_a_token_pack_leaves_out_the_same_hidden_names(
    where: str, tmp_path: Path, s3_bucket: Any, caplog: pytest.LogCaptureFixture
) -> None:
    location, options = _place(_tree("tokens"), where, tmp_path, s3_bucket)
    caplog.set_level(logging.INFO, logger="stoker")
    report = pack_tokens(location, tmp_path / "ds", storage_options=options)
    assert report.skipped == []
    assert sorted(open_dataset(tmp_path / "ds").index.keys) == ["a", "sub/b"]
    assert "_SUCCESS" in _left_out(caplog)


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_a_listing_of_record_files_leaves_out_the_same_hidden_names(
    where: str, tmp_path: Path, s3_bucket: Any
) -> None:
    location, options = _place(_tree("records"), where, tmp_path, s3_bucket)
    listed = LocationReader(options).list(location, (".tfrecord",))
    names = sorted(found.removeprefix(location).lstrip("/") for found, _ in listed)
    assert names == ["a.tfrecord", "sub/b.tfrecord"]


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_format_guessing_looks_past_the_same_hidden_names(
    where: str, tmp_path: Path, s3_bucket: Any
) -> None:
    location, options = _place(_tree("images"), where, tmp_path, s3_bucket)
    assert sorted(sample_names(location, storage_options=options)) == ["cat/a.jpg", "dog/b.jpg"]
