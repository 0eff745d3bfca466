"""The baselines of ``loader.py``: the torch DataLoaders' datasets (run in processes of
their own by ``loader_children.py``, and by ``records.py`` and ``torch_epochs.py``) and the
in-RAM rows (no I/O at all, in the harness's process)."""

from __future__ import annotations

import io
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from stoker.pipeline.transforms import PlannedTransform

# boto3, OpenCV, simplejpeg and stoker's decoder are imported where they are used: a
# baseline's child process imports this module, and its clock counts only what it uses.

BATCH = 256


def pil_transform(data: bytes, rng: random.Random, transform: PlannedTransform) -> np.ndarray:
    """What a torchvision pipeline does: full PIL decode, then crop, resize, flip."""
    with Image.open(io.BytesIO(data)) as image:
        rgb = image.convert("RGB")
    plan = transform.plan(rgb.width, rgb.height, rng)
    left, top, w, h = plan.box
    out = rgb.resize(plan.size[::-1], Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if plan.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.array(out)  # writable, as torch's collate wants


def boto(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    from stoker.testing.seaweed import ACCESS_KEY, REGION, SECRET_KEY

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=4),
    )


class PerObject(Dataset[tuple[np.ndarray, int]]):
    """One boto3 GET per sample."""

    def __init__(
        self, endpoint: str, bucket: str, keys: list[str], transform: PlannedTransform
    ) -> None:
        self.endpoint, self.bucket, self.keys = endpoint, bucket, keys
        self.client: Any = None
        self.transform = transform

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        if self.client is None:
            self.client = boto(self.endpoint)
        body = self.client.get_object(Bucket=self.bucket, Key=self.keys[i])["Body"].read()
        label = int(self.keys[i].split("class_")[1][:3])
        return pil_transform(body, random.Random(i), self.transform), label


class LocalFiles(Dataset[tuple[np.ndarray, int]]):
    """ImageFolder's work, reproduced: read a local file, PIL decode, crop, resize."""

    def __init__(self, paths: list[Path], transform: PlannedTransform) -> None:
        self.paths, self.transform = paths, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return pil_transform(self.paths[i].read_bytes(), random.Random(i), self.transform), 0


class WdsMap:
    """WebDataset's per-sample work: the same PIL decode and transform."""

    def __init__(self, transform: PlannedTransform) -> None:
        self.transform = transform

    def __call__(self, sample: dict[str, Any]) -> tuple[np.ndarray, int]:
        rng = random.Random(sample["__key__"])
        return pil_transform(sample["jpg"], rng, self.transform), 0


def time_loader(loader: Any, limit: int) -> dict[str, float]:
    """Iterate ``loader`` to ``limit`` samples (or its end): images, the loop's seconds
    and rate (from ``iter()``), and the first and last batch's ``time.time()``."""
    started = time.perf_counter()
    first_at, seen = 0.0, 0
    for batch in loader:
        if not seen:
            first_at = time.time()
        seen += len(batch[0]) if isinstance(batch, list | tuple) else len(batch)
        if seen >= limit:
            break
    ended_at = time.time()
    seconds = time.perf_counter() - started
    return {
        "images": seen,
        "seconds": seconds,
        "images_per_s": seen / seconds,
        "first_batch_at": first_at,
        "ended_at": ended_at,
    }


def _full_decode(data: bytes, transform: PlannedTransform, rng: random.Random, out: Any) -> None:
    """A whole-image decode (no DCT scaling, no region), then OpenCV's bilinear resize."""
    import cv2
    import simplejpeg

    pixels = simplejpeg.decode_jpeg(data, colorspace="RGB")
    plan = transform.plan(pixels.shape[1], pixels.shape[0], rng)
    left, top, w, h = plan.box
    x0, y0 = int(left), int(top)
    x1, y1 = max(x0 + 1, round(left + w)), max(y0 + 1, round(top + h))
    resized = cv2.resize(pixels[y0:y1, x0:x1], plan.size[::-1], interpolation=cv2.INTER_LINEAR)
    out[...] = cv2.flip(resized, 1) if plan.flip else resized


def in_ram_rate(
    paths: list[Path], count: int, threads: int, transform: PlannedTransform, *, full: bool
) -> dict[str, float]:
    """Images/s of decode + transform of bytes already in RAM, on ``threads`` threads:
    ``full``: simplejpeg's whole-image decode + OpenCV resize; else stoker's own
    ``decode_planned`` (DCT scaling)."""
    from stoker.pipeline.decode import decode_planned

    data = [p.read_bytes() for p in paths[:count]]
    out = np.empty((BATCH, 224, 224, 3), dtype=np.uint8)

    def work(i: int) -> None:
        if full:
            _full_decode(data[i], transform, random.Random(i), out[i % BATCH])
        else:
            decode_planned(data[i], transform, random.Random(i), out=out[i % BATCH])

    started, cpu_started = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(len(data))))
    seconds = time.perf_counter() - started
    return {
        "images": len(data),
        "seconds": seconds,
        "cpu_s": time.process_time() - cpu_started,
        "images_per_s": len(data) / seconds,
    }
