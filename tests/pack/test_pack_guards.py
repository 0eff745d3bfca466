"""`stoker pack` refuses what training would trip over, and what would poison its input
(issue 15: silent corruption, paths and arguments; issue 14: pack and index)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from PIL import Image

from stoker.cli.main import cli
from stoker.format.reader import open_dataset
from stoker.pack.imagecheck import check_jpeg_decodes, check_png_decodes
from stoker.pipeline.decode import decode_full
from stoker.testing.images import make_jpeg, write_image_folder


def _stoker(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def _truncated_with_end_marker(jpeg: bytes) -> bytes:
    # The probe's reproduction: (head -c 3000 a.jpg; printf '\xff\xd9') > t.jpg
    return jpeg[:3000] + b"\xff\xd9"


@pytest.fixture
def folder_with_truncated_jpeg(tmp_path: Path) -> tuple[Path, Path]:
    write_image_folder(tmp_path / "src", files=6, classes=2, width=160, height=120)
    victim = tmp_path / "src" / "class_01" / "cut.jpg"
    victim.write_bytes(
        _truncated_with_end_marker(make_jpeg(np.random.default_rng(3), width=320, height=240))
    )
    with pytest.raises(ValueError, match="premature end of data"):
        decode_full(victim.read_bytes())  # what training would meet
    return tmp_path / "src", victim


@pytest.mark.parametrize("extra", [[], ["--quality", "90"], ["--resize", "64"]])
def test_truncated_jpeg_with_its_end_marker_is_refused(
    folder_with_truncated_jpeg: tuple[Path, Path], tmp_path: Path, extra: list[str]
) -> None:
    source, victim = folder_with_truncated_jpeg
    result = _stoker("pack", source, tmp_path / "ds", *extra)
    assert result.exit_code == 1
    assert f"{victim}: cannot decode image" in result.output
    assert "premature end of data" in result.output
    assert not (tmp_path / "ds" / "index.json").exists()


@pytest.mark.parametrize("extra", [[], ["--quality", "90"]])
def test_truncated_jpeg_is_skipped_counted_and_listed(
    folder_with_truncated_jpeg: tuple[Path, Path], tmp_path: Path, extra: list[str]
) -> None:
    source, victim = folder_with_truncated_jpeg
    result = _stoker("pack", source, tmp_path / "ds", "--on-error", "skip", *extra)
    assert result.exit_code == 0, result.output
    assert "Skipped 1 inputs" in result.output
    assert f"{victim}: " in result.output
    assert "premature end of data" in result.output
    dataset = open_dataset(tmp_path / "ds")
    assert len(dataset) == 6
    assert [s["key"] for s in dataset.index.skipped] == ["class_01/cut"]
    for i in range(len(dataset)):  # everything packed decodes as the Loader decodes it
        decode_full(dataset[i]["jpg"])


def test_cmyk_and_greyscale_jpegs_pass() -> None:
    for mode, colour in (("CMYK", (10, 20, 30, 40)), ("L", 90)):
        out = io.BytesIO()
        Image.new(mode, (40, 30), colour).save(out, format="JPEG")
        check_jpeg_decodes(out.getvalue())
    check_jpeg_decodes(make_jpeg(np.random.default_rng(0), width=640, height=480))


def _png(width: int = 300, height: int = 200) -> bytes:
    rng = np.random.default_rng(5)
    pixels = (rng.random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def test_png_checks_catch_what_pillow_would() -> None:
    good = _png()
    check_png_decodes(good)
    iend = good[-12:]
    cut = good[: len(good) // 2] + iend  # truncated, its IEND put back
    with pytest.raises(ValueError, match="runs past the end"):
        check_png_decodes(cut)
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    with pytest.raises(ValueError, match="fails its CRC"):
        check_png_decodes(bytes(flipped))
    # Whole chunks, but the image data stops: only inflating it shows that.
    first_idat = good.index(b"IDAT") - 4
    (length,) = np.frombuffer(good[first_idat : first_idat + 4], dtype=">u4")
    short = good[: first_idat + 12 + int(length)] + iend
    assert len(short) < len(good)  # Pillow wrote more than one IDAT chunk
    with pytest.raises(ValueError, match="stops short"):
        check_png_decodes(short)
    with pytest.raises(OSError, match="truncated"):
        Image.open(io.BytesIO(short)).convert("RGB")


def test_truncated_png_is_refused_by_pack(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=4, classes=1, width=32, height=24)
    good = _png()
    victim = tmp_path / "src" / "class_00" / "cut.png"
    victim.write_bytes(good[: len(good) // 2] + good[-12:])
    result = _stoker("pack", tmp_path / "src", tmp_path / "ds")
    assert result.exit_code == 1
    assert f"{victim}: cannot decode image" in result.output
