"""The commands over a dataset of videos (issue 36): show draws each clip's first, middle
and last frames; bench and doctor read clips."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

import stoker
from stoker.cli.main import cli
from stoker.testing.videos import make_video

pytest.importorskip("av")


@pytest.fixture
def packed(tmp_path: Path) -> Path:
    for n, name in enumerate(("a/one.mp4", "b/two.mp4", "b/three.webm")):
        path = tmp_path / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        codec = "libvpx-vp9" if name.endswith("webm") else "libx264"
        path.write_bytes(make_video(frames=20 + 4 * n, codec=codec, photo=n))
    stoker.pack(tmp_path / "in", tmp_path / "out")
    return tmp_path / "out"


def test_show_draws_three_frames_of_each_clip(packed: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(cli, ["show", str(packed), "--out", str(out), "--size", "64"])
    assert result.exit_code == 0, result.output
    assert "Wrote" in result.output
    assert "(3 samples" in result.output
    with Image.open(out) as grid:
        assert grid.width >= 3 * 3 * 64  # three cells a row, three frames a cell


@pytest.mark.parametrize("command", [["bench"], ["doctor", "--out", "doctor.png"]])
def test_bench_and_doctor_read_clips(packed: Path, command: list[str], tmp_path: Path) -> None:
    if "--out" in command:  # the picture in the test's folder, not the working directory
        command = [*command[:-1], str(tmp_path / command[-1])]
    args = [command[0], str(packed), *command[1:], "--batches", "2", "--batch-size", "2"]
    args += ["--size", "32"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "samples" in result.output or "images/s" in result.output


def test_pack_says_it_read_videos(tmp_path: Path) -> None:
    folder = tmp_path / "in" / "a"
    folder.mkdir(parents=True)
    (folder / "v.mp4").write_bytes(make_video(frames=12))
    (folder / "p.webm").write_bytes(make_video(frames=12, codec="libvpx-vp9"))
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "in"), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "video folder" in result.output
    assert "(2 videos)" in result.output
