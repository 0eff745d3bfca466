"""Decoding with planned crops: sizes, DCT scaling, flips, other formats."""

from __future__ import annotations

import io
import random
from unittest import mock

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from stoker.pipeline import decode
from stoker.pipeline.decode import decode_full, decode_planned, roi_decoding
from stoker.pipeline.transforms import CenterCrop, RandomResizedCrop, Resize
from stoker.testing.images import make_jpeg

RNG = np.random.default_rng(0)
BIG = make_jpeg(RNG, width=1600, height=1200)


def test_random_resized_crop_gives_the_output_size() -> None:
    transform = RandomResizedCrop(224, flip=True)
    for seed in range(20):
        image = decode_planned(BIG, transform, random.Random(seed))
        assert image.shape == (224, 224, 3)
        assert image.dtype == np.uint8


def test_small_target_decodes_at_a_reduced_dct_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole-image fallback (the region decoder off, as where it was not built).
    monkeypatch.setattr(decode, "_roi_decoder", lambda: None)
    calls = []
    real = simplejpeg.decode_jpeg

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(result.shape)
        return result

    with mock.patch.object(simplejpeg, "decode_jpeg", spy):
        decode_planned(BIG, CenterCrop(100, resize=110), random.Random(0))
    # 1600x1200 -> a crop of ~1455 px scaled to 100: 1/8 scale (200x150) is enough.
    assert calls == [(150, 200, 3)]


@pytest.mark.skipif(not roi_decoding(), reason="stoker._jpegroi was not built")
def test_the_region_decoder_uses_the_same_dct_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "_ROI_MIN_PIXELS", 0)  # 200x150 at 1/8: small, but region
    jpegroi = decode._roi_decoder()
    calls = []
    real = jpegroi.decode

    def spy(data, scale, size, bounds, rows):
        calls.append((scale, size, bounds))
        return real(data, scale, size, bounds, rows)

    with mock.patch.object(jpegroi, "decode", spy):
        image = decode_planned(BIG, CenterCrop(100, resize=110), random.Random(0))
    # 1/8 scale, and only the central crop's 138x138 of the 200x150 pixels (1091 px at 1/1).
    assert calls == [((1, 8), (200, 150), (31, 6, 169, 144))]
    assert image.shape == (100, 100, 3)
    # Only the scales with SIMD code: 3/8, 5/8, 3/4 and 7/8 cost as much as 1/1 or more.
    calls.clear()
    with mock.patch.object(jpegroi, "decode", spy):
        for seed in range(40):
            decode_planned(BIG, RandomResizedCrop(224), random.Random(seed))
    assert {scale for scale, _, _ in calls} <= {(1, 8), (1, 4), (1, 2), (1, 1)}
    assert {(1, 2), (1, 1)} <= {scale for scale, _, _ in calls}


def test_same_seed_same_result_and_flip_mirrors() -> None:
    a = decode_planned(BIG, RandomResizedCrop(64), random.Random(5))
    b = decode_planned(BIG, RandomResizedCrop(64), random.Random(5))
    assert np.array_equal(a, b)
    plain = decode_planned(BIG, Resize((60, 80)), random.Random(0))
    flip_seed = next(s for s in range(100) if random.Random(s).random() < 0.5)
    flipped = decode_planned(BIG, Resize((60, 80), flip=True), random.Random(flip_seed))
    assert np.array_equal(flipped, plain[:, ::-1])


def test_png_and_output_buffer() -> None:
    buffer = io.BytesIO()
    Image.fromarray(RNG.integers(0, 255, (50, 70, 3), dtype=np.uint8)).save(buffer, "PNG")
    out = np.zeros((32, 32, 3), dtype=np.uint8)
    result = decode_planned(buffer.getvalue(), CenterCrop(32), random.Random(0), out=out)
    assert result is out
    assert out.any()


def test_resize_shorter_side_keeps_aspect() -> None:
    image = decode_planned(BIG, Resize(300), random.Random(0))
    assert image.shape == (300, 400, 3)


def test_bad_bytes_and_bombs_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot decode"):
        decode_full(b"not an image at all")
    with pytest.raises(ValueError, match="max_pixels"):
        decode_planned(BIG, CenterCrop(10), random.Random(0), max_pixels=1000)


def test_every_decode_failure_is_a_value_error_saying_so() -> None:
    png = io.BytesIO()
    Image.fromarray(RNG.integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(png, "PNG")
    cases = {
        "cannot decode JPEG": [BIG[: len(BIG) // 3], b"\xff\xd8\xff" + bytes(100)],
        "cannot decode image": [png.getvalue()[:60], b"GIF89a" + bytes(4), b"\x00" * 50],
    }
    for message, broken in cases.items():
        for data in broken:
            with pytest.raises(ValueError, match=message):
                decode_full(data)
            with pytest.raises(ValueError, match=message):
                decode_planned(data, CenterCrop(8), random.Random(0))


def _smooth_jpeg(width: int, height: int) -> bytes:
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack(
        [
            127 + 100 * np.sin(x / 37.0),
            127 + 100 * np.cos(y / 23.0),
            127 + 90 * np.sin((x + y) / 51.0),
        ],
        axis=-1,
    ).astype(np.uint8)
    return bytes(simplejpeg.encode_jpeg(image, quality=95, colorspace="RGB"))


def test_the_resize_stays_close_to_pillows_antialiased_bilinear() -> None:
    data = _smooth_jpeg(640, 480)
    full = decode_full(data)
    for seed in range(8):
        transform = RandomResizedCrop(224)
        ours = decode_planned(data, transform, random.Random(seed)).astype(int)
        left, top, w, h = transform.plan(640, 480, random.Random(seed)).box
        box = (left, top, left + w, top + h)
        pillow = np.asarray(full.resize((224, 224), Image.Resampling.BILINEAR, box=box))
        assert np.abs(ours - pillow.astype(int)).mean() < 4  # of 255: the documented gap


def _checkerboard_png(side: int) -> bytes:
    board = ((np.indices((side, side)).sum(axis=0) % 2) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(np.repeat(board[..., None], 3, axis=2)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_antialias_averages_a_small_shrink() -> None:
    # 100 -> 64 pixels of a one-pixel checkerboard: sampling aliases, averaging is grey.
    data = _checkerboard_png(100)
    rng = random.Random(0)
    sampled = decode_planned(data, Resize((64, 64)), rng)
    averaged = decode_planned(data, Resize((64, 64), antialias=True), rng)
    assert abs(float(averaged.mean()) - 127.5) < 3
    assert averaged.std() < sampled.std() / 2


def test_a_shrink_of_2x_or_more_is_averaged_anyway() -> None:
    data = _checkerboard_png(256)
    image = decode_planned(data, Resize((64, 64)), random.Random(0))
    assert image.std() < 10  # grey, not a moire of the checks
