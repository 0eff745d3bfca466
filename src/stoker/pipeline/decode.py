"""Decoding image bytes into arrays: for a JPEG, only the crop's region at the smallest scale.

Both decoders refuse decompression bombs before any pixel is decoded: the size the image's
header declares is checked against ``max_pixels`` (default :data:`DEFAULT_MAX_PIXELS`), so a
small file claiming 65,535 x 65,535 pixels costs microseconds, not gigabytes. Every failure
to decode is a :class:`ValueError` saying what is wrong, which the loader skips or raises
as its ``on_error`` says.

A planned JPEG is decoded by the ``stoker._jpegroi`` extension where it was built and can
load the libjpeg-turbo that Pillow bundles (see docs/decode.md), otherwise by simplejpeg;
both give the same pixels.
"""

from __future__ import annotations

import functools
import importlib
import io
import logging
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from stoker.format import spec
from stoker.format.imaging import PILLOW_ERRORS, pillow_problem
from stoker.format.spec import declared_image_size
from stoker.pipeline.transforms import CropPlan, PlannedTransform

logger = logging.getLogger(__name__)

#: Default ``max_pixels``: images with more pixels are refused before decoding.
DEFAULT_MAX_PIXELS = spec.DEFAULT_MAX_PIXELS

# The DCT scales a JPEG is decoded at, smallest first: the first whose output covers the need
# is used. libjpeg-turbo also decodes at 3/8, 5/8, 3/4 and 7/8, but without SIMD: on 500x375
# photos 7/8 costs 1.3x the CPU of a full-size decode, 3/4 1.1x, 5/8 1.0x, 3/8 as much as 1/2
# (docs/decode.md), so those are never picked.
_DCT_SCALES = ((1, 8), (1, 4), (1, 2))

_Bounds = tuple[int, int, int, int]


def is_jpeg(data: bytes | memoryview) -> bool:
    """JPEG magic bytes."""
    return bytes(data[:3]) == b"\xff\xd8\xff"


def roi_decoding() -> bool:
    """Whether planned JPEGs are decoded region-only (``stoker._jpegroi``), not whole."""
    return _roi_decoder() is not None


def decode_planned(
    data: bytes | memoryview,
    transform: PlannedTransform,
    rng: random.Random,
    *,
    out: np.ndarray | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Decode and transform one image into an ``(H, W, 3)`` uint8 array.

    JPEGs are decoded by libjpeg-turbo at the smallest DCT scale whose output still covers
    the crop at the target resolution, and only the crop's rows and columns of it where the
    ``stoker._jpegroi`` extension is available (:func:`roi_decoding`; the rows above the
    crop are still read, the rest of the file is not), else whole by simplejpeg, with the
    same pixels. Other formats go through Pillow. The crop is then resized by OpenCV (the
    GIL released), bilinearly; with the plan's ``antialias``, or when it shrinks by 2x or
    more (the DCT scale leaves less than that for a JPEG), by averaging the source pixels
    (``INTER_AREA``). Pillow's antialiased bilinear resize, used before, cost as much as
    the decode; the pixels differ from it by about 3 levels of 255 on average.

    Args:
        data: Encoded image.
        transform: Plans the crop from the image size.
        rng: This sample's generator (seeded per sample, so results do not depend on threads).
        out: Array to write the result into (a row of a preallocated batch).
        max_pixels: Refuse larger images (decompression bombs).

    Raises:
        ValueError: Undecodable image, or more than ``max_pixels`` pixels.
    """
    if is_jpeg(data):
        width, height = _jpeg_size(data, max_pixels)
        plan = transform.plan(width, height, rng)
        left, top, box_w, box_h = plan.box
        out_h, out_w = plan.size
        need_w = math.ceil(width * out_w / box_w) if box_w else width
        need_h = math.ceil(height * out_h / box_h) if box_h else height
        scale = _dct_scale(width, height, min(need_w, width), min(need_h, height))
        bounds = _scaled_bounds(plan.box, (width, height), (scale[2], scale[3]))
        region = _decode_roi(data, scale, bounds)
        if region is None:
            pixels = _decode_scaled(data, scale)
            bounds = _scaled_bounds(plan.box, (width, height), (pixels.shape[1], pixels.shape[0]))
        else:
            pixels, bounds = region  # bounds in the region's own coordinates
    else:
        image = _pillow_rgb(data, max_pixels)
        plan = transform.plan(image.width, image.height, rng)
        left, top, box_w, box_h = plan.box
        pixels = np.asarray(image)
        bounds = _bounds((left, top, left + box_w, top + box_h), image.width, image.height)
    return _crop_resize(
        pixels, bounds, plan.size, flip=plan.flip, antialias=plan.antialias, out=out
    )


def apply_plan(pixels: np.ndarray, plan: CropPlan, *, out: np.ndarray | None = None) -> np.ndarray:
    """Crop, resize and flip decoded ``(H, W, 3)`` pixels as ``plan`` says (a video
    frame: each frame of a clip takes the clip's one plan), as :func:`decode_planned` does
    after its decode."""
    height, width = pixels.shape[:2]
    left, top, box_w, box_h = plan.box
    bounds = _bounds((left, top, left + box_w, top + box_h), width, height)
    return _crop_resize(
        pixels, bounds, plan.size, flip=plan.flip, antialias=plan.antialias, out=out
    )


def _dct_scale(width: int, height: int, need_w: int, need_h: int) -> tuple[int, int, int, int]:
    """``(num, denom, scaled width, scaled height)``: the smallest scale covering the need."""
    if width >= 8 or height >= 8:  # below, a smaller scale could give the same size
        for num, denom in _DCT_SCALES:
            scaled_w, scaled_h = -(-width * num // denom), -(-height * num // denom)
            if scaled_w >= need_w and scaled_h >= need_h:
                return num, denom, scaled_w, scaled_h
    return 1, 1, width, height


def _scaled_bounds(
    box: tuple[float, float, float, float], size: tuple[int, int], scaled: tuple[int, int]
) -> _Bounds:
    """The plan's box, scaled from ``size`` to ``scaled``, to whole pixels."""
    left, top, box_w, box_h = box
    scale_x, scale_y = scaled[0] / size[0], scaled[1] / size[1]
    return _bounds(
        (left * scale_x, top * scale_y, (left + box_w) * scale_x, (top + box_h) * scale_y),
        *scaled,
    )


def _bounds(box: tuple[float, float, float, float], width: int, height: int) -> _Bounds:
    """The box to whole pixels, outwards (at most a pixel more on each side)."""
    left, top, right, bottom = box
    x0, y0 = max(0, int(left)), max(0, int(top))
    x1 = min(width, max(x0 + 1, math.ceil(right - 1e-6)))
    y1 = min(height, max(y0 + 1, math.ceil(bottom - 1e-6)))
    return x0, y0, x1, y1


def _decode_scaled(data: bytes | memoryview, scale: tuple[int, int, int, int]) -> np.ndarray:
    import simplejpeg

    # simplejpeg picks the smallest of its scales whose output is at least this size: ours,
    # as no smaller scale gives the same size (_dct_scale); 1/1 asks for no scaling.
    min_width, min_height = (0, 0) if scale[0] == scale[1] else scale[2:]
    try:
        return simplejpeg.decode_jpeg(  # type: ignore[no-any-return]
            data,  # the fetched buffer itself: simplejpeg reads any buffer, no copy
            colorspace="RGB",
            min_width=min_width,
            min_height=min_height,
            fastdct=True,
            fastupsample=True,
        )
    except ValueError as exc:
        raise ValueError(f"cannot decode JPEG: {exc}") from exc


def _decode_roi(
    data: bytes | memoryview, scale: tuple[int, int, int, int], bounds: _Bounds
) -> tuple[np.ndarray, _Bounds] | None:
    """Only the rows and (iMCU-widened) columns of ``bounds``, with ``bounds`` in them; None
    where the whole-image decoder must answer."""
    decoder = _roi_decoder()
    num, denom, width, height = scale
    x0, y0, x1, y1 = bounds
    # Small images and regions reaching the bottom across most of the width save too little
    # to pay for the region decoder's own setup: measured on 150x150 photos it cost 1.15x a
    # whole decode, on 500x375 ones 0.82x (0.95x where the crop reaches the bottom).
    saves = y1 < _ROI_MAX_BOTTOM * height or x1 - x0 < _ROI_MAX_WIDTH * width
    if decoder is None or width * height < _ROI_MIN_PIXELS or not saves:
        return None
    # A file that does not end in EOI (truncated, or trailing bytes) is decoded whole: the
    # region decode stops at the crop's last row, so it would not see a missing end.
    if bytes(data[-2:]) != b"\xff\xd9":
        return None
    rows = np.empty((y1 - y0, width, 3), dtype=np.uint8)
    try:
        x_offset, region_w = decoder.decode(data, (num, denom), (width, height), bounds, rows)
    except ValueError as exc:
        # Damaged, or a kind the region decoder refuses: the whole-image decoder decodes it
        # or raises its error, so both paths give the same result.
        logger.debug("region decode failed (%s); decoding the whole image", exc)
        return None
    return rows[:, :region_w], (x0 - x_offset, 0, x1 - x_offset, y1 - y0)


#: Scaled pixels below which a JPEG is decoded whole (the region decoder's setup costs more
#: than it saves), and the bottom row and width fractions of a region that save too little.
_ROI_MIN_PIXELS = 256 * 256
_ROI_MAX_BOTTOM = 0.95
_ROI_MAX_WIDTH = 0.8


@functools.cache
def _roi_decoder() -> Any:
    """``stoker._jpegroi`` with Pillow's libjpeg loaded and checked, or None."""
    try:
        jpegroi = importlib.import_module("stoker._jpegroi")  # optional: built where it could be
    except ImportError:
        return None
    path = _pillow_libjpeg()
    if path is None:
        logger.debug("Pillow bundles no libjpeg shared library: JPEGs are decoded whole")
        return None
    try:
        jpegroi.load(path)
        _check_roi(jpegroi)
    except (OSError, ValueError) as exc:
        logger.warning("region JPEG decoding is off (decoding whole images): %s", exc)
        return None
    return jpegroi


def _pillow_libjpeg() -> str | None:
    import PIL

    # Pillow's wheels bundle libjpeg-turbo: pillow.libs/libjpeg-<hash>.so.62.* on Linux,
    # PIL/.dylibs/libjpeg.62.dylib on macOS (a Pillow built against the system's has none).
    package = Path(PIL.__file__).parent
    found = sorted((package.parent / "pillow.libs").glob("libjpeg*.so.62*"))
    found += sorted((package / ".dylibs").glob("libjpeg.62*.dylib"))
    return str(found[0]) if found else None


def _check_roi(decoder: Any) -> None:
    """One small region decode against simplejpeg's, before the extension is trusted."""
    import simplejpeg

    y, x = np.mgrid[0:24, 0:40]
    image = np.stack([x * 6, y * 10, (x + y) * 4], axis=-1).astype(np.uint8)
    data = simplejpeg.encode_jpeg(image, quality=90, colorspace="RGB")
    whole = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True)
    rows = np.empty((12, 40, 3), dtype=np.uint8)
    x_offset, width = decoder.decode(data, (1, 1), (40, 24), (20, 8, 30, 20), rows)
    if not np.array_equal(rows[:, :width], whole[8:20, x_offset : x_offset + width]):
        raise ValueError("its pixels differ from simplejpeg's on a test image")


def _crop_resize(
    pixels: np.ndarray,
    bounds: _Bounds,
    size: tuple[int, int],
    *,
    flip: bool,
    antialias: bool,
    out: np.ndarray | None,
) -> np.ndarray:
    import cv2

    x0, y0, x1, y1 = bounds
    out_h, out_w = size
    shrink = min((x1 - x0) / out_w, (y1 - y0) / out_h)
    area = shrink >= 2 or (antialias and shrink > 1)
    interpolation = cv2.INTER_AREA if area else cv2.INTER_LINEAR
    # Written straight into ``out`` (the batch row) by the last OpenCV call.
    resized = cv2.resize(
        pixels[y0:y1, x0:x1], (out_w, out_h), dst=None if flip else out, interpolation=interpolation
    )
    if flip:
        resized = cv2.flip(resized, 1, dst=out)
    if out is None:
        return resized
    if not np.may_share_memory(resized, out):  # OpenCV could not write there: copy in
        out[...] = resized
    return out


def decode_full(data: bytes | memoryview, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> Any:
    """Decode to a full-size RGB ``PIL.Image`` (for user transforms).

    Args:
        data: Encoded image.
        max_pixels: Refuse larger images (decompression bombs), before decoding.

    Raises:
        ValueError: Undecodable image, or more than ``max_pixels`` pixels.
    """
    if is_jpeg(data):
        import simplejpeg

        _jpeg_size(data, max_pixels)
        try:
            return Image.fromarray(simplejpeg.decode_jpeg(data, colorspace="RGB"))
        except ValueError as exc:
            raise ValueError(f"cannot decode JPEG: {exc}") from exc
    return _pillow_rgb(data, max_pixels)


def _jpeg_size(data: bytes | memoryview, max_pixels: int) -> tuple[int, int]:
    import simplejpeg

    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise ValueError(f"cannot decode JPEG: {exc}") from exc
    _check_pixels(width, height, max_pixels)
    return width, height


def _pillow_rgb(data: bytes | memoryview, max_pixels: int) -> Any:
    # The header's declared size is checked before Pillow sees the bytes, so our limit, not
    # Pillow's global one, decides; then Pillow's lazily read size (TIFF and the rest).
    declared = declared_image_size(data)
    if declared is not None:
        _check_pixels(*declared, max_pixels)
    try:
        with Image.open(io.BytesIO(bytes(data))) as pil:
            _check_pixels(pil.width, pil.height, max_pixels)
            return pil.convert("RGB")
    except _PixelLimitError:
        raise
    except PILLOW_ERRORS as exc:
        raise ValueError(f"cannot decode image: {pillow_problem(data, exc)}") from exc


class _PixelLimitError(ValueError):
    """An image over the pixel limit (kept apart from Pillow's ValueErrors)."""


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise _PixelLimitError(
            f"{width}x{height} image exceeds max_pixels={max_pixels} (decompression bomb?)"
        )
