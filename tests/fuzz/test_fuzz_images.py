"""Fuzzing the image decoders: damaged images raise ValueError (or SourceError when packing).

The loader skips or raises a bad sample only when its decoder raises ValueError; any other
exception would stop training whatever ``on_error`` says. Real small images of each format
have bytes overwritten, cut, or header fields set to extreme values.
"""

from __future__ import annotations

import contextlib
import io
import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from stoker.errors import SourceError
from stoker.format.spec import declared_image_size
from stoker.pack.reencode import ImagePolicy, process_image
from stoker.pipeline.decode import decode_full, decode_planned
from stoker.pipeline.transforms import RandomResizedCrop

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
PIXELS = np.random.default_rng(5).integers(0, 255, (24, 32, 3), dtype=np.uint8)


def _encode(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(PIXELS).save(out, fmt)
    return out.getvalue()


ORIGINALS = {fmt: _encode(fmt) for fmt in ("JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF")}


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(ORIGINALS[draw(st.sampled_from(sorted(ORIGINALS)))])
    for _ in range(draw(st.integers(0, 4))):
        position = draw(st.integers(0, min(len(data) - 1, draw(st.sampled_from([40, 400, 10**6])))))
        data[position] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, draw(st.integers(0, 255))]))
    if draw(st.integers(0, 3)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@FUZZ
@given(data=damaged(), seed=st.integers(0, 2**16))
def test_loader_decoders_raise_only_value_errors(data: bytes, seed: int) -> None:
    declared_image_size(data)  # never raises
    for decode in (
        lambda: decode_full(data, max_pixels=1 << 20),
        lambda: decode_planned(data, RandomResizedCrop(8), random.Random(seed), max_pixels=1 << 20),
    ):
        with contextlib.suppress(ValueError):
            decode()


@FUZZ
@given(data=damaged(), ext=st.sampled_from(["jpg", "png", "webp", "gif"]), rewrite=st.booleans())
def test_pack_image_checks_raise_only_source_errors(data: bytes, ext: str, rewrite: bool) -> None:
    policy = ImagePolicy(max_pixels=1 << 20, resize_shorter=8 if rewrite else None)
    with contextlib.suppress(SourceError):
        process_image(data, ext, policy, where="fuzz")
