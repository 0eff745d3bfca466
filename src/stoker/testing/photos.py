"""Realistic image sets made from real photographs that registry packages ship.

Sources: the colour photographs inside the scikit-image wheel (``pip install
scikit-image``) and, when installed, Debian's ``mate-backgrounds`` photographs
(``apt-get install mate-backgrounds``). Each output image is a random crop of a random
source, resized, maybe mirrored, and JPEG-encoded, so sizes and content vary like a real
dataset rather than like noise.
"""

from __future__ import annotations

import importlib
import io
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

_SKIMAGE_PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "rocket.jpg",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "grass.png",
    "gravel.png",
    "brick.png",
    "color.png",
    "ihc.png",
)
_MATE = Path("/usr/share/backgrounds/mate")


def source_photos(*, max_side: int = 2048) -> list[Image.Image]:
    """The available source photographs, as RGB images (downscaled to ``max_side``).

    Raises:
        ImportError: scikit-image is not installed and no Debian photographs exist.
    """
    paths: list[Path] = []
    try:
        # Optional (pip install scikit-image): only its bundled photographs are used.
        skimage = importlib.import_module("skimage")
        data = Path(str(skimage.__file__)).parent / "data"
        paths += [data / name for name in _SKIMAGE_PHOTOS if (data / name).is_file()]
    except ImportError:
        pass
    if _MATE.is_dir():
        paths += sorted((_MATE / "nature").glob("*.jpg"))
        paths += sorted((_MATE / "abstract").glob("Elephants*.jpg"))
    if not paths:
        raise ImportError(
            "no source photographs: pip install scikit-image "
            "(and apt-get install mate-backgrounds for more)"
        )
    photos = []
    for path in paths:
        with Image.open(path) as image:
            photo = image.convert("RGB")
        photo.thumbnail((max_side, max_side))
        photos.append(photo)
    return photos


def make_photo(
    photos: list[Image.Image],
    rng: random.Random,
    *,
    width: int,
    height: int,
    quality: int = 90,
    grain: float = 0.0,
) -> bytes:
    """One JPEG: a random crop (10-100% of the area) of a random photo, at ``width x height``.

    ``grain`` adds camera-like sensor noise of that standard deviation (in 0-255 levels):
    the wallpaper-grade sources are smoother than everyday photos, whose JPEGs are larger.
    """
    photo = rng.choice(photos)
    aspect = width / height
    area = photo.width * photo.height * rng.uniform(0.1, 1.0)
    crop_w = min(photo.width, int((area * aspect) ** 0.5))
    crop_h = min(photo.height, int(crop_w / aspect))
    left = rng.randint(0, photo.width - crop_w)
    top = rng.randint(0, photo.height - crop_h)
    image = photo.resize(
        (width, height), Image.Resampling.BILINEAR, box=(left, top, left + crop_w, top + crop_h)
    )
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if grain > 0:
        noise = np.random.default_rng(rng.getrandbits(64)).normal(0, grain, (height, width, 3))
        pixels = np.asarray(image, dtype=np.float32) + noise.astype(np.float32)
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def write_photo_folder(
    root: Path,
    *,
    files: int,
    width: int,
    height: int,
    classes: int = 100,
    quality: int = 90,
    grain: float = 0.0,
    seed: int = 0,
    threads: int = 4,
) -> list[Path]:
    """Write ``files`` JPEGs into ``root/class_XXX/photo_XXXXXXX.jpg``; returns their paths."""
    photos = source_photos(max_side=4096)

    def one(i: int) -> Path:
        rng = random.Random(seed * 1_000_003 + i)
        path = root / f"class_{i % classes:03d}" / f"photo_{i:07d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = make_photo(photos, rng, width=width, height=height, quality=quality, grain=grain)
        path.write_bytes(data)
        return path

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(files)))
