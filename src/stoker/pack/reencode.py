"""Checking, resizing and re-encoding images while packing."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from PIL import Image

from stoker.errors import SourceError
from stoker.format import spec
from stoker.format.imaging import PILLOW_ERRORS, pillow_problem
from stoker.format.spec import declared_image_size
from stoker.pack.imagecheck import check_jpeg_decodes, check_png_decodes, jpeg_size, png_size

#: Default ``ImagePolicy.max_pixels`` (Pillow's warning threshold, about 9,459 x 9,459).
DEFAULT_MAX_PIXELS = spec.DEFAULT_MAX_PIXELS


@dataclass(frozen=True, slots=True, kw_only=True)
class ImagePolicy:
    """What to do with each image while packing.

    Attributes:
        resize_shorter: Scale so the shorter side is this many pixels (never enlarges).
        max_side: Scale so the longer side is at most this many pixels.
        quality: Re-encode as JPEG at this quality; with a resize and no quality, 90.
        max_pixels: Refuse images with more pixels than this (decompression bombs); the
            size the image's header declares is checked before anything is decoded.
        check: Check every image's structure (markers, end of file, size) even when its
            bytes are kept, so that an undecodable or truncated file is caught at pack time
            rather than in training.
    """

    resize_shorter: int | None = None
    max_side: int | None = None
    quality: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    check: bool = True

    def __post_init__(self) -> None:
        if self.resize_shorter is not None and self.max_side is not None:
            raise ValueError("give resize_shorter or max_side, not both")
        for name in ("resize_shorter", "max_side"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.quality is not None and not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1, got {self.max_pixels}")

    @property
    def rewrites(self) -> bool:
        """Whether images are re-encoded (rather than kept byte for byte)."""
        return bool(self.resize_shorter or self.max_side or self.quality)


def _target_size(width: int, height: int, policy: ImagePolicy) -> tuple[int, int]:
    if policy.resize_shorter:
        scale = policy.resize_shorter / min(width, height)
    elif policy.max_side:
        scale = policy.max_side / max(width, height)
    else:
        return width, height
    if scale >= 1:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def _check_pixels(width: int, height: int, policy: ImagePolicy, where: str) -> None:
    if width * height > policy.max_pixels:
        raise SourceError(
            f"{where}: {width}x{height} image exceeds max_pixels={policy.max_pixels} "
            "(possible decompression bomb)"
        )


def process_image(data: bytes, ext: str, policy: ImagePolicy, *, where: str) -> tuple[str, bytes]:
    """Check (and if asked, resize and re-encode) one image; returns ``(ext, bytes)``.

    A JPEG is decoded by libjpeg-turbo in strict mode, as the Loader decodes it, so a file
    training would refuse (a truncated scan with its end marker put back among them) is
    refused here rather than packed, or re-encoded with grey where its data stopped.

    Raises:
        SourceError: The image cannot be decoded or is larger than ``max_pixels``.
    """
    if not policy.check and not policy.rewrites:
        return ext, data
    try:
        if ext == "jpg":
            width, height = jpeg_size(data)
            _check_pixels(width, height, policy, where)
            if not policy.rewrites:
                check_jpeg_decodes(data)
                return ext, data
            # One strict decode, at the smallest DCT scale that still covers the target.
            target = _target_size(width, height, policy)
            pixels = _strict_jpeg(data, target)
            return "jpg", _encode(Image.fromarray(pixels), target, policy)
        if ext == "png" and not policy.rewrites:
            width, height = png_size(data)
            _check_pixels(width, height, policy, where)
            check_png_decodes(data)
            return ext, data
    except ValueError as exc:  # SourceError (the pixel limit) is not one: it passes
        raise SourceError(f"{where}: cannot decode image: {pillow_problem(data, exc)}") from exc
    declared = declared_image_size(data)
    if declared is not None:  # before Pillow, so that our limit decides, not Pillow's
        _check_pixels(*declared, policy, where)
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            _check_pixels(width, height, policy, where)
            if not policy.rewrites:
                image.verify()
                return ext, data
            target = _target_size(width, height, policy)
            image.draft("RGB", target)
            return "jpg", _encode(image.convert("RGB"), target, policy)
    except SourceError:
        raise
    except PILLOW_ERRORS as exc:
        raise SourceError(f"{where}: cannot decode image: {pillow_problem(data, exc)}") from exc


def _strict_jpeg(data: bytes, target: tuple[int, int]) -> Any:
    import simplejpeg

    try:
        return simplejpeg.decode_jpeg(
            data, colorspace="RGB", min_width=target[0], min_height=target[1], strict=True
        )
    except ValueError as exc:
        raise ValueError(f"the JPEG decoder refuses it: {exc}") from None


def _encode(rgb: Image.Image, target: tuple[int, int], policy: ImagePolicy) -> bytes:
    if rgb.size != target:
        rgb = rgb.resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=policy.quality or 90)
    return out.getvalue()
