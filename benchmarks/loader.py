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
  DataLoader(num_workers=2) reading local files (PIL open, RGB, crop, resize), the whole
  epoch timed (the download is part of it);
- WebDataset over the same shards (presigned HTTP URLs through the proxy, num_workers=2).

Every method but the in-RAM rows runs in a fresh process of its own (``harness.py``), its
clock started with the process: images/s are its images over the seconds from the
process's start to its last batch, and its first batch is counted from there (imports,
listing or index, worker start-up and, for tf.data, the download all included). The
DataLoaders' workers start with the platform's default method (fork on Linux). The disk
cache row times its second epoch alone, from its first ``next()``; the in-RAM rows time
their decoding loop. Every method runs ``--repeats`` times (3), the order rotated each
round, and the tables show medians. Bytes and requests per epoch are the proxy's own
counts (what the server sent, response heads included) scaled to a whole epoch when a run
read less than one (marked ~), against the bytes of the objects the method reads (shards,
TFRecords or originals). The end of the output checks issue 16's acceptance bounds.

Two figures put the images/s in context. The link's ceiling: a method that streams its
data in the timed epoch cannot feed more images/s than ``--gbit`` carries of that data
(tf.data's timed epoch reads local disk: its download is timed apart). CPU ms per image:
the method's own process, over its timed epoch, which is what it costs where the store is
really remote (here the server and the proxy share the machine's cores: their share is
listed too).

    pip install -e '.[bench,test]' && apt-get install mate-backgrounds
    python benchmarks/loader.py                    # both sets, every method, 3 rounds
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
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import add_round_args, machine, rounds, run_child, run_rounds, s3_env, write_report
from loader_baselines import boto, in_ram_rate
from loader_report import report
from loader_sets import BATCH, BUCKET, SETS, TRANSFORMS, Prepared, prepare_set
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

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
        self.prep, self.server, self.proxy, self.args = prep, server, proxy, args
        self.scratch = scratch
        self.transform = TRANSFORMS[prep.transform]

    def counted(self, run: Any, whole: bool) -> dict[str, Any]:
        """Run one method; add what the proxy saw, per epoch (``whole``: the run reads the
        whole data set however many images it times, as a download does)."""
        before = self.proxy.stats()
        result: dict[str, Any] = run()
        after = self.proxy.stats()
        scale = 1.0 if whole else self.prep.files / max(1, result["images"])
        result["epoch_scale"] = scale
        result["bytes_per_epoch"] = (after.bytes_down - before.bytes_down) * scale
        result["requests_per_epoch"] = (after.requests - before.requests) * scale
        return result

    def child(self, command: list[str], clock: str = "launch") -> dict[str, Any]:
        """A method in its own process; its clock starts with the process."""
        return run_child(
            CHILDREN,
            command,
            env=s3_env(self.proxy.endpoint),
            rate_key="images_per_s",
            server_pid=self.server.pid,
            clock=clock,
        )

    def limit_full(self) -> dict[str, Any]:
        cores = os.cpu_count() or 2
        paths, count = self.prep.paths, self.args.limit_images
        return {**in_ram_rate(paths, count, cores, self.transform, full=True), "clock": "in RAM"}

    def limit_planned(self) -> dict[str, Any]:
        cores = os.cpu_count() or 2
        paths, count = self.prep.paths, self.args.limit_images
        return {**in_ram_rate(paths, count, cores, self.transform, full=False), "clock": "in RAM"}

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
            result = self.child(command, clock="loop")
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
        prefix = f"{self.prep.key}/tfrecord/"
        command = ["tfdata", BUCKET, prefix, str(local), self.prep.transform, str(self.args.images)]
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
        keys_file = self.scratch / "keys.json"
        keys_file.write_text(json.dumps(keys[: self.args.slow_images]))
        command = ["per-object", self.proxy.endpoint, BUCKET, str(keys_file), prep.transform]
        command.append(str(self.args.slow_images))
        result = self.counted(lambda: self.child(command), whole=False)
        result["data_bytes"] = prep.raw_bytes
        return result

    def download_folder(self) -> dict[str, Any]:
        local = self.scratch / f"{self.prep.key}-download"
        options = json.dumps(self.server.storage_options(self.proxy.endpoint))
        url = f"s3://{BUCKET}/{self.prep.key}/raw"
        command = ["download-folder", url, str(local), self.prep.transform, "0", options]
        try:
            result = self.counted(lambda: self.child(command), whole=True)
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
        urls_file = self.scratch / "urls.json"
        urls_file.write_text(json.dumps(urls))
        limit = self.args.images or self.prep.files
        command = ["webdataset", str(urls_file), self.prep.transform, str(limit)]
        result = self.counted(lambda: self.child(command), whole=False)
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


def run_set(bench: Bench, methods: list[str], repeats: int) -> dict[str, Any]:
    rows = {method: getattr(bench, method) for method in methods}
    prep = bench.prep
    results: dict[str, Any] = {
        "mean_kb": prep.mean_kb,
        "files": prep.files,
        "transform": prep.transform,
        "shard_bytes": prep.shard_bytes,
        "tfrecord_bytes": prep.tfrecord_bytes,
        "raw_bytes": prep.raw_bytes,
    }
    results.update(run_rounds(rows, repeats, rate_key="images_per_s", label=f"[{prep.key}] "))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sets", default="a,b")
    parser.add_argument(
        "--files", type=int, help="photos per set (default: 20,000 for a, 25,000 for b)"
    )
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
        help="images timed for the per-object baseline",
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
    add_round_args(parser)  # --quick: 1,500 photos a set, one round, 512 per-object images
    args = parser.parse_args()
    args.repeats = rounds(args)
    if args.quick:
        args.files = args.files or 1500
        args.slow_images, args.limit_images = 512, 500
    methods = METHOD_SETS[args.methods]
    scratch = Path(tempfile.mkdtemp(prefix="stoker-bench-loader-"))
    results: dict[str, Any] = {"machine": machine(), "args": vars(args)}
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
    write_report("loader", results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
