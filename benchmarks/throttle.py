"""Request-rate shaping: processes sharing one prefix behind a per-prefix request limit.

Starts SeaweedFS on loopback and stoker's proxy in front of it admitting 150 requests/s per
prefix (a token bucket with a 0.1 s burst), answering S3's ``503 SlowDown`` beyond, as a
partition of an S3 bucket does. Then, each row against the same limit:

* two ``stoker download`` processes of the same 1,500 small objects in one prefix, with the
  rate shaping switched off (``--no-adaptive-rate``: retries alone, the baseline), adaptive
  (the default), and with a fixed cap of 70 requests/s per process
  (``--max-requests-per-s 70``);
* eight loader processes (ranks 0-7 of 8 on one node) reading one epoch of a packed dataset
  in one prefix, one ranged read per sample, without and with the adaptive shaping.

For each: the requests the proxy saw and the bytes it sent (against the data's own: the
objects downloaded, or the shards), the share it throttled, the rate it admitted between
the prefix's first request and its last (against the limit), the wall time, and whether
every file arrived byte-exact or every sample exactly once.

    pip install -e '.[bench]'
    python benchmarks/throttle.py                   # about three minutes on 2 cores
    python benchmarks/throttle.py --objects 500     # quick look

Writes benchmarks/out/throttle.json and benchmarks/out/throttle.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import write_report
from stoker.pack.packer import PackConfig, pack
from stoker.storage import open_store
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import SeaweedServer
from stoker.testing.throttled import (
    object_bytes,
    put_objects,
    run_throttled_downloads,
    run_throttled_ranks,
)

CHILD = Path(__file__).resolve().parent.parent / "tests" / "reliability" / "throttled_rank_child.py"
BUCKET = "bench-throttle"


def _row(name: str, result: dict[str, Any], data_bytes: int, check: str) -> str:
    sent = result["bytes_down"]
    return (
        f"| {name} | {result['requests']} | {sent / 1e6:.1f} | {sent / data_bytes:.2f}x "
        f"| {result['throttled']} "
        f"| {100 * result['throttled_share']:.1f} % | {result['admitted_per_s']:.0f} "
        f"| {result['admitted_vs_limit']:.2f}x | {result['seconds']:.1f} | {check} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--objects", type=int, default=1500, help="objects per download")
    parser.add_argument("--samples", type=int, default=1600, help="samples for the 8 ranks")
    parser.add_argument("--limit", type=float, default=150.0, help="requests/s per prefix")
    args = parser.parse_args()
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = SeaweedServer(install=True)
        server.start()
        try:
            server.create_bucket(BUCKET)
            put_objects(server, BUCKET, args.objects)
            object_data = sum(len(object_bytes(i)) for i in range(args.objects))
            downloads = {
                "2 downloads, retries only": ("--no-adaptive-rate",),
                "2 downloads, adaptive": (),
                "2 downloads, capped at 70/s each": ("--max-requests-per-s", "70"),
            }
            for n, (name, extra) in enumerate(downloads.items()):
                run = run_throttled_downloads(
                    server,
                    BUCKET,
                    work / f"dl{n}",
                    objects=args.objects,
                    requests_per_s=args.limit,
                    extra_args=extra,
                )
                results[name] = run.to_dict()
                intact = f"{run.files_intact}/{2 * args.objects} files byte-exact"
                lines.append(_row(name, results[name], 2 * object_data, intact))
                print(lines[-1], flush=True)
            write_image_folder(work / "src", files=args.samples, classes=8, width=32, height=24)
            url = f"s3://{BUCKET}/ds"
            pack(
                work / "src",
                url,
                config=PackConfig(samples_per_shard=4),
                storage_options=server.storage_options(),
            )
            store = open_store(url, storage_options=server.storage_options())
            shard_bytes = sum(m.size for m in store.list("") if "/shard-" in f"/{m.key}")
            ranks = {
                "8 loader ranks, retries only": {"shaping": {"adaptive": False}},
                "8 loader ranks, adaptive": {},
            }
            for n, (name, options) in enumerate(ranks.items()):
                (work / f"ranks{n}").mkdir()
                ranks_run = run_throttled_ranks(
                    server,
                    url,
                    work / f"ranks{n}",
                    child=CHILD,
                    samples=args.samples,
                    requests_per_s=args.limit,
                    extra_options=options,
                )
                results[name] = ranks_run.to_dict()
                once = "exactly once" if ranks_run.exactly_once else "NOT exactly once"
                lines.append(_row(name, results[name], shard_bytes, once))
                print(lines[-1], flush=True)
        finally:
            server.stop()
    header = [
        f"Limit {args.limit:g} requests/s per prefix; {args.objects} objects per download, "
        f"{args.samples} samples for the ranks.",
        "",
        "| run | requests | MB sent | x the data | throttled | share | admitted/s | vs limit "
        "| seconds | result |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    table = "\n".join(header + lines)
    report = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "limit_per_s": args.limit,
        "runs": results,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_report("throttle", report, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
