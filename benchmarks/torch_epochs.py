"""Three epochs through PyTorch worker processes: stoker's TorchLoader against torch's
DataLoader over WebDataset, epoch by epoch (issue 25).

The photos of benchmarks/loader.py's set (a) (500x375, ~100 kB, RandomResizedCrop(224) +
flip, batches of 256), packed into tar shards in SeaweedFS behind the 20 ms / 1 Gbit/s
proxy. Both systems read the same shards through the proxy, each in a fresh process of its
own (``torch_epochs_children.py``, run by ``harness.py``), with two worker processes that
persist across epochs and a fresh disk cache each run:

- stoker: ``TorchLoader(num_workers=2, cache=CacheConfig(dir=...))`` (its workers start
  with ``spawn``, TorchLoader's default);
- WebDataset: ``DataLoader(wds.WebDataset(urls, cache_dir=...).shuffle(1000).map(...)
  .batched(256), batch_size=None, num_workers=2, persistent_workers=True)`` over presigned
  URLs of the same shards (WebDataset's shard cache is its disk cache), its workers started
  with the platform's default method (fork on Linux).

The rate over the epochs is every epoch's images over the seconds from the start of the
system's process to its last batch (imports, opening, worker start-up all counted), per
round; the table shows the rounds' medians. Per epoch: the first batch's wait (epoch 1:
from the process's start; later epochs: from ``iter()``), the steady-state batch interval
(the mean time per batch after the first), the epoch's own images/s, bytes from the store
(what the proxy sent, read at the end of each epoch) and, for stoker, bytes read from its
disk cache (its workers' counters). The end of the output checks issue 25's goals: the
first batch of epochs 2 and 3 within 2x a steady-state batch interval; disk-cache bytes
per epoch at most 1.05x the data; stoker's images/s at least 1.5x the DataLoader's.

    pip install -e '.[bench,test]'
    python benchmarks/torch_epochs.py            # 20,000 photos, 3 rounds
    python benchmarks/torch_epochs.py --quick    # 1,500 photos, one round: a smoke run

Writes benchmarks/out/torch_epochs.json and benchmarks/out/torch_epochs.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    add_round_args,
    machine,
    method_lines,
    rounds,
    run_child,
    run_rounds,
    s3_env,
    write_report,
)
from loader_baselines import boto
from loader_sets import BATCH, BUCKET, Prepared, prepare_set
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

CHILD = Path(__file__).resolve().parent / "torch_epochs_children.py"
WORKERS = 2
METHODS = ("stoker", "webdataset")


class Bench:
    """The two systems against one server, proxy and set."""

    def __init__(
        self, server: SeaweedServer, proxy: NetProxy, prep: Prepared, scratch: Path, epochs: int
    ) -> None:
        self.server, self.proxy, self.prep, self.scratch = server, proxy, prep, scratch
        self.epochs, self.runs = epochs, 0
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
        self.urls_file = scratch / "urls.json"
        self.urls_file.write_text(json.dumps(urls))

    def run(self, method: str) -> dict[str, Any]:
        """One run of ``method`` in its own process, a fresh disk cache; the proxy's bytes
        read at each epoch's end."""
        self.runs += 1
        cache = self.scratch / f"cache-{self.runs}"
        marks = [self.proxy.stats().bytes_down]

        def on_event(_event: dict[str, Any]) -> None:
            marks.append(self.proxy.stats().bytes_down)

        if method == "stoker":
            options = self.server.storage_options(self.proxy.endpoint)
            url = f"s3://{BUCKET}/{self.prep.key}/shards"
            args = [method, url, self.prep.transform, str(cache), str(self.epochs)]
            args.append(json.dumps(options))
        else:
            args = [method, str(self.urls_file), self.prep.transform, str(cache)]
            args.append(str(self.epochs))
        try:
            result = run_child(
                CHILD,
                args,
                env=s3_env(self.proxy.endpoint),
                rate_key="images_per_s",
                server_pid=self.server.pid,
                on_event=on_event,
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        for epoch, row in enumerate(result["epochs"]):
            row["store_bytes"] = marks[epoch + 1] - marks[epoch]
        result["epochs"][0]["first_batch_s"] = result["first_batch_s"]  # from process start
        print(f"[{method}] {summary(result)}", flush=True)
        return result


def summary(result: dict[str, Any]) -> str:
    epochs = ", ".join(
        f"epoch {r['epoch']} {r['images_per_s']:.0f} images/s, first batch "
        f"{r['first_batch_s']:.2f} s, {r['store_bytes'] / 1e6:.1f} MB from the store"
        for r in result["epochs"]
    )
    return f"{result['images_per_s']:.0f} images/s from process start ({epochs})"


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


def report(results: dict[str, Any], repeats: int) -> tuple[str, dict[str, bool]]:
    """The markdown table and the goals' checks."""
    data = results["data_bytes"]
    methods = results["methods"]
    starts = "; ".join(f"{m}: {methods[m]['start_method']}" for m in METHODS)
    lines = [
        f"{results['files']} photos ({results['mean_kb']:.0f} kB), {data / 1e6:.1f} MB of "
        f"shards, batches of {BATCH}, {WORKERS} workers, 20 ms / 1 Gbit/s proxy",
        "",
        *method_lines(
            repeats,
            "each system in a fresh process; its rate over the epochs is all epochs' images "
            "over the seconds from the process's start to its last batch; epoch 1's first "
            "batch is counted from the process's start, later epochs' from iter()",
            starts,
        ),
        "",
        "| method | epoch | first batch s | steady interval s | images/s | store MB | "
        "cache MB | cache / data |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        for r in methods[method]["epochs"]:
            cache = r["cache_bytes"]
            lines.append(
                f"| {method} | {r['epoch']} | {r['first_batch_s']:.2f} | "
                f"{r['steady_interval_s']:.3f} | {r['images_per_s']:.0f} | "
                f"{r['store_bytes'] / 1e6:.1f} | "
                + ("n/a | n/a |" if cache is None else f"{cache / 1e6:.1f} | {cache / data:.3f} |")
            )
    ours, theirs = methods["stoker"], methods["webdataset"]
    later = ours["epochs"][1:]
    rate, base = ours["images_per_s"], theirs["images_per_s"]
    checks = {
        "first batch of epochs 2+ within 2x a steady interval": all(
            r["first_batch_s"] <= 2 * r["steady_interval_s"] for r in later
        ),
        "disk-cache bytes per epoch <= 1.05x the data": all(
            r["cache_bytes"] <= 1.05 * data for r in later
        ),
        "images/s >= 1.5x the DataLoader's": rate >= 1.5 * base,
    }
    each = {m: ", ".join(f"{x:.0f}" for x in methods[m]["each_round"]) for m in METHODS}
    lines += [
        "",
        f"stoker {rate:.0f} images/s over {len(ours['epochs'])} epochs from process start "
        f"(rounds: {each['stoker']}), DataLoader + WebDataset {base:.0f} "
        f"(rounds: {each['webdataset']}): {rate / base:.2f}x",
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
    add_round_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.files = args.files or 1500
    repeats = rounds(args)
    scratch = Path(tempfile.mkdtemp(prefix="stoker-bench-torch-epochs-"))
    results: dict[str, Any] = {"machine": machine(), "args": vars(args), "repeats": repeats}
    try:
        with SeaweedServer() as server:
            server.create_bucket(BUCKET)
            link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.gbit * 125e6)
            with NetProxy("127.0.0.1", server.port, link=link) as proxy:
                prep = prepare_set(args.set, server, files=args.files)
                results.update(files=prep.files, mean_kb=prep.mean_kb, data_bytes=prep.shard_bytes)
                bench = Bench(server, proxy, prep, scratch, args.epochs)
                raw: dict[str, list[list[dict[str, Any]]]] = {m: [] for m in METHODS}

                def row(method: str) -> Any:
                    def run() -> dict[str, Any]:
                        result = bench.run(method)
                        raw[method].append(result["epochs"])
                        return result

                    return run

                methods = run_rounds({m: row(m) for m in METHODS}, repeats, rate_key="images_per_s")
                for method in METHODS:
                    methods[method]["epochs"] = median_epochs(raw[method])
                results["methods"] = methods
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text, checks = report(results, repeats)
    results["goals"] = checks
    write_report("torch_epochs", results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
