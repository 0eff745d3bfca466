"""stoker inspect and stoker show on records of any fields (captions, JSON, arrays), written
by the webdataset library and indexed in place, through click's CliRunner."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from stoker.cli.main import cli
from stoker.pack.indexer import index_webdataset
from stoker.testing.images import make_jpeg

SAMPLES = 20


def _captioned(i: int) -> dict[str, Any]:
    return {
        "__key__": f"{i:04d}",
        "jpg": make_jpeg(np.random.default_rng(i), width=40, height=30 + i),
        "txt": f"a photo of thing number {i}" + " and more" * (i % 4),
        "json": {"width": 40, "tags": ["x"] * (i % 3), "source": "test"},
        "npy": np.arange(i % 5 + 1, dtype=np.float32) / 4,
        "emb.npy": np.full(8, i, dtype=np.float16),
        "cls": i % 3,
    }


def _arrays(i: int) -> dict[str, Any]:
    record: dict[str, Any] = {
        "__key__": f"doc{i:04d}",
        "npy": np.arange(i % 4 + 2, dtype=np.float32) * i,
        "cls": i % 2,
    }
    if i % 5 != 4:
        record["txt"] = f"document {i}"
    return record


def _write(root: Path, records: list[dict[str, Any]]) -> str:
    import webdataset as wds

    root.mkdir()
    with wds.TarWriter(str(root / "records-0000.tar")) as sink:
        for record in records:
            sink.write(record)
    index_webdataset(root)
    return str(root)


@pytest.fixture(scope="module")
def captioned_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("records-cli") / "captioned"
    return _write(root, [_captioned(i) for i in range(SAMPLES)])


@pytest.fixture(scope="module")
def arrays_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("records-cli") / "arrays"
    return _write(root, [_arrays(i) for i in range(SAMPLES)])


def _run(*args: str) -> Any:
    return CliRunner(env={"COLUMNS": "200"}).invoke(cli, list(args))


def test_inspect_lists_each_field_with_its_type_and_size(captioned_url: str) -> None:
    result = _run("inspect", captioned_url, "--json")
    assert result.exit_code == 0, result.output
    table = {f["field"]: f for f in json.loads(result.output)["field_table"]}
    assert set(table) == {"jpg", "txt", "json", "npy", "emb.npy", "cls"}
    first = [_captioned(i) for i in range(16)]  # the first 16 samples, in index order
    captions = [r["txt"] for r in first]
    lengths = sorted(len(c) for c in captions)
    assert table["txt"]["values"] == f"str, {lengths[0]}-{lengths[-1]} chars"
    assert table["txt"]["mean_bytes"] == pytest.approx(np.mean([len(c.encode()) for c in captions]))
    assert table["txt"]["decoded_as"] == "text"
    assert table["jpg"]["decoded_as"] == "image"
    assert table["jpg"]["batch_name"] == "image"
    assert table["jpg"]["values"] == "JPEG RGB, 40x30..40x45"
    assert table["jpg"]["mean_bytes"] == pytest.approx(np.mean([len(r["jpg"]) for r in first]))
    assert table["json"]["values"] == "dict (keys: source, tags, width)"
    assert table["npy"]["values"] == "ragged float32 (1..5,)"
    assert table["emb.npy"]["values"] == "float16 (8,)"
    assert table["cls"]["values"] == "int, 0..2"
    for entry in table.values():
        assert (entry["samples"], entry["read"], entry["failed"]) == (SAMPLES, 16, 0)

    text = _run("inspect", captioned_url)
    assert text.exit_code == 0, text.output
    rows = {line.split("│")[1].strip(): line for line in text.output.splitlines() if "│" in line}
    assert re.search(r"│ text\s+│ txt\s+│ \d+ B\s+│ str, \d+-\d+ chars", rows["txt"])
    assert "ragged float32 (1..5,)" in rows["npy"]
    assert "dict (keys: source, tags, width)" in rows["json"]


def test_inspect_names_fields_that_fail_and_those_some_samples_lack(
    arrays_url: str, tmp_path: Path
) -> None:
    result = _run("inspect", arrays_url, "--json", "--field-samples", "10")
    assert result.exit_code == 0, result.output
    table = {f["field"]: f for f in json.loads(result.output)["field_table"]}
    assert table["txt"]["samples"] == 16  # every fifth sample has no caption
    assert table["txt"]["read"] == 8
    assert table["npy"]["values"] == "ragged float32 (2..5,)"

    bad = [_arrays(i) for i in range(4)]
    bad[2]["json"] = b'{"unclosed": '
    for record in bad[:2] + bad[3:]:
        record["json"] = b'{"ok": true}'
    url = _write(tmp_path / "bad", bad)
    result = _run("inspect", url, "--json")
    (entry,) = [f for f in json.loads(result.output)["field_table"] if f["field"] == "json"]
    assert entry["failed"] == 1
    assert "invalid JSON" in entry["problem"]
    assert entry["values"] == "dict (keys: ok)"
    text = _run("inspect", url)
    assert "1 of 4 fail: invalid JSON" in text.output


def test_show_puts_captions_under_the_images(captioned_url: str, tmp_path: Path) -> None:
    png = tmp_path / "grid.png"
    result = _run("show", captioned_url, "--size", "64", "--out", str(png))
    assert result.exit_code == 0, result.output
    assert f"Wrote {png} (9 samples of {captioned_url})" in result.output
    title, caption = 18, 2 * 14 + 4  # a title strip above each image, two lines under it
    with Image.open(png) as image:
        grid = np.asarray(image.convert("L"))
    row = title + 64 + caption
    assert grid.shape == (3 * row, 3 * 64)
    for cell in range(9):
        top, left = (cell // 3) * row, (cell % 3) * 64
        strip = grid[top + title + 64 : top + row, left : left + 64]
        assert (strip < 128).any(), f"no caption under image {cell}"


def test_show_without_images_prints_the_fields_of_the_first_samples(
    arrays_url: str, tmp_path: Path
) -> None:
    png = tmp_path / "grid.png"
    result = _run("show", arrays_url, "--out", str(png))
    assert result.exit_code == 0, result.output
    assert not png.exists()
    assert "has no images (fields cls, npy, txt)" in result.output
    keys = re.findall(r"^(doc\d{4})", result.output, flags=re.MULTILINE)
    assert len(keys) == len(set(keys)) == 9
    blocks = re.split(r"^(?=doc\d{4})", result.output, flags=re.MULTILINE)[1:]
    for key, block in zip(keys, blocks, strict=True):
        expected = _arrays(int(key[3:]))
        vector = expected["npy"]
        values = ", ".join(f"{x:.4g}" for x in vector.tolist())
        assert f"  npy: float32 ({len(vector)},) [{values}]" in block
        assert f"(class {expected['cls']})" in block  # the label, read from .cls
        assert "  cls:" not in block
        if "txt" in expected:
            assert f'  txt: "{expected["txt"]}"' in block
        else:
            assert "  txt: (none: the sample lacks it)" in block


def test_class_names_and_captions_reach_the_terminal_escaped(tmp_path: Path) -> None:
    # Class names come from whoever wrote the dataset: a terminal escape in one recoloured
    # the terminal, and rich read "[bold]" as markup.
    import webdataset as wds

    root = tmp_path / "hostile"
    root.mkdir()
    with wds.TarWriter(str(root / "records-0000.tar")) as sink:
        for i in range(4):
            sink.write({"__key__": f"doc{i}", "txt": "\x1b]0;pwned\x07caption", "cls": i % 2})
    index_webdataset(root, class_names=["\x1b[31mred\x1b[0m", "[bold]blue[/bold]\r\x9b2K"])
    for args in [("inspect", str(root)), ("show", str(root), "--out", str(tmp_path / "g.png"))]:
        result = _run(*args)
        assert result.exit_code == 0, result.output
        assert not {"\x1b", "\x07", "\r", "\x9b"} & set(result.output), result.output
        if args[0] == "inspect":
            assert "\\x1b[31mred\\x1b[0m" in result.output
            assert "[bold]blue[/bold]\\r\\x9b2K" in result.output
        else:
            assert "(class \\x1b[31mred\\x1b[0m)" in result.output
            assert "pwned" in result.output
