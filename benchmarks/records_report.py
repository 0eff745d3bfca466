"""The table of ``records.py`` and issue 23's acceptance checks, computed from its results."""

from __future__ import annotations

import argparse
import os
from typing import Any

from harness import method_lines, vs_strongest
from loader_report import CLOCKS, epoch_cells
from loader_sets import BATCH
from quiet import SETTLED_BUSY, settled_text
from stoker.pipeline.order import default_window_start

NAMES = {
    "pairs_stoker": "stoker on the tars indexed in place, RandomResizedCrop(224), every field",
    "pairs_stoker_packed": "stoker on the records packed, RandomResizedCrop(224), every field",
    "pairs_webdataset": "WebDataset + DataLoader(num_workers=2), PIL, every field",
    "arrays_limit": "numpy loop in RAM, no I/O (np.load + np.stack, 1 thread): the limit",
    "arrays_stoker": "stoker on the tars indexed in place, every field",
    "arrays_stoker_packed": "stoker on the records packed, every field",
    "arrays_stoker_loopback": "stoker on the tars, no proxy (SeaweedFS on loopback)",
    "arrays_stoker_local": "stoker on the tars on local disk",
}
BASELINES = {"pairs": "pairs_webdataset", "arrays": "arrays_limit"}
SET_NAMES = {"pairs": "jpg + txt + json", "arrays": "npy (40 kB float32) + cls"}
# Issue 23's acceptance bounds.
VS_WEBDATASET = 1.5
VS_NUMPY = 0.8
MAX_BYTES_RATIO = 1.02
MAX_FIRST_BATCH_S = 1.0


def _row(part: str, r: dict[str, Any], method: str) -> str:
    row = r[method]
    rate = row["samples_per_s"]
    baseline = r.get(BASELINES[part], {}).get("samples_per_s")
    first = row.get("first_batch_s")
    kb = r["shard_bytes"] / r["count"] / 1e3
    cells = [
        f"{part} ({SET_NAMES[part]}, {kb:.0f} kB)",
        NAMES[method],
        f"{row['samples']:,}",
        f"{rate:,.0f}",
        f"{rate / baseline:.2f}x" if baseline else "",
        "" if first is None else f"{first:.2f}",
        CLOCKS.get(row.get("clock", ""), ""),
    ]
    cells += epoch_cells(row, row["samples"], cpu_digits=3)
    return "| " + " | ".join(cells) + " |"


def ceiling(r: dict[str, Any], args: argparse.Namespace, data_bytes: int | None = None) -> float:
    """Samples/s the link carries of the tars (or of ``data_bytes``): no loader that
    streams them in its timed epoch can feed more."""
    return args.gbit * 125e6 / ((data_bytes or r["shard_bytes"]) / r["count"])


def _check(label: str, measured: float | None, bound: float, upper: bool, shown: str) -> Any:
    if measured is None:
        return {"check": label, "measured": None, "bound": bound, "result": "not run"}
    ok = measured <= bound if upper else measured >= bound
    return {
        "check": label,
        "measured": measured,
        "bound": bound,
        "shown": shown,
        "result": "PASS" if ok else "FAIL",
    }


def acceptance(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 23's acceptance bounds, each with its measured value and PASS/FAIL, for stoker
    on the tars indexed in place and on the records packed."""
    checks = []
    pairs = results.get("pairs", {})
    theirs = pairs.get("pairs_webdataset")
    for method, how in (("pairs_stoker", "indexed in place"), ("pairs_stoker_packed", "packed")):
        stoker = pairs.get(method)
        if stoker is None:
            continue
        ratio = stoker["samples_per_s"] / theirs["samples_per_s"] if theirs else None
        label = f"pairs, {how}: stoker / WebDataset samples/s >= {VS_WEBDATASET:g}x"
        checks.append(_check(label, ratio, VS_WEBDATASET, False, f"{ratio or 0:.2f}x"))
        read = stoker["bytes_per_epoch"] / stoker["data_bytes"]
        label = f"pairs, {how}: stoker's bytes per epoch / its shards' <= {MAX_BYTES_RATIO}x"
        checks.append(_check(label, read, MAX_BYTES_RATIO, True, f"{read:.3f}x"))
        first = stoker["first_batch_s"]
        label = f"pairs, {how}: stoker's first batch after process start <= {MAX_FIRST_BATCH_S:g} s"
        checks.append(_check(label, first, MAX_FIRST_BATCH_S, True, f"{first:.2f} s"))
    arrays = results.get("arrays", {})
    limit = arrays.get("arrays_limit")
    for method, how in (("arrays_stoker", "indexed in place"), ("arrays_stoker_packed", "packed")):
        stoker = arrays.get(method)
        if stoker is None:
            continue
        ratio = stoker["samples_per_s"] / limit["samples_per_s"] if limit else None
        label = f"arrays, {how}: stoker through the proxy / numpy loop in RAM >= {VS_NUMPY:g}x"
        checks.append(_check(label, ratio, VS_NUMPY, False, f"{ratio or 0:.2f}x"))
    return checks


def _extras(part: str, r: dict[str, Any], args: argparse.Namespace) -> list[str]:
    lines = []
    for method in (f"{part}_stoker", f"{part}_stoker_packed"):
        if method not in r:
            continue
        s = r[method]
        how = "packed" if method.endswith("packed") else "the tars"
        top = ceiling(r, args, s["data_bytes"])
        kb = s["data_bytes"] / r["count"] / 1e3
        lines.append(
            f"| {part} | the link's ceiling on {how} ({args.gbit:g} Gbit/s / {kb:.1f} kB "
            f"a record): samples/s; stoker's share of it | {top:,.0f}; "
            f"{s['samples_per_s'] / top:.0%} |"
        )
        lines.append(
            f"| {part} | cores taken by server + proxy during stoker's run on {how} | "
            f"{s['server_cores']:.2f} + {s['proxy_cores']:.2f} |"
        )
        lines.append(
            f"| {part} | stoker on {how}, its own count: MB read, GETs; decode threads, "
            f"prefetch | "
            f"{s['own_bytes_read'] / 1e6:,.1f}, {s['own_gets']:,}; {s['threads']}, "
            f"{s['prefetch']} |"
        )
        stages = ", ".join(
            f"{name} {seconds:.2f}"
            for name, (seconds, _calls) in s["stages"].items()
            if name in ("index", "fetch", "decode", "collate", "wait.fetch", "wait.decode")
        )
        lines.append(f"| {part} | stoker on {how}: stage seconds (first round) | {stages} |")
        start = s.get("start_s", 0.0)
        first = s["first_batch_s"] - start - s["import_s"] - s["open_s"]
        group_mb = s["block_size"] * s["group_blocks"] * kb / 1e3
        # The window's narrow start, or the groups a first batch spans if more.
        group_records = s["block_size"] * s["group_blocks"]
        first_groups = max(default_window_start(s["window"]), -(-BATCH // group_records))
        lines.append(
            f"| {part} | stoker on {how}: first batch s = interpreter start + imports + "
            f"Loader open + first batch; the order's blocks, read groups and window | "
            f"{start:.2f} + {s['import_s']:.2f} + {s['open_s']:.2f} + {first:.2f}; "
            f"{s['block_size']} records a block, "
            f"{s['group_blocks']} blocks a group ({group_mb:.1f} MB), a window of "
            f"{s['window']} groups; {first_groups} groups "
            f"(~{min(first_groups * group_mb, s['data_bytes'] / 1e6):.0f} MB read before "
            "the first batch) |"
        )
        fields = ", ".join(f"{k}: {v}" for k, v in s["fields"].items())
        lines.append(f"| {part} | stoker on {how}: its batch | {fields} |")
    for method in r:
        if method in NAMES:
            each = ", ".join(f"{x:,.0f}" for x in r[method]["each_round"])
            lines.append(f"| {part} | samples/s of each round: {NAMES[method]} | {each} |")
    return lines


def report(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown table and the acceptance summary; and the checks, for the JSON."""
    machine = results["machine"]
    before = ", ".join(f"{x:.2f}" for x in machine["load_before"])
    after = ", ".join(f"{x:.2f}" for x in machine["load_after"])
    parts = [p for p in ("pairs", "arrays") if p in results]
    settled = settled_text([row for part in parts for row in results[part].values()])
    web = results.get("pairs", {}).get("pairs_webdataset", {})
    lines = [
        f"# Records benchmark: batches of 256, {args.rtt_ms:g} ms RTT, {args.gbit:g} Gbit/s, "
        f"{os.cpu_count()} CPUs, cold",
        "",
        *method_lines(
            args.repeats,
            "each method but the numpy loop in a fresh process; samples/s are its samples "
            "over the seconds from the process's start to its last batch, and its first "
            "batch is counted from the process's start; the numpy loop times its loop in RAM",
            "WebDataset's DataLoader: "
            + web.get("start_method", "not run")
            + "; stoker's Loader runs its decode threads in its own process",
        ),
        "",
        f"Load average before: {before}; after: {after}. Read per epoch: the proxy's bytes and "
        "requests against the bytes the method reads: the tars (the same objects for both "
        "loaders, indexed in place), or stoker's packed shards. "
        "CPU ms per sample: the method's own process over its timed epoch. Before each "
        "method the harness waits for the machine to settle (cores at most "
        f"{SETTLED_BUSY:.0%} busy and the server idle, within --settle-s; the written data "
        "synced once before the first); every interpreter it starts (stoker's children, the "
        "DataLoader's workers) reads bytecode compiled once by an untimed import of its "
        "modules, as an installed package has it. "
        f"Settled before the methods: {settled}.",
        "",
        "| set | method | samples | samples/s | vs baseline | first batch s | clock "
        "| MB read per epoch | x the tars | requests per epoch | peak RSS MB "
        "| CPU ms per sample |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for part in parts:
        for method in NAMES:
            if method in results[part]:
                lines.append(_row(part, results[part], method))
    lines += ["", "| set | extra | value |", "| --- | --- | --- |"]
    for part in parts:
        lines += _extras(part, results[part], args)
    if "pairs" in results:
        ours = ["pairs_stoker", "pairs_stoker_packed"]
        lines += ["", "Against the strongest baseline (pairs: WebDataset):", ""]
        lines += vs_strongest(
            results["pairs"], ours, ["pairs_webdataset"], "samples_per_s", NAMES, args.repeats
        )
    checks = acceptance(results)
    lines += ["", "## Issue 23 acceptance", "", "| check | measured | result |"]
    lines.append("| --- | ---: | :---: |")
    for c in checks:
        lines.append(f"| {c['check']} | {c.get('shown', '')} | {c['result']} |")
    for part, method, bound in (
        ("pairs", "pairs_webdataset", VS_WEBDATASET),
        ("arrays", "arrays_limit", VS_NUMPY),
    ):
        if method in results.get(part, {}):
            wanted = bound * results[part][method]["samples_per_s"]
            top = ceiling(results[part], args)
            if wanted > top:
                lines.append(
                    f"\n- {part}: {bound:g}x {NAMES[method].split(',')[0]} is {wanted:,.0f} "
                    f"samples/s, more than the link carries of the tars ({top:,.0f}); no "
                    "loader that streams them in the timed epoch can meet it on this link."
                )
    return "\n".join(lines), checks
