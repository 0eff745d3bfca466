"""stoker index and stoker verify --json, through click's CliRunner."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.testing.images import write_image_folder


def make_tar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_index_json(tmp_path: Path) -> None:
    first = make_tar([("a.txt", b"alpha"), ("a.cls", b"1"), ("b.txt", b"beta"), ("b.cls", b"0")])
    second = make_tar([("c.txt", b"gamma"), ("c.cls", b"1")])
    (tmp_path / "shard-0.tar").write_bytes(first)
    (tmp_path / "shard-1.tar").write_bytes(second)
    args = ["index", str(tmp_path), "--class-name", "zero", "--class-name", "one", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert set(summary) == {"url", "shards", "samples", "bytes", "seconds"}
    assert (summary["shards"], summary["samples"]) == (2, 3)
    assert summary["bytes"] == len(first) + len(second)
    assert summary["url"].endswith(tmp_path.name)
    assert summary["seconds"] == round(summary["seconds"], 3) >= 0


def test_verify_json_reports_a_sound_and_a_damaged_dataset(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=20, classes=2, width=32, height=24)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=10))
    runner = CliRunner()
    result = runner.invoke(cli, ["verify", str(tmp_path / "ds"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] is True
    assert (report["shards"], report["samples"], report["corrupt"]) == (2, 20, [])
    assert report["bytes"] == sum(p.stat().st_size for p in (tmp_path / "ds").glob("*.tar"))

    shard = sorted((tmp_path / "ds").glob("*.tar"))[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = runner.invoke(cli, ["verify", str(tmp_path / "ds"), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["ok"] is False
    assert report["corrupt"]
    for problem in report["corrupt"]:
        assert set(problem) == {"shard", "sample", "problem"}
        assert problem["shard"].endswith(shard.name)


def test_index_names_labelled_classes_by_number(tmp_path: Path) -> None:
    (tmp_path / "shard-0.tar").write_bytes(
        make_tar([("a.txt", b"alpha"), ("a.cls", b"2"), ("b.txt", b"beta"), ("b.cls", b"0")])
    )
    result = CliRunner().invoke(cli, ["index", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert open_dataset(tmp_path).class_names == ["0", "1", "2"]
    inspect = CliRunner().invoke(cli, ["inspect", str(tmp_path), "--json"])
    assert json.loads(inspect.output)["classes"] == {"0": 1, "2": 1}
    few = CliRunner().invoke(cli, ["index", str(tmp_path), "--class-name", "x"])
    assert few.exit_code == 1
    assert "shard-0.tar: sample 'a' has label 2, and 1 class names were given" in few.output


def test_index_without_labels_has_no_class_names(tmp_path: Path) -> None:
    (tmp_path / "shard-0.tar").write_bytes(make_tar([("a.txt", b"alpha"), ("b.txt", b"beta")]))
    result = CliRunner().invoke(cli, ["index", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert open_dataset(tmp_path).class_names == []
