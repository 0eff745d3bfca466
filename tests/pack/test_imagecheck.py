"""The fast JPEG/PNG structure checks agree with Pillow on real and broken files."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from stoker.pack.imagecheck import jpeg_size, png_size
from stoker.testing.images import make_jpeg


def test_sizes_match_pillow() -> None:
    rng = np.random.default_rng(0)
    for width, height in [(1, 1), (17, 33), (640, 480)]:
        jpeg = make_jpeg(rng, width=width, height=height)
        assert jpeg_size(jpeg) == (width, height)
        out = io.BytesIO()
        Image.new("RGB", (width, height)).save(out, format="PNG")
        assert png_size(out.getvalue()) == (width, height)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda b: b"GIF89a" + b[6:], "start-of-image"),
        (lambda b: b[:-200], "end-of-image"),
        (lambda b: b[:2] + b"\x00\x00" + b[4:], "bad JPEG marker"),
    ],
)
def test_broken_jpegs_are_refused(mangle, message: str) -> None:
    jpeg = make_jpeg(np.random.default_rng(1), width=64, height=48)
    with pytest.raises(ValueError, match=message):
        jpeg_size(mangle(jpeg))


def test_broken_png_is_refused() -> None:
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="PNG")
    with pytest.raises(ValueError, match="IEND"):
        png_size(out.getvalue()[:-12])
    with pytest.raises(ValueError, match="signature"):
        png_size(b"not a png" * 10)
