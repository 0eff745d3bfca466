"""Decoding image bytes into arrays, at the smallest JPEG scale the crop allows.

Both decoders refuse decompression bombs before any pixel is decoded: the size the image's
header declares is checked against ``max_pixels`` (default :data:`DEFAULT_MAX_PIXELS`), so a
small file claiming 65,535 x 65,535 pixels costs microseconds, not gigabytes. Every failure
to decode is a :class:`ValueError` saying what is wrong, which the loader skips or raises
as its ``on_error`` says.
"""

from __future__ import annotations

import io
import math
import random
from typing import Any

import numpy as np
from PIL import Image

from stoker.format import spec
from stoker.format.imaging import PILLOW_ERRORS
from stoker.format.spec import declared_image_size
from stoker.pipeline.transforms import PlannedTransform

#: Default ``max_pixels``: images with more pixels are refused before decoding.
DEFAULT_MAX_PIXELS = spec.DEFAULT_MAX_PIXELS


def is_jpeg(data: bytes | memoryview) -> bool:
    """JPEG magic bytes."""
    return bytes(data[:3]) == b"\xff\xd8\xff"


def decode_planned(
    data: bytes | memoryview,
    transform: PlannedTransform,
    rng: random.Random,
    *,
    out: np.ndarray | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Decode and transform one image into an ``(H, W, 3)`` uint8 array.

    JPEGs are decoded by libjpeg-turbo (simplejpeg) at the smallest DCT scale whose output
    still covers the crop at the target resolution; other formats go through Pillow. The
    crop is then resized by OpenCV (the GIL released), bilinearly; with the plan's
    ``antialias``, or when it shrinks by 2x or more (the DCT scale leaves less than that for
    a JPEG), by averaging the source pixels (``INTER_AREA``). Pillow's antialiased bilinear
    resize, used before, cost as much as the decode; the pixels differ from it by about 3
    levels of 255 on average.

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
        import simplejpeg

        width, height = _jpeg_size(data, max_pixels)
        plan = transform.plan(width, height, rng)
        left, top, box_w, box_h = plan.box
        out_h, out_w = plan.size
        need_w = math.ceil(width * out_w / box_w) if box_w else width
        need_h = math.ceil(height * out_h / box_h) if box_h else height
        try:
            decoded = simplejpeg.decode_jpeg(
                data,  # the fetched buffer itself: simplejpeg reads any buffer, no copy
                colorspace="RGB",
                min_width=min(need_w, width),
                min_height=min(need_h, height),
                fastdct=True,
                fastupsample=True,
            )
        except ValueError as exc:
            raise ValueError(f"cannot decode JPEG: {exc}") from exc
        scale_x = decoded.shape[1] / width
        scale_y = decoded.shape[0] / height
        pixels = decoded
        box = (left * scale_x, top * scale_y, (left + box_w) * scale_x, (top + box_h) * scale_y)
    else:
        image = _pillow_rgb(data, max_pixels)
        plan = transform.plan(image.width, image.height, rng)
        left, top, box_w, box_h = plan.box
        pixels = np.asarray(image)
        box = (left, top, left + box_w, top + box_h)
    return _crop_resize(pixels, box, plan.size, flip=plan.flip, antialias=plan.antialias, out=out)


def _crop_resize(
    pixels: np.ndarray,
    box: tuple[float, float, float, float],
    size: tuple[int, int],
    *,
    flip: bool,
    antialias: bool,
    out: np.ndarray | None,
) -> np.ndarray:
    import cv2

    # The box to whole pixels, outwards (at most a pixel more on each side).
    left, top, right, bottom = box
    x0, y0 = max(0, int(left)), max(0, int(top))
    x1 = min(pixels.shape[1], max(x0 + 1, math.ceil(right - 1e-6)))
    y1 = min(pixels.shape[0], max(y0 + 1, math.ceil(bottom - 1e-6)))
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
        raise ValueError(f"cannot decode image: {exc}") from exc


class _PixelLimitError(ValueError):
    """An image over the pixel limit (kept apart from Pillow's ValueErrors)."""


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise _PixelLimitError(
            f"{width}x{height} image exceeds max_pixels={max_pixels} (decompression bomb?)"
        )
