"""Slow reads (issue 32 acceptance (a)): 1 % of GETs stalled 2 s, with and without hedging.

A SeaweedFS server on loopback behind stoker's proxy (stoker.testing.netproxy) with a 20 ms
round trip; a packed set of small JPEGs read by one Loader, in short blocks so that an epoch
makes many ranged GETs: a warm-up epoch with no fault (so the store has timed its GETs, as in
a long run), then the measured epoch. Four runs a round, 3 rounds:

* no fault, hedging off (the baseline) and on;
* 1 % of shard GETs held back 2 s by the proxy (``FaultConfig(kinds=("stall",), stall_s=2)``),
  hedging off and on (``StorageOptions(hedge=HedgePolicy())``).

Per run: the p99 and the longest of the consumer's waits for a batch, images/s, GETs, hedges
(requests.hedged) and their share of the GETs, hedges that answered first, stalls injected.

    python benchmarks/slow_reads.py              # about a minute on 2 cores
    python benchmarks/slow_reads.py --images 1000 --rounds 1

Writes benchmarks/out/slow_reads.json and benchmarks/out/slow_reads.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness import write_report
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.storage.hedge import HedgePolicy
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import FaultConfig, LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

BUCKET = "bench-slow-reads"
STALL_S = 2.0
STALL_RATE = 0.01


def run_epoch(
    server: SeaweedServer,
    proxy: NetProxy,
    *,
    stalled: bool,
    hedge: HedgePolicy | None,
    seed: int,
) -> dict[str, Any]:
    url = f"s3://{BUCKET}/packed"
    options: dict[str, Any] = server.storage_options(proxy.endpoint)
    if hedge is not None:
        options["hedge"] = hedge
    faults = FaultConfig(
        fault_rate=STALL_RATE if stalled else 0.0,
        kinds=("stall",),
        stall_s=STALL_S,
        seed=seed,
        fault_paths="shard-",
        fault_methods=frozenset({"GET"}),
    )
    order = OrderConfig(block_size=4, group_blocks=8)  # short blocks: many ranged GETs
    waits: list[float] = []
    images = 0
    with Loader(url, batch_size=64, seed=seed, storage_options=options, order=order) as loader:
        # A warm-up epoch with no fault: the store times its GETs as a long run's would have.
        proxy.set_faults(FaultConfig())
        for _ in loader:
            pass
        loader.set_epoch(1)
        proxy.set_faults(faults)
        before = proxy.stats()
        earlier = dict(loader.stats().requests)
        started = time.perf_counter()
        iterator = iter(loader)
        while True:
            asked = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            waits.append(time.perf_counter() - asked)
            images += len(batch["index"])
        seconds = time.perf_counter() - started
        requests = {k: v - earlier.get(k, 0) for k, v in loader.stats().requests.items()}
    after = proxy.stats()
    gets = requests.get("requests.get", 0)
    hedged = requests.get("requests.hedged", 0)
    return {
        "stalled": stalled,
        "hedge": hedge is not None,
        "images": images,
        "seconds": round(seconds, 3),
        "images_per_s": round(images / seconds, 1),
        "p99_wait_s": round(float(np.percentile(waits, 99)), 4),
        "max_wait_s": round(max(waits), 4),
        "gets": gets,
        "hedged": hedged,
        "hedged_share": round(hedged / gets, 4) if gets else 0.0,
        "hedge_won": requests.get("requests.hedge_won", 0),
        "stalls": after.faults["stall"] - before.faults["stall"],
    }


def _table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| round | stalls 1 % x 2 s | hedging | p99 batch wait s | max wait s | images/s "
        "| GETs | hedged (share) | hedges won | stalls |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run['round']} | {'yes' if run['stalled'] else 'no'} "
            f"| {'on' if run['hedge'] else 'off'} | {run['p99_wait_s']:.3f} "
            f"| {run['max_wait_s']:.3f} | {run['images_per_s']:.0f} | {run['gets']} "
            f"| {run['hedged']} ({100 * run['hedged_share']:.1f} %) | {run['hedge_won']} "
            f"| {run['stalls']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=3000, help="images in the packed set")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--multiplier", type=float, default=HedgePolicy().multiplier, help="HedgePolicy's"
    )
    args = parser.parse_args()
    policy = HedgePolicy(multiplier=args.multiplier)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, SeaweedServer() as server:
        server.create_bucket(BUCKET)
        source = Path(tmp) / "images"
        write_image_folder(source, files=args.images, classes=10, width=64, height=48)
        pack(
            str(source),
            f"s3://{BUCKET}/packed",
            config=PackConfig(samples_per_shard=200),
            storage_options=server.storage_options(),
        )
        with NetProxy("127.0.0.1", server.port, link=LinkConfig(rtt_s=0.02)) as proxy:
            for round_ in range(1, args.rounds + 1):
                for stalled, hedge in ((False, False), (False, True), (True, False), (True, True)):
                    run = run_epoch(
                        server,
                        proxy,
                        stalled=stalled,
                        hedge=policy if hedge else None,
                        seed=round_,
                    )
                    run["round"] = round_
                    runs.append(run)
                    print(json.dumps(run), flush=True)
    results = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "stall_rate": STALL_RATE,
        "stall_s": STALL_S,
        "hedge_policy": repr(policy),
        "runs": runs,
    }
    table = _table(runs)
    write_report("slow_reads", results, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
