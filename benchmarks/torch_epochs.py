"""Three epochs through PyTorch worker processes: stoker's TorchLoader against torch's
DataLoader over WebDataset, epoch by epoch (issue 25).

The photos of benchmarks/loader.py's set (a) (500x375, ~100 kB, RandomResizedCrop(224) +
flip, batches of 256), packed into tar shards in SeaweedFS behind the 20 ms / 1 Gbit/s
proxy. Both methods read the same shards through the proxy, in this process, one after
the other (``--repeats`` rounds, the order reversed every other round, a fresh disk cache
each round; the table shows each epoch's medians), each with two worker processes that
persist across epochs and a disk cache:

- stoker: ``TorchLoader(num_workers=2, cache=CacheConfig(dir=...))``;
- WebDataset: ``DataLoader(wds.WebDataset(urls, cache_dir=...).shuffle(1000).map(...)
  .batched(256), batch_size=None, num_workers=2, persistent_workers=True)`` over presigned
  URLs of the same shards (WebDataset's shard cache is its disk cache).

Per epoch: the first batch's wait (from ``iter()``), the steady-state batch interval (the
mean time per batch after the first), images/s, bytes from the store (what
the proxy sent) and, for stoker, bytes read from its disk cache (its workers' counters).
The end of the output checks issue 25's goals: the first batch of epochs 2 and 3 within 2x
a steady-state batch interval; disk-cache bytes per epoch at most 1.05x the data; stoker's
images/s at least 1.5x the DataLoader's.

    pip install -e '.[bench,test]'
    python benchmarks/torch_epochs.py            # 20,000 photos, two rounds
    python benchmarks/torch_epochs.py --quick    # 1,500 photos, one round: a smoke run

Writes benchmarks/out/torch_epochs.json and benchmarks/out/torch_epochs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import webdataset as wds
from torch.utils.data import DataLoader

from loader_baselines import WdsMap, boto
from loader_sets import BATCH, BUCKET, TRANSFORMS, Prepared, prepare_set
from stoker.integrations.torch import TorchLoader
from stoker.pipeline.config import CacheConfig
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

OUT = Path(__file__).resolve().parent / "out"
WORKERS = 2


def timed_epoch(batches: Iterable[Any]) -> dict[str, float]:
    """Iterate one epoch: its first batch's wait, steady batch interval and images/s."""
    started = time.perf_counter()
    arrivals: list[float] = []
    images = 0
    for batch in batches:
        arrivals.append(time.perf_counter())
        images += len(batch["label"]) if isinstance(batch, dict) else len(batch[1])
    seconds = time.perf_counter() - started
    # Workers hand over batches in bursts (each has some ready): the steady interval is
    # the mean time per batch after the first, not the median gap between two.
    steady = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) if len(arrivals) > 1 else 0.0
    return {
        "images": images,
        "batches": len(arrivals),
        "seconds": seconds,
        "images_per_s": images / seconds,
        "first_batch_s": arrivals[0] - started if arrivals else seconds,
        "steady_interval_s": steady,
    }


def run_stoker(
    prep: Prepared, proxy: NetProxy, options: dict[str, Any], cache: Path, epochs: int
) -> list[dict[str, Any]]:
    out = []
    with TorchLoader(
        f"s3://{BUCKET}/{prep.key}/shards",
        batch_size=BATCH,
        num_workers=WORKERS,
        transform=TRANSFORMS[prep.transform],
        cache=CacheConfig(dir=str(cache)),
        storage_options=options,
        seed=0,
    ) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            sent, hit = proxy.stats().bytes_down, cache_bytes(loader)
            result = timed_epoch(loader)
            result["store_bytes"] = proxy.stats().bytes_down - sent
            result["cache_bytes"] = cache_bytes(loader) - hit
            out.append(result)
            print(f"[stoker] epoch {epoch}: {summary(result)}", flush=True)
    return out


def cache_bytes(loader: TorchLoader) -> int:
    """Bytes the workers have read from the disk cache (as of their last batches)."""
    return int(loader.stats().disk_cache.get("cache.bytes_hit", 0))


def run_webdataset(
    prep: Prepared, proxy: NetProxy, cache: Path, epochs: int
) -> list[dict[str, Any]]:
    cache.mkdir(parents=True, exist_ok=True)
    client = boto(proxy.endpoint)
    keys = sorted(
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=f"{prep.key}/shards/shard-"
        )
        for o in page.get("Contents", [])
    )
    urls = [
        client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k})
        for k in keys
    ]
    pipeline = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False, cache_dir=str(cache))
        .shuffle(1000)
        .map(WdsMap(TRANSFORMS[prep.transform]))
        .batched(BATCH)
    )
    loader = DataLoader(
        pipeline,
        batch_size=None,
        num_workers=WORKERS,
        persistent_workers=True,
        multiprocessing_context="spawn",
    )
    out = []
    for epoch in range(epochs):
        sent = proxy.stats().bytes_down
        result = timed_epoch(loader)
        result["store_bytes"] = proxy.stats().bytes_down - sent
        result["cache_bytes"] = None  # WebDataset keeps no count of its cache reads
        out.append(result)
        print(f"[webdataset] epoch {epoch}: {summary(result)}", flush=True)
    del loader  # its workers stop
    return out


def summary(result: dict[str, Any]) -> str:
    return (
        f"first batch {result['first_batch_s']:.2f} s, {result['images_per_s']:.0f} images/s, "
        f"{result['store_bytes'] / 1e6:.1f} MB from the store"
        + ("" if result["cache_bytes"] is None else f", {result['cache_bytes'] / 1e6:.1f} MB cache")
    )


def median_epochs(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each epoch's numbers, the median over the rounds."""
    out = []
    for epoch in zip(*runs, strict=True):
        merged = dict(epoch[0])
        for key, value in epoch[0].items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                merged[key] = statistics.median(run[key] for run in epoch)
        merged["rounds"] = len(epoch)
        out.append(merged)
    return out


def report(results: dict[str, Any]) -> tuple[str, dict[str, bool]]:
    """The markdown table and the goals' checks."""
    data = results["data_bytes"]
    lines = [
        f"{results['files']} photos ({results['mean_kb']:.0f} kB), {data / 1e6:.1f} MB of "
        f"shards, batches of {BATCH}, {WORKERS} workers, 20 ms / 1 Gbit/s proxy",
        "",
        "| method | epoch | first batch s | steady interval s | images/s | store MB | "
        "cache MB | cache / data |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in ("stoker", "webdataset"):
        for epoch, r in enumerate(results[method]):
            cache = r["cache_bytes"]
            lines.append(
                f"| {method} | {epoch + 1} | {r['first_batch_s']:.2f} | "
                f"{r['steady_interval_s']:.3f} | {r['images_per_s']:.0f} | "
                f"{r['store_bytes'] / 1e6:.1f} | "
                + ("n/a | n/a |" if cache is None else f"{cache / 1e6:.1f} | {cache / data:.3f} |")
            )
    ours, theirs = results["stoker"], results["webdataset"]
    later = ours[1:]
    rate = statistics.mean(r["images_per_s"] for r in ours)
    base = statistics.mean(r["images_per_s"] for r in theirs)
    checks = {
        "first batch of epochs 2+ within 2x a steady interval": all(
            r["first_batch_s"] <= 2 * r["steady_interval_s"] for r in later
        ),
        "disk-cache bytes per epoch <= 1.05x the data": all(
            r["cache_bytes"] <= 1.05 * data for r in later
        ),
        "images/s >= 1.5x the DataLoader's": rate >= 1.5 * base,
    }
    lines += [
        "",
        f"stoker {rate:.0f} images/s over {len(ours)} epochs, DataLoader + WebDataset "
        f"{base:.0f}: {rate / base:.2f}x",
        "",
        *(f"- {'PASS' if ok else 'FAIL'}: {goal}" for goal, ok in checks.items()),
    ]
    return "\n".join(lines), checks


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--set", default="a", help="benchmarks/loader_sets.py's set")
    parser.add_argument("--files", type=int, help="photos (default: the set's 20,000)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--gbit", type=float, default=1.0)
    parser.add_argument(
        "--repeats", type=int, help="rounds, the order reversed every other one (default 2)"
    )
    parser.add_argument("--quick", action="store_true", help="1,500 photos, one round: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.files, args.repeats = args.files or 1500, args.repeats or 1
    args.repeats = args.repeats or 2
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="stoker-bench-torch-epochs-"))
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "args": vars(args),
    }
    try:
        with SeaweedServer() as server:
            server.create_bucket(BUCKET)
            link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.gbit * 125e6)
            with NetProxy("127.0.0.1", server.port, link=link) as proxy:
                prep = prepare_set(args.set, server, files=args.files)
                results.update(files=prep.files, mean_kb=prep.mean_kb, data_bytes=prep.shard_bytes)
                options = server.storage_options(proxy.endpoint)
                runs: dict[str, list[list[dict[str, Any]]]] = {"stoker": [], "webdataset": []}
                for round_ in range(args.repeats):
                    # A fresh disk cache each round: epoch 1 fills it, as a first run does.
                    cache = scratch / f"round{round_}"
                    methods = list(runs) if round_ % 2 == 0 else list(runs)[::-1]
                    for method in methods:
                        if method == "stoker":
                            run = run_stoker(prep, proxy, options, cache / method, args.epochs)
                        else:
                            run = run_webdataset(prep, proxy, cache / method, args.epochs)
                        runs[method].append(run)
                results.update({method: median_epochs(r) for method, r in runs.items()})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text, checks = report(results)
    results["goals"] = checks
    (OUT / "torch_epochs.json").write_text(json.dumps(results, indent=2))
    (OUT / "torch_epochs.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
