"""The table of ``loader.py`` and issue 16's acceptance checks, computed from its results."""

from __future__ import annotations

import argparse
import os
from typing import Any

from harness import method_lines, vs_strongest

NAMES = {
    "limit_full": "in RAM, no I/O: simplejpeg full decode + OpenCV resize",
    "limit_planned": "in RAM, no I/O: stoker's decode (DCT scaling)",
    "stoker": "stoker, defaults",
    "stoker_cached": "stoker, second epoch from its disk cache",
    "stoker_folder": "stoker, unpacked folder (a GET per image)",
    "tfdata": "tf.data: TFRecords downloaded in parallel, guide's pipeline",
    "per_object": "DataLoader, per-object GETs",
    "download_folder": "download, then folder DataLoader",
    "webdataset": "WebDataset, same shards",
}
TRANSFORM_NAMES = {"crop": "RandomResizedCrop(224) + flip", "resize": "Resize(224x224) + flip"}
BASELINES = ("tfdata", "per_object", "download_folder", "webdataset")
CLOCKS = {"launch": "process start", "loop": "2nd epoch's loop", "in RAM": "decode loop"}
# Issue 16's acceptance bounds.
VS_TFDATA = 1.2
VS_FULL_DECODE = {"a": 1.0, "b": 0.65}
MAX_BYTES_RATIO = 1.02
MAX_FIRST_BATCH_S = 1.0
MAX_RSS_BYTES = 1e9


def _row(name: str, r: dict[str, Any], method: str) -> str:
    row = r[method]
    rate = row["images_per_s"]
    full = r.get("limit_full", {}).get("images_per_s")
    stoker = r.get("stoker", {}).get("images_per_s")
    first = row.get("first_batch_s")
    cells = [
        f"{name} ({r['mean_kb']:.0f} kB)",
        NAMES[method],
        str(row["images"]),
        f"{rate:,.0f}",
        f"{rate / full:.2f}x" if full else "",
        f"{stoker / rate:.2f}x" if stoker else "",
        "" if first is None else f"{first:.2f}",
        CLOCKS.get(row.get("clock", ""), ""),
    ]
    cells += epoch_cells(row, row["images"], cpu_digits=2)
    return "| " + " | ".join(cells) + " |"


def epoch_cells(row: dict[str, Any], items: int, *, cpu_digits: int) -> list[str]:
    """A method's MB, data multiple and requests per epoch (``~`` where scaled up from part
    of one), its peak RSS MB and CPU ms per item: empty cells where it has none."""
    cells = ["", "", ""]
    if "bytes_per_epoch" in row:
        approx = "~" if row["epoch_scale"] != 1.0 else ""
        cells = [
            f"{approx}{row['bytes_per_epoch'] / 1e6:,.1f}",
            f"{approx}{row['bytes_per_epoch'] / row['data_bytes']:.3f}x",
            f"{approx}{row['requests_per_epoch']:,.0f}",
        ]
    cells.append(f"{row['peak_rss_mb']:,.0f}" if "peak_rss_mb" in row else "")
    cpu = f"{row['cpu_s'] / items * 1e3:.{cpu_digits}f}" if "cpu_s" in row else ""
    return [*cells, cpu]


def link_rate(args: argparse.Namespace) -> float:
    """The proxy's link rate in bytes/s (runs before ``--gbit`` used 1 Gbit/s)."""
    return getattr(args, "gbit", 1.0) * 125e6


def link_ceiling(r: dict[str, Any], args: argparse.Namespace) -> float:
    """Images/s the link carries of the shards: no method that streams them in its timed
    epoch can feed more."""
    return link_rate(args) / (r["shard_bytes"] / r["files"])


def _check(
    label: str, measured: float | None, bound: float, upper: bool, shown: str
) -> dict[str, Any]:
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


def acceptance(results: dict[str, Any], sets: list[str]) -> list[dict[str, Any]]:
    """Issue 16's acceptance bounds, each with its measured value and PASS/FAIL."""
    checks = []
    for name in sets:
        r = results[name]
        stoker = r.get("stoker")
        rate = stoker["images_per_s"] if stoker else None
        tf = r.get("tfdata", {}).get("images_per_s")
        full = r.get("limit_full", {}).get("images_per_s")
        ratio = rate / tf if rate and tf else None
        checks.append(
            _check(
                f"set {name}: stoker / tf.data images/s >= {VS_TFDATA:g}x",
                ratio,
                VS_TFDATA,
                False,
                f"{ratio:.2f}x" if ratio else "",
            )
        )
        bound = VS_FULL_DECODE.get(name[0], 1.0)
        ratio = rate / full if rate and full else None
        checks.append(
            _check(
                f"set {name}: stoker / in-RAM full decode images/s >= {bound:g}x",
                ratio,
                bound,
                False,
                f"{ratio:.2f}x" if ratio else "",
            )
        )
        if stoker is None:
            continue
        read = stoker["bytes_per_epoch"] / stoker["data_bytes"]
        approx = " (scaled from part of an epoch)" if stoker["epoch_scale"] != 1.0 else ""
        checks.append(
            _check(
                f"set {name}: stoker's bytes read per epoch / shard bytes <= {MAX_BYTES_RATIO}x",
                read,
                MAX_BYTES_RATIO,
                True,
                f"{read:.3f}x{approx}",
            )
        )
        first = stoker["first_batch_s"]
        checks.append(
            _check(
                f"set {name}: stoker's first batch after process start <= {MAX_FIRST_BATCH_S:g} s",
                first,
                MAX_FIRST_BATCH_S,
                True,
                f"{first:.2f} s",
            )
        )
        rss = stoker["peak_rss_mb"] * 2**20
        checks.append(
            _check(
                f"set {name}: stoker's peak RSS <= 1 GB (10^9 bytes)",
                rss,
                MAX_RSS_BYTES,
                True,
                f"{rss / 1e9:.2f} GB",
            )
        )
    return checks


def report(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown table and the acceptance summary; and the checks, for the JSON."""
    sets = args.sets.split(",")
    starts = {
        row["start_method"]
        for name in sets
        for row in results[name].values()
        if isinstance(row, dict) and "start_method" in row
    }
    lines = [
        f"# Loader benchmark: batches of 256 uint8 224x224, {args.rtt_ms:g} ms RTT, "
        f"{link_rate(args) * 8 / 1e9:g} Gbit/s, {os.cpu_count()} CPUs",
        "",
        *method_lines(
            args.repeats,
            "each method but the in-RAM rows in a fresh process; images/s are its images over "
            "the seconds from the process's start to its last batch, and its first batch is "
            "counted from the process's start (imports, listing or index, worker start-up and "
            "tf.data's download included); the disk-cache row times its second epoch's loop, "
            "the in-RAM rows their decoding loop (the clock column)",
            "the DataLoaders' workers: "
            + (", ".join(sorted(starts)) or "none ran")
            + "; stoker's Loader runs its decode threads in its own process",
        ),
        "",
        "Read per epoch: the proxy's bytes and requests (~: scaled up from part of an epoch), "
        "against the bytes of the objects the method reads (shards, TFRecords or originals). "
        "CPU ms per image: the method's own process over its timed epoch (the in-RAM rows: "
        "over their decoding; the DataLoaders: the training process only, not its workers).",
        "",
        "| set | method | images | images/s | vs full decode in RAM | stoker is | first batch s "
        "| clock | MB read per epoch | x its data | requests per epoch | peak RSS MB "
        "| CPU ms per image |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in sets:
        r = results[name]
        for method in NAMES:
            if method in r:
                lines.append(_row(name, r, method))
    lines += ["", "| set | transform | extra | value |", "| --- | --- | --- | ---: |"]
    for name in sets:
        r = results[name]
        transform = TRANSFORM_NAMES[r["transform"]]
        for method in ("stoker", "tfdata"):
            if method in r:
                row = r[method]
                lines.append(
                    f"| {name} | {transform} | cores taken by server + proxy during "
                    f"{NAMES[method].split(':')[0]} | "
                    f"{row['server_cores']:.2f} + {row['proxy_cores']:.2f} |"
                )
        if "stoker" in r:
            s = r["stoker"]
            ceiling = link_ceiling(r, args)
            gbit, image_kb = link_rate(args) * 8 / 1e9, r["shard_bytes"] / r["files"] / 1e3
            lines.append(
                f"| {name} | {transform} | the link's ceiling on the shards "
                f"({gbit:g} Gbit/s / {image_kb:.1f} kB an image): images/s; stoker's share "
                f"of it | {ceiling:,.0f}; "
                f"{s['images_per_s'] / ceiling:.0%} |"
            )
            lines.append(
                f"| {name} | {transform} | stoker's own count: MB read, GETs (its run) | "
                f"{s['own_bytes_read'] / 1e6:,.1f}, {s['own_gets']:,} |"
            )
            lines.append(
                f"| {name} | {transform} | stoker's autotune ended on | "
                f"{s['threads']} threads, prefetch {s['prefetch']} ({s['autotune']}) |"
            )
        if "stoker_cached" in r:
            c = r["stoker_cached"]
            lines.append(
                f"| {name} | {transform} | stoker with a disk cache: the first epoch (filling "
                f"it) s; the second's MB and GETs from the store | {c['first_epoch_s']:.1f}; "
                f"{c['own_bytes_read'] / 1e6:,.1f}, {c['own_gets']:,} |"
            )
        if "stoker" in r and "stoker_folder" in r:
            packed, folder = r["stoker"], r["stoker_folder"]
            speedup = packed["images_per_s"] / folder["images_per_s"]
            lines.append(
                f"| {name} | {transform} | stoker on packed shards / on the unpacked folder: "
                f"images/s, first batch s | {speedup:.2f}x, "
                f"{packed['first_batch_s']:.2f} vs {folder['first_batch_s']:.2f} |"
            )
        for method, label in (("tfdata", "tf.data's download"), ("download_folder", "download")):
            if method in r:
                lines.append(
                    f"| {name} | {transform} | {label} of all | {r[method]['download_s']:.1f} s |"
                )
    lines += ["", "stoker against the strongest baseline (tf.data and the DataLoaders):", ""]
    for name in sets:
        lines += [
            f"- set {name}: {line[2:]}"
            for line in vs_strongest(
                results[name], ["stoker"], BASELINES, "images_per_s", NAMES, args.repeats
            )
        ]
    checks = acceptance(results, sets)
    lines += ["", "## Issue 16 acceptance", "", "| check | measured | result |"]
    lines.append("| --- | ---: | :---: |")
    for c in checks:
        lines.append(f"| {c['check']} | {c.get('shown', '')} | {c['result']} |")
    lines += _beyond_the_link(results, sets, args)
    lines += _from_local_disk(results, sets)
    return "\n".join(lines), checks


def _from_local_disk(results: dict[str, Any], sets: list[str]) -> list[str]:
    """The images/s bounds for stoker's second epoch from its disk cache: local disk on
    both sides, as tf.data's timed epoch reads the TFRecords it downloaded."""
    notes = []
    for name in sets:
        r = results[name]
        cached = r.get("stoker_cached", {}).get("images_per_s")
        if not cached:
            continue
        parts = []
        if "tfdata" in r:
            parts.append(f"{cached / r['tfdata']['images_per_s']:.2f}x tf.data")
        if "limit_full" in r:
            parts.append(f"{cached / r['limit_full']['images_per_s']:.2f}x the in-RAM row")
        notes.append(
            f"- set {name}, stoker's second epoch from its disk cache (local disk, as "
            f"tf.data's epoch): {cached:,.0f} images/s, " + ", ".join(parts) + "."
        )
    return ["", *notes] if notes else []


def _beyond_the_link(
    results: dict[str, Any], sets: list[str], args: argparse.Namespace
) -> list[str]:
    """A note for each images/s bound that asks stoker, which streams the shards in its
    timed epoch, for more images/s than the link carries of them."""
    notes = []
    for name in sets:
        r = results[name]
        if "shard_bytes" not in r or "files" not in r:
            continue
        ceiling = link_ceiling(r, args)
        wanted = []
        if "tfdata" in r:
            wanted.append((f"{VS_TFDATA:g}x tf.data", VS_TFDATA * r["tfdata"]["images_per_s"]))
        if "limit_full" in r:
            bound = VS_FULL_DECODE.get(name[0], 1.0)
            wanted.append((f"{bound:g}x in-RAM", bound * r["limit_full"]["images_per_s"]))
        for label, rate in wanted:
            if rate > ceiling:
                notes.append(
                    f"- set {name}: {label} is {rate:,.0f} images/s, more than the link carries "
                    f"of the shards ({ceiling:,.0f}); no loader that streams them in the timed "
                    "epoch can meet it on this link."
                )
    return ["", *notes] if notes else []
