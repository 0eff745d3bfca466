"""Built-in image transforms that decode only what they need.

A built-in transform plans its crop *before* decoding: given the image's size and a random
generator it returns the source box to keep, the output size and whether to flip. The
decoder then picks the JPEG DCT scale (1/2, 1/4, 1/8) so that the box, scaled, is still at
least the output size — a RandomResizedCrop to 224 of a 4000-pixel photo decodes at 1/8.

Any other callable works too: it receives a decoded ``PIL.Image`` (as torchvision
transforms expect) and may return anything; such samples are decoded at full size.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class CropPlan:
    """What to cut from the source image and what to make of it.

    Attributes:
        box: ``(left, top, width, height)`` in source pixels.
        size: Output ``(height, width)``.
        flip: Mirror horizontally.
        antialias: Average over the source pixels when shrinking (see
            :func:`~stoker.pipeline.decode.decode_planned`), instead of sampling bilinearly.
    """

    box: tuple[float, float, float, float]
    size: tuple[int, int]
    flip: bool = False
    antialias: bool = False


@runtime_checkable
class PlannedTransform(Protocol):
    """A transform that plans its crop from the image size alone."""

    @property
    def output_size(self) -> tuple[int, int] | None:
        """Fixed ``(height, width)`` of every output, or None if it depends on the image."""
        ...

    def plan(self, width: int, height: int, rng: random.Random) -> CropPlan:
        """The crop for an image of ``width`` x ``height``."""
        ...


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    if pair[0] < 1 or pair[1] < 1:
        raise ValueError(f"sizes must be >= 1, got {size}")
    return pair


@dataclass(frozen=True, slots=True)
class RandomResizedCrop:
    """Crop a random area and aspect ratio, resize to ``size`` (as torchvision's).

    Args:
        size: Output side (square) or ``(height, width)``.
        scale: Range of the crop's area as a fraction of the image's.
        ratio: Range of the crop's aspect ratio (width / height), sampled log-uniformly.
        flip: Also mirror horizontally with probability 1/2.
        antialias: Shrink by averaging (OpenCV's area resize, about 4x the cost of the
            default bilinear one). The JPEG decode has already shrunk the image as far as
            the crop allows, so without it what remains is under 2x; larger reductions
            (other formats) are averaged either way.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    antialias: bool = False

    @property
    def output_size(self) -> tuple[int, int]:
        return _pair(self.size)

    def plan(self, width: int, height: int, rng: random.Random) -> CropPlan:
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        flip = self.flip and rng.random() < 0.5
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w = math.sqrt(target * aspect)
            h = math.sqrt(target / aspect)
            if 0 < w <= width and 0 < h <= height:
                left = rng.uniform(0, width - w)
                top = rng.uniform(0, height - h)
                return CropPlan((left, top, w, h), self.output_size, flip, self.antialias)
        # Fallback, as torchvision: a central crop with the ratio clamped into range.
        aspect = width / height
        if aspect < self.ratio[0]:
            w, h = width, width / self.ratio[0]
        elif aspect > self.ratio[1]:
            w, h = height * self.ratio[1], height
        else:
            w, h = width, height
        return CropPlan(
            ((width - w) / 2, (height - h) / 2, w, h), self.output_size, flip, self.antialias
        )


@dataclass(frozen=True, slots=True)
class CenterCrop:
    """Resize so the shorter side is ``resize`` (if given), then cut the central ``size``.

    ``CenterCrop(224, resize=256)`` is the usual evaluation transform. ``antialias``: as
    :class:`RandomResizedCrop`'s.
    """

    size: int | tuple[int, int]
    resize: int | None = None
    antialias: bool = False

    @property
    def output_size(self) -> tuple[int, int]:
        return _pair(self.size)

    def plan(self, width: int, height: int, rng: random.Random) -> CropPlan:
        out_h, out_w = self.output_size
        scale = self.resize / min(width, height) if self.resize else 1.0
        # The crop in source pixels that becomes out_h x out_w after scaling.
        w = min(width, out_w / scale)
        h = min(height, out_h / scale)
        return CropPlan(
            ((width - w) / 2, (height - h) / 2, w, h), (out_h, out_w), antialias=self.antialias
        )


@dataclass(frozen=True, slots=True)
class Resize:
    """Resize to ``size``: an int scales the shorter side (keeping the aspect ratio, so
    outputs differ in size), a ``(height, width)`` pair forces that size. ``antialias``: as
    :class:`RandomResizedCrop`'s."""

    size: int | tuple[int, int]
    flip: bool = False
    antialias: bool = False

    @property
    def output_size(self) -> tuple[int, int] | None:
        return None if isinstance(self.size, int) else _pair(self.size)

    def plan(self, width: int, height: int, rng: random.Random) -> CropPlan:
        flip = self.flip and rng.random() < 0.5
        if isinstance(self.size, int):
            scale = self.size / min(width, height)
            out = (max(1, round(height * scale)), max(1, round(width * scale)))
        else:
            out = _pair(self.size)
        return CropPlan((0.0, 0.0, float(width), float(height)), out, flip, self.antialias)
