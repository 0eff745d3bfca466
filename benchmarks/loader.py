"""Stream a packed dataset from a bucket into batches: stoker against the usual baselines.

Two datasets made from real photographs (scikit-image's sample photos and, if installed,
Debian's mate-backgrounds): (a) 20,000 photos of 500x375 (~100 kB), batches of
RandomResizedCrop(224) + flip, and (b) 25,000 of 150x150, Resize(224x224) + flip; batches
of 256 uint8 images. Data sit in SeaweedFS behind the 20 ms / 1 Gbit/s proxy; every
method reads through it, cold, on this machine's cores:

- in RAM, full decode: the same bytes already in RAM, simplejpeg's whole-image decode +
  OpenCV's bilinear resize, all cores, no I/O (the issue 16 reference row);
- in RAM, stoker's decode: the same with stoker's ``decode_planned`` (DCT scaling);
- stoker: the Loader on its defaults (autotune on) in its own process, packed shards;
- stoker, second epoch from its disk cache: the same with ``CacheConfig(dir=...)``, the
  first epoch filling the cache and the second timed (local disk, as tf.data's epoch);
- stoker, unpacked folder: the same Loader pointed at the uploaded photos themselves
  (class folders, no pack step): one listing, then one GET per image;
- tf.data: TFRecord shards of the same photos downloaded in parallel to local disk, then
  TensorFlow's data performance guide's pipeline (see loader_children.py), own process;
- per-object DataLoader: torch DataLoader(num_workers=2), one boto3 GET per sample;
- download + ImageFolder-style: ``stoker download`` of the originals, then a
  DataLoader(num_workers=2) reading local files (PIL open, RGB, crop, resize);
- WebDataset over the same shards (presigned HTTP URLs through the proxy, num_workers=2).

Every method runs ``--repeats`` times, interleaved (the order reversed every other round),
and the tables show medians. Bytes and requests per epoch are the proxy's own counts
(what the server sent, response heads included) scaled to a whole epoch when a run read
less than one (marked ~), against the bytes of the objects the method reads (shards,
TFRecords or originals). First batch: after the process started for the methods run in
their own process (imports and, for tf.data, the download included); after ``iter()``
for the DataLoaders. The end of the output checks issue 16's acceptance bounds.

Two figures put the images/s in context. The link's ceiling: a method that streams its
data in the timed epoch cannot feed more images/s than ``--gbit`` carries of that data
(tf.data's timed epoch reads local disk: its download is timed apart). CPU ms per image:
the method's own process, over its timed epoch, which is what it costs where the store is
really remote (here the server and the proxy share the machine's cores: their share is
listed too).

    pip install -e '.[bench,test]' && apt-get install mate-backgrounds
    python benchmarks/loader.py                    # both sets, every method, ~25 minutes
    python benchmarks/loader.py --methods acceptance   # in-RAM rows, stoker and tf.data
    python benchmarks/loader.py --methods folder   # stoker on the shards and on the folder
    python benchmarks/loader.py --methods cache    # + stoker's second epoch from disk cache
    python benchmarks/loader.py --quick            # 1,500 photos a set, one round: a smoke run

Writes benchmarks/out/loader.json and benchmarks/out/loader.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import webdataset as wds
from torch.utils.data import DataLoader

from loader_baselines import (
    LocalFiles,
    PerObject,
    WdsMap,
    boto,
    in_ram_rate,
    time_loader,
)
from loader_report import report
from loader_sets import BATCH, BUCKET, SETS, TRANSFORMS, Prepared, prepare_set
from quiet import cpu_seconds
from stoker.storage import open_store
from stoker.storage.transfer import download
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer

OUT = Path(__file__).resolve().parent / "out"
CHILDREN = Path(__file__).resolve().parent / "loader_children.py"
__all__ = ["BATCH", "BUCKET", "SETS", "TRANSFORMS", "Prepared", "prepare_set"]


class Bench:
    """One set's methods, against one server and proxy."""

    def __init__(
        self,
        prep: Prepared,
        server: SeaweedServer,
        proxy: NetProxy,
        args: argparse.Namespace,
        scratch: Path,
    ) -> None:
        self.prep, self.server, self.proxy, self.args, self.scratch = (
            prep,
            server,
            proxy,
            args,
            scratch,
        )
        self.transform = TRANSFORMS[prep.transform]
        self.env = {
            **os.environ,
            "AWS_ENDPOINT_URL": proxy.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }

    def counted(self, run: Callable[[], dict[str, Any]], whole: bool) -> dict[str, Any]:
        """Run one method; add what the proxy saw, per epoch (``whole``: the run reads the
        whole data set however many images it times, as a download does)."""
        before = self.proxy.stats()
        result = run()
        after = self.proxy.stats()
        scale = 1.0 if whole else self.prep.files / max(1, result["images"])
        result["epoch_scale"] = scale
        result["bytes_per_epoch"] = (after.bytes_down - before.bytes_down) * scale
        result["requests_per_epoch"] = (after.requests - before.requests) * scale
        return result

    def child(self, command: list[str]) -> dict[str, Any]:
        """A method in its own process; its first batch counted from the process's start."""
        server_cpu, harness_cpu = cpu_seconds(self.server.pid), cpu_seconds(None)
        started = time.time()
        done = subprocess.run(
            [sys.executable, str(CHILDREN), *command],
            env=self.env,
            capture_output=True,
            text=True,
        )
        wall = time.time() - started
        if done.returncode:
            raise RuntimeError(f"{command[0]} failed:\n{done.stderr[-4000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        result["first_batch_s"] = result.pop("first_batch_at") - started
        # The server and the proxy (a thread of this process) share the cores with the
        # client: how much of the machine they took while the method ran.
        result["server_cores"] = (cpu_seconds(self.server.pid) - server_cpu) / wall
        result["proxy_cores"] = (cpu_seconds(None) - harness_cpu) / wall
        return result

    def limit_full(self) -> dict[str, Any]:
        cores = os.cpu_count() or 2
        paths, count = self.prep.paths, self.args.limit_images
        return in_ram_rate(paths, count, cores, self.transform, full=True)

    def limit_planned(self) -> dict[str, Any]:
        cores = os.cpu_count() or 2
        paths, count = self.prep.paths, self.args.limit_images
        return in_ram_rate(paths, count, cores, self.transform, full=False)

    def stoker(self) -> dict[str, Any]:
        url = f"s3://{BUCKET}/{self.prep.key}/shards"
        command = ["stoker", url, self.prep.transform, str(self.args.images)]
        result = self.counted(lambda: self.child(command), whole=False)
        result["data_bytes"] = self.prep.shard_bytes
        return result

    def stoker_cached(self) -> dict[str, Any]:
        """The Loader with a disk cache, its second epoch timed: from local disk, as
        tf.data's epoch reads the TFRecords it downloaded."""
        cache = self.scratch / f"{self.prep.key}-cache"
        url = f"s3://{BUCKET}/{self.prep.key}/shards"
        command = ["stoker", url, self.prep.transform, str(self.args.images), str(cache)]
        try:
            result = self.child(command)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        result["data_bytes"] = self.prep.shard_bytes
        result["first_batch_s"] = None  # its timed epoch starts after a whole one
        return result

    def stoker_folder(self) -> dict[str, Any]:
        """The Loader on the unpacked photos (class folders): one GET per image."""
        url = f"s3://{BUCKET}/{self.prep.key}/raw"
        command = ["stoker", url, self.prep.transform, str(self.args.images)]
        result = self.counted(lambda: self.child(command), whole=False)
        result["data_bytes"] = self.prep.raw_bytes
        return result

    def tfdata(self) -> dict[str, Any]:
        local = self.scratch / f"{self.prep.key}-tfrecord"
        command = [
            "tfdata",
            BUCKET,
            f"{self.prep.key}/tfrecord/",
            str(local),
            self.prep.transform,
            str(self.args.images),
        ]
        try:
            result = self.counted(lambda: self.child(command), whole=True)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        result["data_bytes"] = self.prep.tfrecord_bytes
        return result

    def per_object(self) -> dict[str, Any]:
        prep = self.prep
        keys = [f"{prep.key}/raw/{p.relative_to(prep.source).as_posix()}" for p in prep.paths]
        random.Random(0).shuffle(keys)
        # Only the timed images, so that the workers' read-ahead reads nothing more.
        keys = keys[: self.args.slow_images]
        loader = DataLoader(
            PerObject(self.proxy.endpoint, BUCKET, keys, self.transform),
            batch_size=BATCH,
            num_workers=2,
            multiprocessing_context="spawn",
        )
        result = self.counted(lambda: time_loader(loader, self.args.slow_images), whole=False)
        result["data_bytes"] = prep.raw_bytes
        return result

    def download_folder(self) -> dict[str, Any]:
        local = self.scratch / f"{self.prep.key}-download"

        def run() -> dict[str, Any]:
            options = self.server.storage_options(self.proxy.endpoint)
            started = time.perf_counter()
            store = open_store(f"s3://{BUCKET}/{self.prep.key}/raw", storage_options=options)
            download(store, local)
            download_s = time.perf_counter() - started
            paths = sorted(local.rglob("*.jpg"))
            random.Random(0).shuffle(paths)
            loader = DataLoader(
                LocalFiles(paths, self.transform),
                batch_size=BATCH,
                num_workers=2,
                multiprocessing_context="spawn",
            )
            return {**time_loader(loader, self.args.slow_images), "download_s": download_s}

        try:
            result = self.counted(run, whole=True)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        result["data_bytes"] = self.prep.raw_bytes
        return result

    def webdataset(self) -> dict[str, Any]:
        client = boto(self.proxy.endpoint)
        shard_keys = sorted(
            o["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=BUCKET, Prefix=f"{self.prep.key}/shards/shard-"
            )
            for o in page.get("Contents", [])
        )
        urls = [
            client.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": k}, ExpiresIn=3600
            )
            for k in shard_keys
        ]
        pipeline = (
            wds.WebDataset(urls, shardshuffle=False, empty_check=False)
            .shuffle(1000)
            .map(WdsMap(self.transform))
            .batched(BATCH)
        )
        loader = DataLoader(
            pipeline, batch_size=None, num_workers=2, multiprocessing_context="spawn"
        )
        limit = self.args.images or self.prep.files
        result = self.counted(lambda: time_loader(loader, limit), whole=False)
        result["data_bytes"] = self.prep.shard_bytes
        return result


METHOD_SETS = {
    "all": [
        "limit_full",
        "limit_planned",
        "stoker",
        "stoker_cached",
        "stoker_folder",
        "tfdata",
        "per_object",
        "download_folder",
        "webdataset",
    ],
    "acceptance": ["limit_full", "limit_planned", "stoker", "tfdata"],
    "stoker": ["limit_full", "limit_planned", "stoker", "stoker_folder"],
    "folder": ["stoker", "stoker_folder"],
    "cache": ["limit_full", "stoker", "stoker_cached", "tfdata"],
}


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each number's median over the runs (other values from the first run)."""
    merged = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            merged[key] = statistics.median(run[key] for run in runs)
    merged["runs"] = len(runs)
    return merged


def run_set(bench: Bench, methods: list[str], repeats: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for round_ in range(repeats):
        for method in methods if round_ % 2 == 0 else methods[::-1]:
            result = getattr(bench, method)()
            runs[method].append(result)
            print(
                f"[{bench.prep.key}] round {round_ + 1}: {method} "
                f"{result['images_per_s']:.0f} images/s",
                flush=True,
            )
    prep = bench.prep
    results: dict[str, Any] = {
        "mean_kb": prep.mean_kb,
        "files": prep.files,
        "transform": prep.transform,
        "shard_bytes": prep.shard_bytes,
        "tfrecord_bytes": prep.tfrecord_bytes,
        "raw_bytes": prep.raw_bytes,
    }
    results.update({m: median_of(r) for m, r in runs.items()})
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sets", default="a,b")
    parser.add_argument(
        "--files", type=int, help="photos per set (default: 20,000 for a, 25,000 for b)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="rounds, interleaved")
    parser.add_argument("--limit-images", type=int, default=3000)
    parser.add_argument(
        "--images",
        type=int,
        default=0,
        help="images timed for stoker, tf.data and WebDataset (0: a whole epoch)",
    )
    parser.add_argument(
        "--slow-images",
        type=int,
        default=2048,
        help="images timed for the per-object and folder baselines",
    )
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument(
        "--gbit",
        type=float,
        default=1.0,
        help="the proxy's link rate in Gbit/s (issue 16's runs: 1); a method that streams "
        "cannot feed more images/s than this carries of its data",
    )
    parser.add_argument("--methods", choices=sorted(METHOD_SETS), default="all")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1,500 photos a set, one round, 512 images for the slow baselines",
    )
    args = parser.parse_args()
    if args.quick:
        args.files, args.repeats = args.files or 1500, 1
        args.slow_images, args.limit_images = 512, 500
    methods = METHOD_SETS[args.methods]
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="stoker-bench-loader-"))
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "args": vars(args),
    }
    try:
        with SeaweedServer() as server:
            server.create_bucket(BUCKET)
            link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.gbit * 125e6)
            with NetProxy("127.0.0.1", server.port, link=link) as proxy:
                for name in args.sets.split(","):
                    prep = prepare_set(
                        name, server, files=args.files, tfrecords="tfdata" in methods
                    )
                    bench = Bench(prep, server, proxy, args, scratch)
                    results[name] = run_set(bench, methods, args.repeats)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text, checks = report(results, args)
    results["acceptance"] = checks
    (OUT / "loader.json").write_text(json.dumps(results, indent=2))
    (OUT / "loader.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
