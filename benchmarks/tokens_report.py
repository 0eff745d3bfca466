"""The table of ``tokens.py`` and issue 24's goals, computed from its results."""

from __future__ import annotations

import argparse
from typing import Any

from harness import method_lines
from quiet import settled_text

NAMES = {
    "ceiling": "the link's ceiling (what it carries of uint16 tokens)",
    "stoker": "stoker TokenLoader, cold",
    "stoker_warm": "stoker TokenLoader, second epoch from its disk cache",
    "mosaic": "Mosaic Streaming StreamingDataset (MDS), cold",
    "memmap": "numpy memmap loop, local disk, uint16 rows (input_ids, targets: views)",
    "memmap_int64": "numpy memmap loop, local disk, int64 input_ids, targets, labels (as stoker)",
}
# Issue 24's goals: shown beside what was measured, never asserted.
VS_CEILING = 0.8
VS_LITDATA_CPU = 0.5
VS_MEMMAP = 0.5
MAX_BYTES_RATIO = 1.02
MAX_FIRST_BATCH_S = 1.0


def ceiling_tokens_per_s(args: argparse.Namespace) -> float:
    """Tokens of ``input_ids`` per second the link carries: its bytes/s of uint16 stream
    tokens, ``seq_len`` of every ``seq_len + 1`` read being inputs."""
    return float(args.gbit * 125e6 / 2 * args.seq_len / (args.seq_len + 1))


def _name(method: str, row: dict[str, Any]) -> str:
    if method.startswith("litdata_"):
        workers = row["workers"]
        return f"LitData StreamingDataset + TokensLoader, {workers} worker(s), cold"
    return NAMES[method]


def litdata_baseline(methods: dict[str, Any]) -> dict[str, Any] | None:
    """The fastest LitData row (one per worker count), the baseline of the goals."""
    rows = [row for name, row in methods.items() if name.startswith("litdata_")]
    return max(rows, key=lambda row: row["tokens_per_s"]) if rows else None


def _row(method: str, row: dict[str, Any], base: dict[str, float | None], args: Any) -> str:
    rate = row["tokens_per_s"]
    litdata_rate, litdata_cpu = base["rate"], base["cpu"]
    cpu = row["cpu_s"] / row["tokens"] * 1e9 if "cpu_s" in row else None
    first = row.get("first_batch_s")
    cells = [
        _name(method, row),
        f"{rate / 1e6:,.2f}",
        f"{rate / ceiling_tokens_per_s(args):.2f}x",
        f"{rate / litdata_rate:.2f}x" if litdata_rate else "",
        f"{cpu:,.0f}" if cpu is not None else "",
        f"{cpu / litdata_cpu:.2f}x" if cpu is not None and litdata_cpu else "",
    ]
    if "bytes_per_epoch" in row:
        cells += [
            f"{row['bytes_per_epoch'] / 1e6:,.0f}",
            f"{row['bytes_per_epoch'] / base['token_bytes']:.3f}x",
            f"{row['requests_per_epoch']:,.0f}",
        ]
    else:
        cells += ["", "", ""]
    cells += [
        "" if first is None else f"{first:.2f} ({row['import_s']:.2f})",
        f"{row['peak_rss_mb']:,.0f}" if "peak_rss_mb" in row else "",
    ]
    return "| " + " | ".join(cells) + " |"


def _goal(label: str, measured: float | None, bound: float, upper: bool, shown: str) -> Any:
    if measured is None:
        return {"goal": label, "measured": None, "bound": bound, "result": "not run"}
    met = measured <= bound if upper else measured >= bound
    return {
        "goal": label,
        "measured": measured,
        "bound": bound,
        "shown": shown,
        "result": "met" if met else "not met",
    }


def goals(results: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Issue 24's goals, each with its measured value and whether it was met."""
    methods = results["methods"]
    cold, warm = methods.get("stoker"), methods.get("stoker_warm")
    litdata, memmap = litdata_baseline(methods), methods.get("memmap_int64")
    memmap_views = methods.get("memmap")
    token_bytes = results["corpus"]["token_bytes"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def cpu(row: dict[str, Any] | None) -> float | None:
        return row["cpu_s"] / row["tokens"] if row else None

    rate = cold["tokens_per_s"] if cold else None
    out = []
    vs_link = ratio(rate, ceiling_tokens_per_s(args))
    out.append(
        _goal(
            f"cold tokens/s >= {VS_CEILING:g}x the link's ceiling",
            vs_link,
            VS_CEILING,
            False,
            f"{vs_link:.2f}x" if vs_link else "",
        )
    )
    vs_lit = ratio(rate, litdata["tokens_per_s"] if litdata else None)
    out.append(
        _goal(
            "cold tokens/s ahead of LitData's",
            vs_lit,
            1.0,
            False,
            f"{vs_lit:.2f}x" if vs_lit else "",
        )
    )
    vs_cpu = ratio(cpu(cold), cpu(litdata))
    out.append(
        _goal(
            f"cold CPU s per token <= {VS_LITDATA_CPU:g}x LitData's",
            vs_cpu,
            VS_LITDATA_CPU,
            True,
            f"{vs_cpu:.2f}x" if vs_cpu else "",
        )
    )
    warm_rate = warm["tokens_per_s"] if warm else None
    vs_mm = ratio(warm_rate, memmap["tokens_per_s"] if memmap else None)
    vs_views = ratio(warm_rate, memmap_views["tokens_per_s"] if memmap_views else None)
    out.append(
        _goal(
            f"warm tokens/s >= {VS_MEMMAP:g}x the memmap loop (the same int64 arrays)",
            vs_mm,
            VS_MEMMAP,
            False,
            (f"{vs_mm:.2f}x" if vs_mm else "")
            + (f"; {vs_views:.2f}x the uint16 views loop" if vs_views else ""),
        )
    )
    multiple = ratio(cold["bytes_per_epoch"] if cold else None, token_bytes)
    out.append(
        _goal(
            f"cold bytes per epoch <= {MAX_BYTES_RATIO:g}x the token bytes",
            multiple,
            MAX_BYTES_RATIO,
            True,
            f"{multiple:.3f}x" if multiple else "",
        )
    )
    first = cold["first_batch_s"] if cold else None
    out.append(
        _goal(
            f"first batch <= {MAX_FIRST_BATCH_S:g} s after process start",
            first,
            MAX_FIRST_BATCH_S,
            True,
            f"{first:.2f} s" if first is not None else "",
        )
    )
    return out


def report(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, list[Any]]:
    """The Markdown table, the libraries and the goals; and the goals as data."""
    methods = results["methods"]
    corpus = results["corpus"]
    litdata = litdata_baseline(methods)
    base = {
        "rate": litdata["tokens_per_s"] if litdata else None,
        "cpu": litdata["cpu_s"] / litdata["tokens"] * 1e9 if litdata else None,
        "token_bytes": corpus["token_bytes"],
    }
    lines = [
        f"# Token streams: {corpus['tokens'] / 1e6:,.0f} M uint16 tokens "
        f"({corpus['token_bytes'] / 1e6:,.0f} MB, {corpus['documents']:,} documents), "
        f"seq_len {args.seq_len}, batches of {args.batch}",
        "",
        *method_lines(
            args.repeats,
            "each method in a fresh process; tokens/s are its tokens over the seconds from "
            "the process's start to its last batch (imports, opening, workers' start-up "
            "counted), its first batch counted from the same start; the warm row times its "
            "second epoch's loop alone, and the memmap rows (its bound) their loop alone",
            "LitData's and Mosaic's DataLoaders: the platform's default start method "
            "(fork on Linux); stoker's TokenLoader reads in its own process",
        ),
        "",
        f"SeaweedFS behind a {args.rtt_ms:g} ms / {args.gbit:g} Gbit/s proxy; one whole "
        f"epoch each, medians of {args.repeats} round(s); {results['machine']['cpus']} CPUs, "
        f"load {results['machine']['load_before'][0]:.1f} before. Tokens are those of "
        "input_ids; CPU is the method's processes over the timed epoch; bytes and GETs per "
        "epoch are the proxy's counts (warm: the loader's own, of its second epoch), the "
        "index included; the first batch is counted from the process's start, its import "
        "in brackets. Before each run the harness waited for the machine to settle "
        f"({settled_text(list(methods.values()))}), and every process imported from "
        "bytecode compiled once beforehand, as from an installed package.",
        "",
        "| method | M tokens/s | x link ceiling | x LitData (fastest) | CPU s / 1e9 tokens "
        "| x LitData CPU | MB / epoch | x token bytes | GETs / epoch | first batch s (import) "
        "| peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        _row("ceiling", {"tokens_per_s": ceiling_tokens_per_s(args), "tokens": 1}, base, args),
    ]
    order = ["stoker", "stoker_warm", *sorted(m for m in methods if m.startswith("litdata_"))]
    order += ["mosaic", "memmap", "memmap_int64"]
    lines += [_row(m, methods[m], base, args) for m in order if m in methods]
    lines += ["", "Libraries:"]
    for name, lib in results["libraries"].items():
        if lib["ok"]:
            lines.append(
                f"- {name} {lib['version']}: licence {lib['license_field'] or '(none in metadata)'}"
                f"; the wheel's licence file: {lib['license_file'][:60]!r}"
                + (f"; {lib['note']}" if lib.get("note") else "")
            )
        else:
            lines.append(f"- {name}: not run ({lib['error']})")
    cold = methods.get("stoker")
    if cold:
        own, token_bytes = cold["own_bytes_read"], corpus["token_bytes"]
        lines += [
            "",
            f"stoker cold read {cold['bytes_per_epoch'] / token_bytes:.3f}x the token bytes "
            f"through the proxy: its epoch's own reads (after the loader was made) "
            f"{own / token_bytes:.3f}x, the rest ({(cold['bytes_per_epoch'] - own) / 1e6:,.1f}"
            " MB) the index it read first, response headers and any read it dropped.",
        ]
    checks = goals(results, args)
    lines += ["", "Issue 24's goals (shown, not asserted):"]
    lines += [f"- {g['goal']}: {g.get('shown') or '-'} ({g['result']})" for g in checks]
    return "\n".join(lines), checks
