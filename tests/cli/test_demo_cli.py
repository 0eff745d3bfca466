"""stoker demo: real photographs where scikit-image is installed (generated images with a
note otherwise), one training batch in grid.png, a chosen port, advice as flags."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from stoker import demo
from stoker.cli.main import cli
from stoker.testing.seaweed import free_ports


def test_demo_uses_photographs_a_given_port_and_one_batch(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    out = tmp_path / "demo"
    args = ["demo", "--files", "40", "--rtt-ms", "2", "--port", str(port), "--out", str(out)]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["endpoint"] == f"http://127.0.0.1:{port}"
    photos = importlib.util.find_spec("skimage") is not None
    assert report["images"] == ("photographs" if photos else "generated")
    # The doctor's advice was printed by the command line: flags, not Python.
    assert not any("Loader(" in line for line in report["doctor"]["advice"])
    with Image.open(out / "grid.png") as grid:
        pixels = np.asarray(grid.convert("RGB"), dtype=np.float64)
    # Nine cells of 160x160 under their captions, as in one batch's first nine samples.
    assert grid.size == (3 * 160, 3 * (160 + 18))
    assert pixels.std() > 20  # pictures, not blank cells


def test_demo_names_a_port_it_cannot_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            cli,
            ["demo", "--files", "10", "--port", str(port), "--out", str(tmp_path / "d")],
        )
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert "give another --port" in result.output


def test_demo_falls_back_to_generated_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_photos(*args: object, **kwargs: object) -> list[Path]:
        raise ImportError("no source photographs: pip install scikit-image")

    monkeypatch.setattr(demo, "write_photo_folder", no_photos)
    paths, kind = demo._write_images(tmp_path / "images", 12)
    assert kind == "generated"
    assert len(paths) == 12
    assert all(p.is_file() for p in paths)


@pytest.mark.skipif(importlib.util.find_spec("skimage") is None, reason="needs scikit-image")
def test_demo_makes_photographs_with_scikit_image(tmp_path: Path) -> None:
    paths, kind = demo._write_images(tmp_path / "images", 12)
    assert kind == "photographs"
    with Image.open(paths[0]) as image:
        assert image.size == (160, 120)
