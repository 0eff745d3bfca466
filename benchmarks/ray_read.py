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
  cropping and resizing with OpenCV (bilinear); on its defaults, and with the read tuning
  Ray Data's performance guide recommends for I/O-bound reads (``ray_remote_args=
  {"num_cpus": 0.25}``, "Tuning read resources"), as stoker's second row gets its own;
- ``ray.data.read_webdataset``: the tars through the same file system (Ray's default
  decoder: PIL, whole image), then the same ``map_batches``; on its defaults and tuned.

Each method runs in a fresh process with a local Ray cluster of its own
(``ray_read_children.py``, run by ``harness.py``): Ray starts, one task per CPU imports
what the methods' workers import, and then the clock starts, for every method at the same
point, the call that makes the dataset (listing and planning included); images/s run from
there to the last batch, and the first batch from the same start. Each method is consumed
by ``iter_batches(batch_size=256)`` on the driver. Requests and bytes are the proxy's own
counts for the process, against the bytes of the objects the method reads. Every method
runs ``--repeats`` times (3), the order rotated each round; the table shows medians and
each method's ratio to the strongest baseline row (tuned or not).

    pip install -e '.[bench,ray]'
    python benchmarks/ray_read.py            # 5,000 photos, 3 rounds
    python benchmarks/ray_read.py --quick    # 1,000 photos, one round: a smoke run

Writes benchmarks/out/ray_read.json and benchmarks/out/ray_read.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import webdataset as wds

from harness import (
    add_round_args,
    machine,
    method_lines,
    rounds,
    run_child,
    run_rounds,
    s3_env,
    strongest,
    write_report,
)
from loader_sets import BATCH, BUCKET, OUT, SHARD_BYTES, Prepared, prepare_set
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, upload
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

CHILD = Path(__file__).resolve().parent / "ray_read_children.py"
METHODS = (
    "stoker",
    "stoker_split",
    "read_images",
    "read_images_tuned",
    "read_webdataset",
    "read_webdataset_tuned",
)
BASELINES = ("read_images", "read_images_tuned", "read_webdataset", "read_webdataset_tuned")
LABELS = {
    "stoker": "stoker read_dataset, packed shards",
    "stoker_split": "stoker read_dataset, read_num_cpus=0.25",
    "read_images": "ray.data.read_images, unpacked folder",
    "read_images_tuned": "ray.data.read_images, unpacked folder, reads num_cpus=0.25",
    "read_webdataset": "ray.data.read_webdataset, WebDataset tars",
    "read_webdataset_tuned": "ray.data.read_webdataset, WebDataset tars, reads num_cpus=0.25",
}


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
        local = _wds_tars(prep)
        upload(
            local,
            open_store(f"s3://{BUCKET}/{prep.key}/wds", storage_options=server.storage_options()),
            config=TransferConfig(workers=16, include=("*.tar",)),
        )
        self.wds_bytes = sum(p.stat().st_size for p in local.glob("*.tar"))

    def run(self, method: str) -> dict[str, Any]:
        """The method in its own process and Ray cluster; what the proxy saw meanwhile."""
        if method.startswith("stoker"):
            where, data_bytes = f"s3://{BUCKET}/{self.prep.key}/shards", self.prep.shard_bytes
        elif method.startswith("read_images"):
            where, data_bytes = f"{BUCKET}/{self.prep.key}/raw", self.prep.raw_bytes
        else:
            where, data_bytes = f"{BUCKET}/{self.prep.key}/wds", self.wds_bytes
        options = json.dumps(self.server.storage_options(self.proxy.endpoint))
        before = self.proxy.stats()
        result = run_child(
            CHILD,
            [method, where, options, str(self.prep.files)],
            env=s3_env(self.proxy.endpoint),
            rate_key="images_per_s",
            server_pid=self.server.pid,
            clock="made_at",
        )
        after = self.proxy.stats()
        result["ray_start_s"] = result["made_at"] - result["launched_at"]
        result["requests_per_epoch"] = after.requests - before.requests
        result["bytes_per_epoch"] = after.bytes_down - before.bytes_down
        result["data_bytes"] = data_bytes
        return result


def report(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The markdown table and the acceptance check."""
    methods = results["methods"]
    best = strongest(methods, BASELINES, "images_per_s")
    assert best is not None
    best_name, best_rate = best
    ran = [m for m in METHODS if m in methods]
    ray_start = ", ".join(f"{methods[m]['ray_start_s']:.1f}" for m in ran)
    lines = [
        f"{results['photos']:,} photos of 500x375 (mean {results['mean_kb']:.0f} kB), "
        f"RandomResizedCrop(224) + flip, batches of {BATCH}; a local Ray cluster of "
        f"{results['machine']['cpus']} CPUs per method; through the {args.rtt_ms:g} ms / "
        f"{args.gbit:g} Gbit/s proxy.",
        "",
        *method_lines(
            args.repeats,
            "each method in a fresh process with its own Ray cluster, timed from the call "
            "that makes the dataset, after Ray started and its workers imported what the "
            f"tasks use (that start took {ray_start} s, by method, not counted)",
            "Ray's worker processes (Ray starts them); no DataLoader",
        ),
        "",
        "| method | images/s | x strongest baseline | first batch s | requests/epoch "
        "| MB/epoch | of the data's bytes |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method in ran:
        r = methods[method]
        lines.append(
            f"| {LABELS[method]} | {r['images_per_s']:,.0f} "
            f"| {r['images_per_s'] / best_rate:.2f}x "
            f"| {r['first_batch_s']:.2f} | {r['requests_per_epoch']:,.0f} "
            f"| {r['bytes_per_epoch'] / 1e6:,.0f} | {r['bytes_per_epoch'] / r['data_bytes']:.3f}x |"
        )
    ratio = methods["stoker"]["images_per_s"] / best_rate
    checks = {
        "stoker_over_strongest_baseline": ratio,
        "strongest_baseline": best_name,
        "goal": 2.0,
        "met": ratio >= 2.0,
    }
    lines += [
        "",
        f"Goal (issue 26): read_dataset >= 2x the strongest of read_images and read_webdataset "
        f"(each on its defaults and with Ray's recommended read tuning; here "
        f"{LABELS[best_name]}): {ratio:.2f}x, {'met' if checks['met'] else 'NOT met'}.",
        f"Load average before and after: {results['machine']['load_before'][0]:.1f}, "
        f"{results['machine']['load_after'][0]:.1f}; the run took {results['seconds']:.0f} s.",
    ]
    return "\n".join(lines), checks


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--photos", type=int, default=5000, help="photos of set a")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--gbit", type=float, default=1.0, help="the proxy's link, Gbit/s")
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="only these methods (comma-separated)"
    )
    add_round_args(parser)  # --quick: 1,000 photos, one round
    args = parser.parse_args()
    args.repeats = rounds(args)
    if args.quick:
        args.photos = 1000
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    wanted = args.methods.split(",")
    with SeaweedServer() as server:
        server.create_bucket(BUCKET)
        prep = prepare_set("a", server, files=args.photos)
        link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.gbit * 125e6)
        with NetProxy("127.0.0.1", server.port, link=link) as proxy:
            bench = Bench(server, proxy, prep)
            rows = {m: (lambda m=m: bench.run(m)) for m in METHODS if m in wanted}
            results["methods"] = run_rounds(rows, args.repeats, rate_key="images_per_s")
        results.update(photos=prep.files, mean_kb=prep.mean_kb)
    results["machine"]["load_after"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - started
    text, checks = report(results, args)
    results["acceptance"] = checks
    write_report("ray_read", results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
