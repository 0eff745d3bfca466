"""The methods of ``ray_read.py``, each in a process of its own with a local Ray cluster of
its own (``harness.py``).

    python benchmarks/ray_read_children.py METHOD URL_OR_PATH OPTIONS_JSON PHOTOS

The child starts Ray (all of this machine's cores), has every worker import what the
methods' tasks import (one untimed task per CPU: the cluster's worker processes would
otherwise pay for it in the first read), then makes the dataset and consumes it with
``iter_batches(batch_size=256)``. Every method's clock starts at the call that makes the
dataset (``made_at``), the common start point after Ray has started; the process's start
is recorded too. It prints one JSON line: images (``units``), ``made_at``,
``first_batch_at`` and ``ended_at`` (``time.time()``).

Methods (``RandomResizedCrop(224, flip=True)``, its crop boxes by stoker's planner):

- ``stoker``: ``read_dataset`` on its defaults (read tasks fused with the decoding);
- ``stoker_split``: ``read_dataset(read_num_cpus=0.25)``, reads as tasks of their own;
- ``read_images`` / ``read_webdataset``: Ray's readers on their defaults, then
  ``map_batches`` cropping and resizing with OpenCV;
- ``read_images_tuned`` / ``read_webdataset_tuned``: the same with the read tuning Ray
  Data's performance guide recommends for I/O-bound reads ("Tuning read resources":
  ``ray_remote_args={"num_cpus": 0.25}``, up to four read tasks per CPU), as
  ``stoker_split`` gets its own.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()

import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import emit, peak_rss_mb  # noqa: E402

BATCH = 256
#: Ray Data's performance guide, "Tuning read resources", for I/O-bound reads.
TUNED_READ = {"num_cpus": 0.25}


class Crop:
    """The baselines' transform: a crop box from stoker's planner on the decoded image,
    OpenCV's bilinear resize to its size, the flip; ``column`` holds the images."""

    def __init__(self, transform: Any, column: str) -> None:
        self.transform, self.column = transform, column

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import cv2
        import numpy as np

        images = batch[self.column]
        out = np.empty((len(images), 224, 224, 3), dtype=np.uint8)
        for n, pixels in enumerate(images):
            plan = self.transform.plan(pixels.shape[1], pixels.shape[0], random.Random())
            left, top, w, h = plan.box
            x0, y0 = int(left), int(top)
            x1, y1 = max(x0 + 1, round(left + w)), max(y0 + 1, round(top + h))
            resized = cv2.resize(
                np.ascontiguousarray(pixels[y0:y1, x0:x1, :3]),
                plan.size[::-1],
                interpolation=cv2.INTER_LINEAR,
            )
            out[n] = cv2.flip(resized, 1) if plan.flip else resized
        return {"image": out}


def _imported(batch: dict[str, Any]) -> dict[str, Any]:
    import cv2  # noqa: F401
    import PIL.Image  # noqa: F401  (imported for its cost, in the worker)

    import stoker.integrations.ray  # noqa: F401

    return batch


def make(method: str, where: str, options: dict[str, Any]) -> Any:
    """The method's dataset."""
    import ray.data
    from pyarrow import fs

    from stoker.integrations.ray import read_dataset
    from stoker.pipeline.transforms import RandomResizedCrop

    transform = RandomResizedCrop(224, flip=True)
    if method == "stoker":
        return read_dataset(where, transform=transform, storage_options=options)
    if method == "stoker_split":
        return read_dataset(where, transform=transform, storage_options=options, read_num_cpus=0.25)
    filesystem = fs.S3FileSystem(
        access_key=options["access_key_id"],
        secret_key=options["secret_access_key"],
        region=options["region"],
        endpoint_override=options["endpoint_url"],
        scheme="http",
    )
    tuned = {"ray_remote_args": TUNED_READ} if method.endswith("_tuned") else {}
    if method.startswith("read_images"):
        dataset = ray.data.read_images(where, filesystem=filesystem, mode="RGB", **tuned)
        return dataset.map_batches(Crop(transform, "image"), batch_size=64)
    dataset = ray.data.read_webdataset(where, filesystem=filesystem, **tuned)
    return dataset.map_batches(Crop(transform, "jpg"), batch_size=64)


def run(method: str, where: str, options: dict[str, Any], photos: int) -> dict[str, Any]:
    import ray
    import ray.data

    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        ray.data.range(cpus * 4, override_num_blocks=cpus * 4).map_batches(_imported).take_all()
        made_at = time.time()
        dataset = make(method, where, options)
        first_at, images = 0.0, 0
        for batch in dataset.iter_batches(batch_size=BATCH, batch_format="numpy"):
            if not images:
                first_at = time.time()
            if batch["image"].shape[1:] != (224, 224, 3):
                raise RuntimeError(f"a batch of shape {batch['image'].shape}")
            images += len(batch["image"])
        ended_at = time.time()
    finally:
        ray.shutdown()
    if images != photos:
        raise RuntimeError(f"an epoch of {images} images, not {photos}")
    return {
        "images": images,
        "units": images,
        "seconds": ended_at - made_at,
        "images_per_s": images / (ended_at - made_at),
        "started_at": STARTED_AT,
        "made_at": made_at,
        "first_batch_at": first_at,
        "ended_at": ended_at,
        "ray": ray.__version__,
        "peak_rss_mb": peak_rss_mb(),
    }


def main(argv: list[str]) -> int:
    emit(run(argv[0], argv[1], json.loads(argv[2]), int(argv[3])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
