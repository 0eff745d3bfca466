"""Start-up storms (issue 32 item 8, acceptance (b)): 16 processes starting at once against
a rate-limited endpoint.

Starts SeaweedFS on loopback, packs a small dataset (one prefix), and puts stoker's proxy in
front admitting 100 requests/s per prefix (a token bucket with a 0.1 s burst), answering
S3's ``503 SlowDown`` beyond, as a partition of an S3 bucket does. Then, three rounds of
each: 16 loader processes (ranks 0-15 of 16 on one node), each opening the dataset and
taking its first batch, with a shared disk cache (the node cache; emptied before each
round, so every round is a cold start) and without one. The processes are let go together
once all have imported stoker, as ranks leave a barrier (on 2 cores 16 interpreters take
2-5 s to import numpy and stoker, which would spread the starts out).

For each round: processes that failed, the slowest first batch (seconds from the go), the
slowest import (from the launch, before the go), the requests the proxy saw for the index
per process (GETs and HEADs of index.json and index.bin, throttled ones included), the
HEADs of shards per process (0: the reader checks each shard's size against the index from
its first ranged GET's answer; it sent one HEAD per shard before), the data GETs and the
throttles. The acceptance: 0 failures, every first batch within
10 s, <= 2 requests per process beyond the data.

    pip install -e '.[bench]'
    python benchmarks/startup_storm.py               # under a minute on 2 cores
    python benchmarks/startup_storm.py --rounds 1

Writes benchmarks/out/startup_storm.json and benchmarks/out/startup_storm.md.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import write_report
from stoker.pack.packer import PackConfig, pack
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import SeaweedServer
from stoker.testing.storm import run_startup_storm

CHILD = Path(__file__).resolve().parent.parent / "tests" / "reliability" / "startup_child.py"
BUCKET = "bench-storm"


def _row(name: str, n: int, r: dict[str, Any]) -> str:
    return (
        f"| {name} | {n} | {r['failures']} | {r['max_first_batch_s']:.2f} "
        f"| {r['max_imported_s']:.2f} | {r['other_per_process']:.2f} "
        f"| {r['index_json_gets']} / {r['index_bin_gets']} | {r['index_heads']} "
        f"| {r['data_heads_per_process']:.2f} | {r['data_requests']} | {r['throttled']} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=16, help="loader processes")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each")
    parser.add_argument("--limit", type=float, default=100.0, help="requests/s per prefix")
    parser.add_argument("--samples", type=int, default=1024, help="samples in the dataset")
    args = parser.parse_args()
    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"node cache": [], "no cache": []}
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = SeaweedServer(install=True)
        server.start()
        try:
            server.create_bucket(BUCKET)
            write_image_folder(work / "src", files=args.samples, classes=8, width=32, height=24)
            url = f"s3://{BUCKET}/ds"
            pack(
                work / "src",
                url,
                config=PackConfig(samples_per_shard=16),
                storage_options=server.storage_options(),
            )
            for n in range(1, args.rounds + 1):
                for name, results in runs.items():
                    cache = work / "cache"
                    shutil.rmtree(cache, ignore_errors=True)
                    run = run_startup_storm(
                        server,
                        url,
                        work / f"{name.replace(' ', '-')}-{n}",
                        child=CHILD,
                        processes=args.processes,
                        requests_per_s=args.limit,
                        cache_dir=cache if name == "node cache" else None,
                    )
                    result = run.to_dict()
                    result["errors"] = run.errors
                    results.append(result)
                    lines.append(_row(name, n, result))
                    print(lines[-1], flush=True)
        finally:
            server.stop()
    header = [
        f"{args.processes} processes launched at once; limit {args.limit:g} requests/s per "
        f"prefix (503 SlowDown beyond); {args.samples} samples in {args.samples // 16} shards; "
        "batches of 8.",
        "",
        "| run | round | failures | slowest first batch after the go, s | slowest import, s "
        "| index requests / process | index.json / index.bin GETs | index.json HEADs "
        "| shard size HEADs / process | data GETs | throttled |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    table = "\n".join(header + lines)
    report = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processes": args.processes,
        "limit_per_s": args.limit,
        "runs": runs,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_report("startup_storm", report, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
