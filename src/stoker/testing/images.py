"""Generate small JPEG image folders (class per directory) for tests, benchmarks and the demo."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from stoker.pack.packer import PackConfig, pack


def make_jpeg(rng: np.random.Generator, *, width: int, height: int, quality: int = 85) -> bytes:
    """Encode a random smooth image with some texture as JPEG bytes."""
    ys = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    xs = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    base = rng.uniform(0, 255, size=(1, 1, 3)).astype(np.float32)
    slope = rng.uniform(-120, 120, size=(2, 1, 1, 3)).astype(np.float32)
    image = base + slope[0] * ys + slope[1] * xs
    image += rng.normal(0, 18, size=(height, width, 3)).astype(np.float32)
    pixels = np.clip(image, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


def write_image_folder(
    root: Path,
    *,
    files: int,
    classes: int = 10,
    width: int = 160,
    height: int = 120,
    seed: int = 0,
) -> list[Path]:
    """Write ``files`` JPEGs into ``root/class_XX/img_XXXXXX.jpg`` and return their paths.

    Images are cycled over a small pool of encodings, so thousands of files cost little time
    to make; each file still has distinct bytes (a JPEG comment carries its index).
    """
    rng = np.random.default_rng(seed)
    pool = [make_jpeg(rng, width=width, height=height) for _ in range(min(files, 256))]
    paths = []
    for i in range(files):
        folder = root / f"class_{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img_{i:06d}.jpg"
        path.write_bytes(with_comment(pool[i % len(pool)], f"stoker sample {i}".encode()))
        paths.append(path)
    return paths


def write_packed_images(
    root: Path,
    *,
    files: int,
    classes: int = 10,
    width: int = 160,
    height: int = 120,
    samples_per_shard: int | None = None,
) -> str:
    """Write an image folder into ``root/src`` (as :func:`write_image_folder`) and pack it
    into ``root/ds`` (``samples_per_shard`` a shard, else pack's default); return the
    packed dataset's path, the fixture most loader tests start from."""
    write_image_folder(root / "src", files=files, classes=classes, width=width, height=height)
    config = (
        PackConfig()
        if samples_per_shard is None
        else PackConfig(samples_per_shard=samples_per_shard)
    )
    pack(root / "src", root / "ds", config=config)
    return str(root / "ds")


def with_comment(jpeg: bytes, text: bytes) -> bytes:
    """Insert a COM segment right after the SOI marker (the image itself is unchanged)."""
    if jpeg[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG: no SOI marker")
    segment = b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text
    return jpeg[:2] + segment + jpeg[2:]
