"""The one harness of the benchmarks that race stoker against baselines (loader.py,
records.py, tokens.py, torch_epochs.py, ray_read.py): each system in a fresh child
process, rounds in a rotated order, medians, the ratio against the strongest baseline and
one report writer.

The clock. Every system runs in a child process of its own and its clock starts when the
harness starts that process (``time.time()`` just before ``Popen``): its imports, opening
its index or listing, starting its workers and its first batch are all counted, for every
system alike. A child reports absolute times (``first_batch_at``, ``ended_at``: the last
batch) and the units it delivered; the harness turns them into ``first_batch_s`` and
``total_s`` from the launch and the headline rate, units over ``total_s``. The rate of the
child's own loop (from its first ``next()``) is kept beside it as ``loop_<rate>``. Where a
benchmark has a common start point inside each child instead (Ray: the call that makes
the dataset, after the cluster has started), the child reports it and every system is
timed from it. Rows whose timed part is a later epoch (a disk cache's second epoch) or a
loop with no process (the in-RAM limits) say so in the report.

Rounds. ``--repeats`` rounds (3 by default); round ``r`` runs the methods rotated by ``r``
(each method takes each place in turn); every number is the median over the rounds, and a
ratio is the ratio of medians. Fewer than 3 rounds is a smoke run and the report says its
ratios are not to be quoted.

Child side: a child imports ``peak_rss_mb``, ``emit`` and ``event`` from here, which
brings only standard-library modules (a few milliseconds, the same for every system).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"
#: Fewer rounds than this and a report's ratios are a smoke run's.
QUOTABLE_ROUNDS = 3

# --- child side (standard library only) ------------------------------------------------


def peak_rss_mb() -> float:
    """This process's own peak RSS in MB (VmHWM; ru_maxrss carries a forked parent's over
    exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def event(name: str, **fields: Any) -> None:
    """Tell the harness something mid-run (an epoch ended): one JSON line with ``event``;
    the harness hands it to the run's ``on_event`` as it arrives."""
    print(json.dumps({"event": name, "at": time.time(), **fields}), flush=True)


def emit(result: Mapping[str, Any]) -> None:
    """The child's result: its last line of output, one JSON object. It carries ``units``
    (what it delivered), ``first_batch_at`` and ``ended_at`` (``time.time()``), and
    ``start_method`` where it started worker processes."""
    print(json.dumps(dict(result)), flush=True)


def default_start_method() -> str:
    """The platform's default start method for worker processes (fork on Linux up to
    Python 3.13), which the torch baselines' DataLoaders get by passing none."""
    return multiprocessing.get_start_method(allow_none=False)


# --- parent side -------------------------------------------------------------------------


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (None: this one), from /proc."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def s3_env(endpoint: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment plus the bucket's endpoint and credentials (the ``AWS_*``
    variables, and Mosaic Streaming's ``S3_ENDPOINT_URL``)."""
    from stoker.testing.seaweed import ACCESS_KEY, REGION, SECRET_KEY

    return {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        **(extra or {}),
    }


def run_child(
    script: Path,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    rate_key: str,
    server_pid: int | None = None,
    clock: str = "launch",
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run ``python script args`` and return its result with the harness's clock.

    ``clock="launch"``: timed from the moment the process was started. ``clock`` another
    name: timed from the child's ``<name>`` (a common start point every system reports).
    ``clock="loop"``: the child's own loop rate stays the headline (a later epoch).
    Adds ``first_batch_s``, ``total_s``, ``rate_key`` (units / total_s, the loop's rate
    kept as ``loop_<rate_key>``), the wall time and the cores the server and this process
    (the proxy's thread) took meanwhile.
    """
    server_cpu, harness_cpu = cpu_seconds(server_pid) if server_pid else 0.0, cpu_seconds(None)
    with tempfile.TemporaryFile("w+") as stderr:
        launched = time.time()
        with subprocess.Popen(
            [sys.executable, str(script), *args],
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        ) as process:
            assert process.stdout is not None
            last: dict[str, Any] | None = None
            for line in process.stdout:
                try:
                    parsed = json.loads(line)
                except ValueError:
                    continue
                if isinstance(parsed, dict) and "event" in parsed:
                    if on_event is not None:
                        on_event(parsed)
                elif isinstance(parsed, dict):
                    last = parsed
            code = process.wait()
        wall = time.time() - launched
        if code or last is None:
            stderr.seek(0)
            raise RuntimeError(
                f"{script.name} {' '.join(args[:1])} failed:\n{stderr.read()[-4000:]}"
            )
    result = last
    start = launched if clock in ("launch", "loop") else result[clock]
    result["clock"] = clock
    result["launched_at"] = launched
    result["start_after_launch_s"] = start - launched
    result["first_batch_s"] = result.pop("first_batch_at") - start
    result["total_s"] = result.pop("ended_at") - start
    result["loop_" + rate_key] = result.get(rate_key)
    if clock != "loop":
        result[rate_key] = result["units"] / result["total_s"]
    result["wall_s"] = wall
    if server_pid:
        result["server_cores"] = (cpu_seconds(server_pid) - server_cpu) / wall
    result["proxy_cores"] = (cpu_seconds(None) - harness_cpu) / wall
    return result


def rotated(methods: Sequence[str], round_: int) -> list[str]:
    """Round ``round_``'s order: the methods rotated by it."""
    shift = round_ % max(1, len(methods))
    return [*methods[shift:], *methods[:shift]]


def median_of(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each number's median over the runs (other values from the first run)."""
    merged = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values = [run[key] for run in runs if run.get(key) is not None]
            merged[key] = statistics.median(values) if values else None
    merged["runs"] = len(runs)
    return merged


def run_rounds(
    rows: Mapping[str, Callable[[], dict[str, Any]]],
    repeats: int,
    *,
    rate_key: str,
    label: str = "",
    before_each: Callable[[], Mapping[str, Any]] | None = None,
    show: Callable[[float], str] = lambda rate: f"{rate:,.0f}",
) -> dict[str, dict[str, Any]]:
    """Run every row ``repeats`` times, the order rotated each round (``before_each``'s
    result, a settle, added to each run); each row's medians, its rounds' rates in
    ``each_round`` and the round orders in ``order``."""
    methods = list(rows)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    orders = []
    for round_ in range(repeats):
        order = rotated(methods, round_)
        orders.append(order)
        for method in order:
            settled = dict(before_each()) if before_each else {}
            result = rows[method]()
            result.update(settled)
            runs[method].append(result)
            print(
                f"{label}round {round_ + 1}/{repeats}: {method} {show(result[rate_key])} "
                f"{rate_key.replace('_per_s', '')}/s",
                flush=True,
            )
    merged = {}
    for method, method_runs in runs.items():
        merged[method] = median_of(method_runs)
        merged[method]["each_round"] = [r[rate_key] for r in method_runs]
        merged[method]["order"] = orders
    return merged


def strongest(
    rows: Mapping[str, Mapping[str, Any]], baselines: Sequence[str], rate_key: str
) -> tuple[str, float] | None:
    """The baseline row with the highest median rate, and that rate (None if none ran)."""
    ran = [(name, rows[name][rate_key]) for name in baselines if name in rows]
    return max(ran, key=lambda item: item[1]) if ran else None


def vs_strongest(
    rows: Mapping[str, Mapping[str, Any]],
    ours: Sequence[str],
    baselines: Sequence[str],
    rate_key: str,
    names: Mapping[str, str],
    repeats: int,
) -> list[str]:
    """Markdown lines: each of ``ours`` against the strongest of ``baselines``."""
    best = strongest(rows, baselines, rate_key)
    if best is None:
        return []
    name, rate = best
    smoke = "" if repeats >= QUOTABLE_ROUNDS else " (smoke run: not quotable)"
    return [
        f"- {names.get(method, method)}: {rows[method][rate_key] / rate:.2f}x the strongest "
        f"baseline, {names.get(name, name)}{smoke}"
        for method in ours
        if method in rows
    ]


def method_lines(repeats: int, clock: str, start_methods: str) -> list[str]:
    """The report's statement of how it was measured: rounds, order, clock, start
    method, and a smoke run's warning."""
    lines = [
        f"Rounds: {repeats}, the order of the methods rotated each round; medians of the "
        f"rounds, ratios of medians. Clock: {clock}. Worker processes: {start_methods}.",
    ]
    if repeats < QUOTABLE_ROUNDS:
        lines += [
            "",
            f"**Smoke run ({repeats} round(s), fewer than {QUOTABLE_ROUNDS}): its ratios are "
            "not to be quoted.**",
        ]
    return lines


def add_round_args(parser: argparse.ArgumentParser, *, repeats: int = QUOTABLE_ROUNDS) -> None:
    """``--repeats`` (rounds) and ``--quick`` (a smoke run; the benchmark sizes it)."""
    parser.add_argument(
        "--repeats", type=int, default=None, help=f"rounds, order rotated (default {repeats})"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: small data, one round, not quotable"
    )
    parser.set_defaults(default_repeats=repeats)


def rounds(args: argparse.Namespace) -> int:
    """The rounds to run: ``--repeats``, else 1 for ``--quick``, else the default."""
    if args.repeats:
        return int(args.repeats)
    return 1 if args.quick else int(args.default_repeats)


def write_report(name: str, results: Mapping[str, Any], table: str) -> None:
    """Write ``out/{name}.json`` and ``out/{name}.md`` (``table``), and print ``table``."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (OUT / f"{name}.md").write_text(table + "\n")
    print(table)


def machine() -> dict[str, Any]:
    """What the report says of the machine: CPUs, Python, the load average now."""
    import platform

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
    }
