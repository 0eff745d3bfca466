"""Ray Data over a bucket of photos: stoker's read_dataset against Ray's own readers.

Issue 26's benchmark. The photos of ``loader.py``'s set a (500x375, ~100 kB, made from
scikit-image's sample photos) sit in SeaweedFS behind the 20 ms / 1 Gbit/s proxy three
ways: as the folder itself (class folders of JPEGs), packed by ``stoker.pack`` (32 MB
shards, seeded random order) and as WebDataset tars of about the same size written by
``webdataset.TarWriter`` (``jpg`` and ``cls`` members). On one local Ray cluster (all of
this machine's cores), every method reads one epoch through the proxy, cold, and makes
batches of 256 images of 224x224 uint8 with the same transform, a
``RandomResizedCrop(224, flip=True)`` (its crop boxes drawn by stoker's own planner):

- stoker: ``stoker.integrations.ray.read_dataset`` over the packed shards on its defaults
  (read tasks of 2 read groups each, fused with their ``map_batches`` decoding, at the
  smallest JPEG scale the crop needs); and the same with ``read_num_cpus=0.25``, reads as
  tasks of their own beside the decoding;
- ``ray.data.read_images``: the unpacked folder through ``pyarrow.fs.S3FileSystem`` (one
  listing, then a GET per photo; Ray decodes each whole with PIL), then ``map_batches``
  cropping and resizing with OpenCV (bilinear);
- ``ray.data.read_webdataset``: the tars through the same file system (Ray's default
  decoder: PIL, whole image), then the same ``map_batches``.

Before the first round, one task per CPU imports what the methods' workers import (Ray
starts a worker process per CPU with the cluster; the first tasks would otherwise pay for
the imports). Each method is consumed by ``iter_batches(batch_size=256)`` on the driver;
images/s run from the call that makes the dataset (listing and planning included) to the
last batch; first batch from the same start. Requests and bytes are the proxy's own counts
for the epoch, against the bytes of the objects the method reads. Every method runs
``--repeats`` times, interleaved (reversed every other round); the table shows medians.

    pip install -e '.[bench,ray]'
    python benchmarks/ray_read.py            # 5,000 photos, 2 rounds
    python benchmarks/ray_read.py --quick    # 1,000 photos, one round: a smoke run

Writes benchmarks/out/ray_read.json and benchmarks/out/ray_read.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cv2
import numpy as np
import ray
import ray.data
import webdataset as wds
from pyarrow import fs

from loader import median_of
from loader_sets import BATCH, BUCKET, OUT, SHARD_BYTES, TRANSFORMS, Prepared, prepare_set
from stoker.integrations.ray import read_dataset
from stoker.pipeline.transforms import PlannedTransform
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, upload
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer

METHODS = ("stoker", "stoker_split", "read_images", "read_webdataset")
LABELS = {
    "stoker": "stoker read_dataset, packed shards",
    "stoker_split": "stoker read_dataset, read_num_cpus=0.25",
    "read_images": "ray.data.read_images, unpacked folder",
    "read_webdataset": "ray.data.read_webdataset, WebDataset tars",
}


class Crop:
    """The baselines' transform: a crop box from stoker's planner on the decoded image,
    OpenCV's bilinear resize to its size, the flip; ``column`` holds the images."""

    def __init__(self, transform: PlannedTransform, column: str) -> None:
        self.transform, self.column = transform, column

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
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


def _wds_tars(prep: Prepared) -> Path:
    """The set's photos as WebDataset tars of about SHARD_BYTES (written once, kept)."""
    dest = OUT / "data" / f"{prep.key}-wds"
    marker = dest / f".complete-{prep.files}"
    if not marker.exists():
        dest.mkdir(parents=True, exist_ok=True)
        classes = sorted({p.parent.name for p in prep.paths})
        shard, written = 0, 0
        sink = wds.TarWriter(str(dest / f"photos-{shard:06d}.tar"))
        for path in prep.paths:
            if written >= SHARD_BYTES:
                sink.close()
                shard, written = shard + 1, 0
                sink = wds.TarWriter(str(dest / f"photos-{shard:06d}.tar"))
            key = path.relative_to(prep.source).with_suffix("").as_posix().replace(".", "_")
            record = {
                "__key__": key,
                "jpg": path.read_bytes(),
                "cls": classes.index(path.parent.name),
            }
            written += sink.write(record)
        sink.close()
        marker.touch()
    return dest


class Bench:
    """The methods, against one server and proxy."""

    def __init__(self, server: SeaweedServer, proxy: NetProxy, prep: Prepared) -> None:
        self.server, self.proxy, self.prep = server, proxy, prep
        self.transform = TRANSFORMS["crop"]
        self.filesystem = fs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=proxy.endpoint,
            scheme="http",
        )
        local = _wds_tars(prep)
        upload(
            local,
            open_store(f"s3://{BUCKET}/{prep.key}/wds", storage_options=server.storage_options()),
            config=TransferConfig(workers=16, include=("*.tar",)),
        )
        self.wds_bytes = sum(p.stat().st_size for p in local.glob("*.tar"))

    def timed(self, make: Any, data_bytes: int) -> dict[str, Any]:
        """Make the dataset and iterate it in batches; what the proxy saw meanwhile."""
        before = self.proxy.stats()
        started = time.perf_counter()
        dataset = make()
        first, images = 0.0, 0
        for batch in dataset.iter_batches(batch_size=BATCH, batch_format="numpy"):
            if not images:
                first = time.perf_counter() - started
            if batch["image"].shape[1:] != (224, 224, 3):
                raise RuntimeError(f"a batch of shape {batch['image'].shape}")
            images += len(batch["image"])
        seconds = time.perf_counter() - started
        after = self.proxy.stats()
        if images != self.prep.files:
            raise RuntimeError(f"an epoch of {images} images, not {self.prep.files}")
        return {
            "images": images,
            "seconds": seconds,
            "images_per_s": images / seconds,
            "first_batch_s": first,
            "requests_per_epoch": after.requests - before.requests,
            "bytes_per_epoch": after.bytes_down - before.bytes_down,
            "data_bytes": data_bytes,
        }

    def stoker(self) -> dict[str, Any]:
        url = f"s3://{BUCKET}/{self.prep.key}/shards"
        options = self.server.storage_options(self.proxy.endpoint)
        return self.timed(
            lambda: read_dataset(url, transform=self.transform, storage_options=options),
            self.prep.shard_bytes,
        )

    def stoker_split(self) -> dict[str, Any]:
        url = f"s3://{BUCKET}/{self.prep.key}/shards"
        options = self.server.storage_options(self.proxy.endpoint)
        return self.timed(
            lambda: read_dataset(
                url, transform=self.transform, storage_options=options, read_num_cpus=0.25
            ),
            self.prep.shard_bytes,
        )

    def read_images(self) -> dict[str, Any]:
        path = f"{BUCKET}/{self.prep.key}/raw"
        return self.timed(
            lambda: ray.data.read_images(path, filesystem=self.filesystem, mode="RGB").map_batches(
                Crop(self.transform, "image"), batch_size=64
            ),
            self.prep.raw_bytes,
        )

    def read_webdataset(self) -> dict[str, Any]:
        path = f"{BUCKET}/{self.prep.key}/wds"
        return self.timed(
            lambda: ray.data.read_webdataset(path, filesystem=self.filesystem).map_batches(
                Crop(self.transform, "jpg"), batch_size=64
            ),
            self.wds_bytes,
        )


def _imported(batch: dict[str, Any]) -> dict[str, Any]:
    import PIL.Image  # noqa: F401  (imported for its cost, in the worker)

    import stoker.integrations.ray  # noqa: F401

    return batch


def warm_up() -> None:
    """Have each of the cluster's worker processes import what the methods use."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    ray.data.range(cpus * 4, override_num_blocks=cpus * 4).map_batches(_imported).take_all()


def run_rounds(bench: Bench, repeats: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    for round_ in range(repeats):
        for method in METHODS if round_ % 2 == 0 else METHODS[::-1]:
            result = getattr(bench, method)()
            runs[method].append(result)
            print(
                f"round {round_ + 1}: {method} {result['images_per_s']:,.0f} images/s", flush=True
            )
    merged = {}
    for method, method_runs in runs.items():
        merged[method] = median_of(method_runs)
        merged[method]["each_round"] = [r["images_per_s"] for r in method_runs]
    return merged


def report(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The markdown table and the acceptance check."""
    methods = results["methods"]
    best = max(methods["read_images"]["images_per_s"], methods["read_webdataset"]["images_per_s"])
    lines = [
        f"{results['photos']:,} photos of 500x375 (mean {results['mean_kb']:.0f} kB), "
        f"RandomResizedCrop(224) + flip, batches of {BATCH}; local Ray cluster of "
        f"{results['machine']['cpus']} CPUs; through the {args.rtt_ms:g} ms / {args.gbit:g} "
        f"Gbit/s proxy; median of {args.repeats} round(s).",
        "",
        "| method | images/s | x faster baseline | first batch s | requests/epoch "
        "| MB/epoch | of the data's bytes |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method in METHODS:
        r = methods[method]
        lines.append(
            f"| {LABELS[method]} | {r['images_per_s']:,.0f} | {r['images_per_s'] / best:.2f}x "
            f"| {r['first_batch_s']:.2f} | {r['requests_per_epoch']:,.0f} "
            f"| {r['bytes_per_epoch'] / 1e6:,.0f} | {r['bytes_per_epoch'] / r['data_bytes']:.3f}x |"
        )
    ratio = methods["stoker"]["images_per_s"] / best
    checks = {"stoker_over_faster_baseline": ratio, "goal": 2.0, "met": ratio >= 2.0}
    lines += [
        "",
        f"Goal (issue 26): read_dataset >= 2x the faster of read_images and read_webdataset: "
        f"{ratio:.2f}x, {'met' if checks['met'] else 'NOT met'}.",
        f"Load average before and after: {results['machine']['load_before'][0]:.1f}, "
        f"{results['machine']['load_after'][0]:.1f}; the run took {results['seconds']:.0f} s.",
    ]
    return "\n".join(lines), checks


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--photos", type=int, default=5000, help="photos of set a")
    parser.add_argument("--repeats", type=int, default=2, help="rounds, interleaved")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--gbit", type=float, default=1.0, help="the proxy's link, Gbit/s")
    parser.add_argument("--quick", action="store_true", help="1,000 photos, one round")
    args = parser.parse_args()
    if args.quick:
        args.photos, args.repeats = 1000, 1
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "load_before": os.getloadavg(),
        },
        "args": vars(args),
    }
    with SeaweedServer() as server:
        server.create_bucket(BUCKET)
        prep = prepare_set("a", server, files=args.photos)
        link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.gbit * 125e6)
        with NetProxy("127.0.0.1", server.port, link=link) as proxy:
            bench = Bench(server, proxy, prep)
            ray.init(
                num_cpus=os.cpu_count(),
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
            ray.data.DataContext.get_current().enable_progress_bars = False
            try:
                warm_up()
                results["methods"] = run_rounds(bench, args.repeats)
            finally:
                ray.shutdown()
        results.update(photos=prep.files, mean_kb=prep.mean_kb)
    results["machine"]["load_after"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - started
    text, checks = report(results, args)
    results["acceptance"] = checks
    (OUT / "ray_read.json").write_text(json.dumps(results, indent=2))
    (OUT / "ray_read.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
