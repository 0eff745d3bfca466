"""Decoding image bytes into arrays, at the smallest JPEG scale the crop allows."""

from __future__ import annotations

import io
import math
import random
from typing import Any

import numpy as np
from PIL import Image

from stoker.pipeline.transforms import PlannedTransform

DEFAULT_MAX_PIXELS = 89_478_485


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
    still covers the crop at the target resolution; other formats go through Pillow.

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

        height, width, _, _ = simplejpeg.decode_jpeg_header(bytes(data))
        _check_pixels(width, height, max_pixels)
        plan = transform.plan(width, height, rng)
        left, top, box_w, box_h = plan.box
        out_h, out_w = plan.size
        need_w = math.ceil(width * out_w / box_w) if box_w else width
        need_h = math.ceil(height * out_h / box_h) if box_h else height
        decoded = simplejpeg.decode_jpeg(
            bytes(data),
            colorspace="RGB",
            min_width=min(need_w, width),
            min_height=min(need_h, height),
            fastdct=True,
            fastupsample=True,
        )
        scale_x = decoded.shape[1] / width
        scale_y = decoded.shape[0] / height
        image = Image.fromarray(decoded)
        box = (left * scale_x, top * scale_y, (left + box_w) * scale_x, (top + box_h) * scale_y)
    else:
        try:
            pil = Image.open(io.BytesIO(bytes(data)))
            _check_pixels(pil.width, pil.height, max_pixels)
            image = pil.convert("RGB")
        except (OSError, SyntaxError, Image.DecompressionBombError) as exc:
            raise ValueError(f"cannot decode image: {exc}") from exc
        plan = transform.plan(image.width, image.height, rng)
        left, top, box_w, box_h = plan.box
        out_h, out_w = plan.size
        box = (left, top, left + box_w, top + box_h)
    resized = np.asarray(image.resize((out_w, out_h), Image.Resampling.BILINEAR, box=box))
    if plan.flip:
        resized = resized[:, ::-1]
    if out is not None:
        out[...] = resized
        return out
    return np.ascontiguousarray(resized)


def decode_full(data: bytes | memoryview, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> Any:
    """Decode to a full-size RGB ``PIL.Image`` (for user transforms)."""
    if is_jpeg(data):
        import simplejpeg

        height, width, _, _ = simplejpeg.decode_jpeg_header(bytes(data))
        _check_pixels(width, height, max_pixels)
        return Image.fromarray(simplejpeg.decode_jpeg(bytes(data), colorspace="RGB"))
    try:
        pil = Image.open(io.BytesIO(bytes(data)))
        _check_pixels(pil.width, pil.height, max_pixels)
        return pil.convert("RGB")
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ValueError(f"cannot decode image: {exc}") from exc


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise ValueError(
            f"{width}x{height} image exceeds max_pixels={max_pixels} (decompression bomb?)"
        )
