"""Region-of-interest JPEG decoding (stoker._jpegroi) against the whole-image decode.

Every JPEG kind and crop is decoded twice: region-only (the extension) and whole by
simplejpeg then cropped (the fallback, forced by the ``whole`` fixture). The two must agree
within 2 levels per channel (they are in fact equal), and the fallback must agree with a
plain full decode at scale 1 cropped and resized by OpenCV where no DCT scale is involved.
"""

from __future__ import annotations

import importlib.util
import io
import random
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg
from PIL import Image

from stoker.pipeline import decode
from stoker.pipeline.decode import decode_planned, roi_decoding
from stoker.pipeline.transforms import (
    CenterCrop,
    CropPlan,
    PlannedTransform,
    RandomResizedCrop,
    Resize,
)

needs_roi = pytest.mark.skipif(
    not roi_decoding(), reason="stoker._jpegroi was not built (no C compiler at install)"
)


@dataclass(frozen=True)
class Box:
    """A fixed crop as fractions of the image, to a fixed output size."""

    left: float
    top: float
    right: float
    bottom: float
    size: tuple[int, int] = (24, 24)
    flip: bool = False

    @property
    def output_size(self) -> tuple[int, int]:
        return self.size

    def plan(self, width: int, height: int, rng: random.Random) -> CropPlan:
        left, top = self.left * width, self.top * height
        box = (left, top, self.right * width - left, self.bottom * height - top)
        return CropPlan(box, self.size, self.flip)


#: Where the Loader uses the region decoder (small images and regions that save little are
#: decoded whole): the tests below take every region through it, except where they say.
WHERE_IT_SAVES = (decode._ROI_MIN_PIXELS, decode._ROI_MAX_BOTTOM, decode._ROI_MAX_WIDTH)


@pytest.fixture(autouse=True)
def every_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "_ROI_MIN_PIXELS", 0)
    monkeypatch.setattr(decode, "_ROI_MAX_BOTTOM", 2.0)


def _photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients, edges and noise: every 8x8 block differs."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack(
        [128 + 90 * np.sin(x / 13.0), 128 + 90 * np.cos(y / 9.0), (x * 3 + y * 2) % 256], axis=-1
    )
    image[(x // 40 + y // 30) % 2 == 1] *= 0.6
    image += rng.normal(0, 12, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def _encode(pixels: np.ndarray, mode: str = "RGB", **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, format="JPEG", quality=88, **options)
    return out.getvalue()


KINDS = {
    "baseline-420": _encode(_photo(320, 240), subsampling=2),
    "baseline-422": _encode(_photo(320, 240), subsampling=1),
    "baseline-444": _encode(_photo(320, 240), subsampling=0),
    "progressive": _encode(_photo(320, 240), progressive=True),
    "progressive-444": _encode(_photo(320, 240), progressive=True, subsampling=0),
    "grayscale": _encode(_photo(320, 240), "L"),
    "cmyk": _encode(_photo(320, 240), "CMYK"),
    "restart-markers": _encode(_photo(320, 240), restart_marker_blocks=3),
    "restart-rows": _encode(_photo(320, 240), progressive=True, restart_marker_rows=1),
    "odd-sized-420": _encode(_photo(333, 251, seed=1), subsampling=2),
    "odd-sized-422": _encode(_photo(257, 97, seed=2), subsampling=1),
    "small": _encode(_photo(9, 7, seed=3)),
    "tiny": _encode(_photo(5, 6, seed=3)),
    "tall": _encode(_photo(61, 530, seed=4)),
}

# Crops touching each edge and corner, the whole image, thin strips along every edge, a
# single pixel, and crops small enough (a large output) to decode at scale 1 or big enough
# (a small output) for 1/8.
BOXES = {
    "whole": Box(0, 0, 1, 1),
    "top-left": Box(0, 0, 0.3, 0.4),
    "top-right": Box(0.7, 0, 1, 0.35),
    "bottom-left": Box(0, 0.6, 0.45, 1),
    "bottom-right": Box(0.55, 0.7, 1, 1),
    "left-strip": Box(0, 0, 0.04, 1),
    "right-strip": Box(0.97, 0, 1, 1),
    "top-strip": Box(0, 0, 1, 0.03),
    "bottom-strip": Box(0, 0.98, 1, 1),
    "centre": Box(0.4, 0.45, 0.61, 0.58),
    "one-pixel": Box(0.5, 0.5, 0.5001, 0.5001, size=(3, 3)),
    "scale-1": Box(0.31, 0.22, 0.52, 0.49, size=(150, 120)),
    "scale-1/2": Box(0.5, 0.1, 0.75, 0.35),
    "scale-1/4": Box(0.2, 0.3, 0.65, 0.75),
    "scale-1/8": Box(0.05, 0.1, 0.95, 0.9, size=(8, 8)),
    "flipped": Box(0.13, 0.27, 0.77, 0.81, size=(40, 56), flip=True),
}


@pytest.fixture
def whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback: JPEGs decoded whole by simplejpeg, as where the extension is absent."""
    monkeypatch.setattr(decode, "_roi_decoder", lambda: None)
    assert not roi_decoding()


def _both(data: bytes, transform: PlannedTransform, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    ours = decode_planned(data, transform, random.Random(seed))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "_roi_decoder", lambda: None)
        fallback = decode_planned(data, transform, random.Random(seed))
    return ours, fallback


def _max_difference(a: np.ndarray, b: np.ndarray) -> int:
    assert a.shape == b.shape
    return int(np.abs(a.astype(int) - b.astype(int)).max())


@needs_roi
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("box", BOXES)
def test_the_region_equals_the_whole_decode_cropped(kind: str, box: str) -> None:
    ours, fallback = _both(KINDS[kind], BOXES[box])
    assert ours.shape == (*BOXES[box].size, 3)
    assert _max_difference(ours, fallback) <= 2


@needs_roi
@pytest.mark.parametrize("kind", KINDS)
def test_random_resized_crops_and_the_other_transforms_agree(kind: str) -> None:
    transforms = [
        RandomResizedCrop(32, flip=True),
        RandomResizedCrop(5, scale=(0.01, 0.05)),
        CenterCrop(16, resize=20),
        Resize((30, 17)),
    ]
    for transform in transforms:
        for seed in range(6):
            ours, fallback = _both(KINDS[kind], transform, seed)
            assert _max_difference(ours, fallback) <= 2, (transform, seed)


@pytest.mark.usefixtures("whole")
@pytest.mark.parametrize("kind", ["baseline-420", "grayscale", "cmyk", "odd-sized-422"])
def test_the_fallback_is_a_full_decode_cropped_and_resized(kind: str) -> None:
    # At scale 1 (a crop smaller than its output), the fallback is simplejpeg's whole image
    # with the crop's whole pixels cut out and resized by OpenCV, independently computed.
    data = KINDS[kind]
    full = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True)
    height, width = full.shape[:2]
    x0, y0, x1, y1 = width // 5, height // 3, width // 5 + 40, height // 3 + 30
    transform = Box(x0 / width, y0 / height, x1 / width, y1 / height, size=(60, 80))
    expected = cv2.resize(full[y0:y1, x0:x1], (80, 60), interpolation=cv2.INTER_LINEAR)
    image = decode_planned(data, transform, random.Random(0))
    assert _max_difference(image, expected) <= 2


@needs_roi
def test_only_the_region_is_decoded() -> None:
    # Columns: the extension returns the crop widened to an iMCU boundary, not the image.
    data = KINDS["baseline-420"]
    jpegroi = decode._roi_decoder()
    rows = np.empty((20, 320, 3), dtype=np.uint8)
    x_offset, width = jpegroi.decode(data, (1, 1), (320, 240), (100, 50, 140, 70), rows)
    assert 100 - 16 < x_offset <= 100
    assert 140 <= x_offset + width < 140 + 16
    full = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True)
    assert np.array_equal(rows[:, :width], full[50:70, x_offset : x_offset + width])
    # Rows: damage below the crop's last row is never read (the file still ends in EOI)...
    damaged = bytearray(data)
    damaged[len(data) - 400 : len(data) - 200] = bytes(200)
    top = Box(0.2, 0, 0.6, 0.2)
    assert (
        _max_difference(decode_planned(bytes(damaged), top, random.Random(0)), _both(data, top)[0])
        == 0
    )
    # ... while the whole-image decoder refuses the file.
    with pytest.raises(ValueError, match="cannot decode JPEG"):
        _both(bytes(damaged), top)


@pytest.mark.parametrize("roi", [True, False], ids=["region", "whole"])
def test_damaged_jpegs_raise_the_same_error_on_both_paths(
    roi: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if roi and not roi_decoding():
        pytest.skip("stoker._jpegroi was not built")
    if not roi:
        monkeypatch.setattr(decode, "_roi_decoder", lambda: None)
    data = KINDS["baseline-420"]
    middle = bytearray(data)
    middle[len(data) // 2 : len(data) // 2 + 300] = bytes(300)  # entropy data, EOI kept
    broken = {
        "truncated": data[: len(data) // 2],
        "zeroed-middle": bytes(middle),
        "no-frame": b"\xff\xd8\xff\xe0" + bytes(30) + b"\xff\xd9",
    }
    for name, bad in broken.items():
        with pytest.raises(ValueError, match="cannot decode JPEG") as error:
            decode_planned(bad, Box(0, 0, 1, 1), random.Random(0))
        assert "JPEG" in str(error.value), name


@needs_roi
def test_the_region_decode_releases_the_gil() -> None:
    # A thread spinning in Python advances during a decode only if the decode let go of the
    # GIL; the switch interval is long, so the decoding thread is not made to let go of it
    # in between (no timing thresholds: only whether the counter moved).
    data = _encode(_photo(1600, 1200))
    jpegroi = decode._roi_decoder()
    rows = np.empty((1200, 1600, 3), dtype=np.uint8)
    count, stop = 0, False

    def spin() -> None:
        nonlocal count
        while not stop:
            count += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.5)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        advanced = False
        for _ in range(10):
            before = count
            jpegroi.decode(data, (1, 1), (1600, 1200), (0, 0, 1600, 1200), rows)
            if count > before:
                advanced = True
                break
    finally:
        stop = True
        spinner.join()
        sys.setswitchinterval(interval)
    assert advanced


def test_a_corrupt_jpeg_in_a_dataset_names_its_sample(tmp_path: Path) -> None:
    from stoker import DecodeConfig
    from stoker.format.foreign.base import Sample
    from stoker.format.index import DatasetIndex, write_index
    from stoker.format.writer import ShardWriter
    from stoker.pipeline.loader import Loader
    from stoker.storage import open_store

    data = KINDS["baseline-420"]
    middle = bytearray(data)
    middle[len(data) // 3 : len(data) // 3 + 500] = bytes(500)
    store = open_store(tmp_path)
    writer = ShardWriter(store, "shard-000000.tar")
    for i in range(5):
        writer.add(Sample(key=f"good-{i}", fields={"jpg": KINDS["progressive"]}, label=0))
    writer.add(Sample(key="zeroed", fields={"jpg": bytes(middle)}, label=0))
    write_index(store, DatasetIndex.from_shards([writer.close()], class_names=[], fields={}))
    transform = Box(0, 0, 1, 1)
    with (
        pytest.raises(ValueError, match=r"sample 'zeroed'.*cannot decode JPEG"),
        Loader(str(tmp_path), batch_size=3, transform=transform) as loader,
    ):
        list(loader)
    skip = DecodeConfig(on_error="skip")
    with Loader(str(tmp_path), batch_size=3, transform=transform, decode=skip) as loader:
        keys = [k for batch in loader for k in batch["key"]]
        stats = loader.stats()
    assert sorted(keys) == [f"good-{i}" for i in range(5)]
    assert [k for k, _ in stats.skipped] == ["zeroed"]


@pytest.mark.skipif(
    sys.platform != "linux" or shutil.which("cc") is None, reason="needs Linux and a C compiler"
)
def test_the_extension_is_built_where_a_compiler_is() -> None:
    # setup.py declares it optional (an install without a compiler still succeeds), so a
    # broken build would only show as slower decoding: here it fails.
    assert importlib.util.find_spec("stoker._jpegroi") is not None
    assert roi_decoding()


@needs_roi
@pytest.mark.parametrize(
    ("size", "box", "region"),
    [
        # Output as large as the image: no DCT scale.
        ((240, 180), Box(0.2, 0, 0.6, 0.2, (480, 480)), False),  # under 256 x 256: whole
        ((640, 480), Box(0.2, 0, 0.6, 0.2, (480, 480)), True),  # above the bottom rows
        ((640, 480), Box(0.0, 0.5, 0.9, 1.0, (480, 480)), False),  # to the bottom, 90 % wide
        ((640, 480), Box(0.0, 0.5, 0.5, 1.0, (480, 480)), True),  # to the bottom, half wide
    ],
)
def test_the_region_decoder_is_used_where_it_saves(
    size: tuple[int, int], box: Box, region: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in zip(
        ("_ROI_MIN_PIXELS", "_ROI_MAX_BOTTOM", "_ROI_MAX_WIDTH"), WHERE_IT_SAVES, strict=True
    ):
        monkeypatch.setattr(decode, name, value)
    calls = []
    real = decode._roi_decoder()

    class Spy:
        def decode(self, *args: object) -> object:
            calls.append(args[2])
            return real.decode(*args)

    monkeypatch.setattr(decode, "_roi_decoder", Spy)
    data = _encode(_photo(*size))
    image = decode_planned(data, box, random.Random(0))
    assert bool(calls) == region
    assert image.shape[2] == 3
