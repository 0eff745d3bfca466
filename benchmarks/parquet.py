"""Stream image-caption rows that are already in Parquet: stoker in place against Hugging
Face ``datasets`` streaming and ``pyarrow.dataset``, with stoker's packed copy beside them.

Issue 34's benchmark. The photos of ``loader.py``'s set a (500x375, ~100 kB) with a caption
and a label each, as Parquet files in the Hugging Face layout (``data/train-0000N-of-
0000M.parquet``: an ``image`` struct of ``{bytes, path}``, a ``caption`` string, a ``label``
integer; row groups of 100 rows, as the Hub's Parquet export writes image datasets; see
``parquet_data.py``), uploaded to SeaweedFS behind the 20 ms / 1 Gbit/s proxy. Every method
reads the ``image`` and ``caption`` columns of one cold epoch (no cache), decodes every
image, crops it as ``RandomResizedCrop(224)`` with a random flip and delivers batches of 256
with the captions as strings:

- stoker in place: ``Loader(SourceConfig(url, columns=["image", "caption"]),
  batch_size=256, transform=RandomResizedCrop(224, flip=True))`` on its defaults;
- ``datasets`` streaming: ``load_dataset("parquet", ..., streaming=True)`` over s3fs, the
  files as shards, ``shuffle(buffer_size=1000)``, ``map`` of a PIL decode and crop, in a
  torch ``DataLoader(num_workers=2)`` with the platform's default start method; and, with
  ``--methods ...,datasets_resharded``, the same after ``reshard()`` (a shard per row
  group), which reads the files several times over;
- ``pyarrow.dataset``: ``to_batches(columns=[...], batch_size=256, use_threads=True)``
  through pyarrow's own S3 filesystem, PIL decode and crop in a thread pool (no shuffle);
- stoker packed: the same rows packed once by ``stoker.pack`` into shards in the bucket
  before any timing, read by ``Loader(packed_url, ...)`` on its defaults.

``parquet_children.py`` holds the methods. Every method runs in a fresh process of its own
(``harness.py``), its clock started with the process: samples/s are its samples over the
seconds from the process's start to its last batch, and its first batch is counted from
there. Every method runs ``--repeats`` times (3), the order rotated each round, and the
table shows medians. Before each method the harness lets the machine settle (as
``records.py`` does), and every interpreter reads bytecode compiled once into
benchmarks/out/pycache. Bytes and requests per epoch are the proxy's own counts (what the
server sent, response heads included), against the bytes the method has to read: the
chosen columns' chunks as the files' footers record them, or for the packed copy its
shards. The output ends with issue 34's goals, each with its measured figure.

    pip install -e '.[bench,parquet]' datasets   # s3fs is put aside by parquet_data.py
    python benchmarks/parquet.py              # 20,000 rows (~2 GB), 3 rounds
    python benchmarks/parquet.py --rows 8000  # a middle size
    python benchmarks/parquet.py --quick      # 500 rows, one round: a smoke run

Writes benchmarks/out/parquet.json and benchmarks/out/parquet.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import date
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
from parquet_data import ROW_GROUP_ROWS, ParquetSet, licences, prepare, s3fs_path
from quiet import compiled_interpreters, settle, settled_text
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

CHILD = Path(__file__).resolve().parent / "parquet_children.py"
OUT = Path(__file__).resolve().parent / "out"
PYCACHE = OUT / "pycache"
METHODS = ["stoker_in_place", "datasets_streaming", "pyarrow_dataset", "stoker_packed"]
#: Run only when named in ``--methods``.
OPTIONAL = ["datasets_resharded"]
NAMES = {
    "stoker_in_place": "stoker in place: SourceConfig(url, columns=[image, caption])",
    "datasets_streaming": "datasets streaming + DataLoader(num_workers=2)",
    "datasets_resharded": "datasets streaming, reshard() to row groups, + DataLoader(2)",
    "pyarrow_dataset": "pyarrow.dataset to_batches + PIL thread pool",
    "stoker_packed": "stoker, its packed copy of the rows",
}
#: Issue 34's goals.
GOAL_VS_DATASETS = 3.0
GOAL_BYTES = 1.05
GOAL_FIRST_BATCH_S = 1.0


class Bench:
    """The methods, against one server and proxy."""

    def __init__(
        self, data: ParquetSet, server: SeaweedServer, proxy: NetProxy, hf_env: dict[str, str]
    ) -> None:
        self.data, self.server, self.proxy, self.hf_env = data, server, proxy, hf_env

    def _run(self, args: list[str], *, packed: bool = False, **extra: str) -> dict[str, Any]:
        """A method in its own process, and what the proxy saw of it, per epoch."""
        before = self.proxy.stats()
        result = run_child(
            CHILD,
            args,
            env=s3_env(self.proxy.endpoint, extra),
            rate_key="samples_per_s",
            server_pid=self.server.pid,
        )
        after = self.proxy.stats()
        scale = self.data.rows / max(1, result["samples"])
        result["epoch_scale"] = scale
        result["bytes_per_epoch"] = (after.bytes_down - before.bytes_down) * scale
        result["requests_per_epoch"] = (after.requests - before.requests) * scale
        result["data_bytes"] = self.data.packed_bytes if packed else self.data.column_bytes
        launched = result["launched_at"]
        if "started_at" in result:  # the interpreter's start, the imports, the opening
            result["start_s"] = result.pop("started_at") - launched
            result["import_s"] = result.pop("imported_at") - launched - result["start_s"]
            result["open_s"] = result.pop("opened_at") - launched
        return result

    def stoker_in_place(self) -> dict[str, Any]:
        return self._run(["stoker", self.data.url, "image,caption"])

    def stoker_packed(self) -> dict[str, Any]:
        return self._run(["stoker", self.data.packed_url, "-"], packed=True)

    def datasets_streaming(self) -> dict[str, Any]:
        return self._run(["datasets", self.data.url, self.proxy.endpoint], **self.hf_env)

    def datasets_resharded(self) -> dict[str, Any]:
        args = ["datasets", self.data.url, self.proxy.endpoint, "reshard"]
        return self._run(args, **self.hf_env)

    def pyarrow_dataset(self) -> dict[str, Any]:
        return self._run(["pyarrow", self.data.url, self.proxy.endpoint])


def _mb(value: float | None) -> str:
    return "" if value is None else f"{value / 1e6:,.0f}"


def report(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The Markdown table, the goals and their figures."""
    rows = results["methods"]
    data = results["data"]
    hf = rows.get("datasets_streaming", {}).get("samples_per_s")
    mean_kb = data["file_bytes"] / data["rows"] / 1e3
    lines = [
        f"# parquet.py: {data['rows']:,} image-caption rows in Parquet, read in place "
        f"({date.today().isoformat()})",
        "",
        f"{data['rows']:,} rows of set a's photos (mean {mean_kb:.1f} kB a row) in "
        f"{data['files']} files of the Hugging Face layout, {data['row_groups']} "
        f"row groups of {args.row_group_rows} rows; {data['file_bytes'] / 1e6:,.0f} MB, of "
        f"which the image and caption chunks {data['column_bytes'] / 1e6:,.0f} MB (the "
        f"footers' figures) and the packed copy {data['packed_bytes'] / 1e6:,.0f} MB. SeaweedFS "
        f"behind the {args.rtt_ms:g} ms / {args.gbit:g} Gbit/s proxy, cold, batches of 256 "
        "uint8 224x224 with captions. Machine: "
        f"{results['machine']['cpus']} CPUs, Python {results['machine']['python']}, load "
        f"{results['machine']['load_before'][0]:.2f} before the run.",
        "",
        "| method | samples/s | vs datasets streaming | first batch s | MB per epoch | "
        "x its data | requests per epoch | peak RSS MB | CPU ms per sample |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method in [*METHODS, *OPTIONAL]:
        if method not in rows:
            continue
        row = rows[method]
        rate = row["samples_per_s"]
        ratio = f"{rate / hf:.2f}x" if hf else ""
        x_data = row["bytes_per_epoch"] / row["data_bytes"] if row["data_bytes"] else 0.0
        cpu = 1000 * row["cpu_s"] / max(1, row["samples"])
        lines.append(
            f"| {NAMES[method]} | {rate:,.0f} | {ratio} | {row['first_batch_s']:.2f} | "
            f"{_mb(row['bytes_per_epoch'])} | {x_data:.3f}x | {row['requests_per_epoch']:,.0f} | "
            f"{row.get('peak_rss_mb', 0):,.0f} | {cpu:.2f} |"
        )
    per_row = data["column_bytes"] / data["rows"]
    ceiling = args.gbit * 125e6 / per_row
    lines += [
        "",
        "x its data: bytes per epoch over the image and caption chunks (the in-place rows) or "
        "the packed shards (the packed row). CPU ms per sample: the method's main process "
        "over its loop (the DataLoader's workers are not in it). Each round's samples/s: "
        + "; ".join(
            f"{m} " + ", ".join(f"{r:,.0f}" for r in rows[m]["each_round"])
            for m in [*METHODS, *OPTIONAL]
            if m in rows
        )
        + ".",
        f"The link's ceiling: {args.gbit:g} Gbit/s carries {ceiling:,.0f} rows/s of the two "
        f"columns ({per_row / 1e3:.1f} kB a row); the server and the proxy share this machine's "
        "cores with the method.",
        "",
        *method_lines(
            args.repeats,
            "every method from its process's start (imports, listing, footers, workers counted)",
            "the datasets row's DataLoader: "
            + str(rows.get("datasets_streaming", {}).get("start_method", "not run"))
            + "; stoker: none (threads)",
        ),
        f"Settling before each run: {settled_text(list(rows.values()))}.",
        "",
    ]
    checks: dict[str, Any] = {}
    ours = rows.get("stoker_in_place")
    if ours:
        lines.append("Goals (issue 34), stoker in place:")
        if hf:
            ratio = ours["samples_per_s"] / hf
            checks["vs_datasets"] = {"value": ratio, "pass": ratio >= GOAL_VS_DATASETS}
            lines.append(
                f"- samples/s >= {GOAL_VS_DATASETS:g}x datasets streaming: {ratio:.2f}x "
                f"({'PASS' if ratio >= GOAL_VS_DATASETS else 'FAIL'})"
            )
        x_data = ours["bytes_per_epoch"] / ours["data_bytes"]
        checks["bytes"] = {"value": x_data, "pass": x_data <= GOAL_BYTES}
        lines.append(
            f"- bytes per epoch <= {GOAL_BYTES:g}x the columns read: {x_data:.3f}x "
            f"({'PASS' if x_data <= GOAL_BYTES else 'FAIL'})"
        )
        first = ours["first_batch_s"]
        checks["first_batch"] = {"value": first, "pass": first <= GOAL_FIRST_BATCH_S}
        lines.append(
            f"- first batch <= {GOAL_FIRST_BATCH_S:g} s after process start: {first:.2f} s "
            f"({'PASS' if first <= GOAL_FIRST_BATCH_S else 'FAIL'}; interpreter "
            f"{ours.get('start_s', 0):.2f} s, imports {ours.get('import_s', 0):.2f} s, "
            f"Loader open at {ours.get('open_s', 0):.2f} s)"
        )
        lines.append(
            "- resume exact: not timed here; tests/pipeline/test_parquet_in_place.py "
            "(test_a_resume_mid_epoch_equals_the_uninterrupted_rest) and the Parquet "
            "conformance suite check it, onto another world size too"
        )
    if results.get("licences"):
        lines += ["", "Baselines' libraries (version: licence, as their wheels ship it):"]
        lines += [f"- {name} {text}" for name, text in results["licences"].items()]
    return "\n".join(lines), checks


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000, help="image-caption rows")
    parser.add_argument("--row-group-rows", type=int, default=ROW_GROUP_ROWS)
    parser.add_argument("--methods", default="", help="only these methods (comma-separated)")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--gbit", type=float, default=1.0, help="the proxy's link, Gbit/s")
    parser.add_argument(
        "--settle-s", type=float, default=20.0, help="most seconds to wait for a quiet machine"
    )
    add_round_args(parser)  # --quick: 500 rows, one round
    args = parser.parse_args()
    args.repeats = rounds(args)
    if args.quick:
        args.rows = 500
    chosen = args.methods.split(",") if args.methods else METHODS
    methods = [m for m in [*METHODS, *OPTIONAL] if m in chosen]
    started = time.perf_counter()
    libs = s3fs_path()
    results: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    results["licences"] = licences(libs)
    with SeaweedServer() as server, tempfile.TemporaryDirectory(prefix="stoker-parquet-") as tmp:
        server.create_bucket("bench-parquet")
        data = prepare(args.rows, server, args.row_group_rows)
        results["data"] = {
            "rows": data.rows,
            "files": data.files,
            "row_groups": data.row_groups,
            "file_bytes": data.file_bytes,
            "column_bytes": data.column_bytes,
            "footer_bytes": data.footer_bytes,
            "packed_bytes": data.packed_bytes,
        }
        hf_env = {
            "PYTHONPATH": str(libs),
            "HF_HOME": str(Path(tmp) / "hf"),
            "HF_HUB_OFFLINE": "1",
        }
        os.sync()  # what prepare wrote goes to disk now, not during a timed run
        warm_env = {**hf_env, "AWS_REGION": "us-east-1"}
        compiled_interpreters(
            PYCACHE,
            [
                [str(CHILD), "--warm", "stoker"],
                ([str(CHILD), "--warm", "datasets"], warm_env),
                [str(CHILD), "--warm", "pyarrow"],
            ],
        )
        link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.gbit * 125e6)
        with NetProxy("127.0.0.1", server.port, link=link) as proxy:
            bench = Bench(data, server, proxy, hf_env)
            rows = {method: getattr(bench, method) for method in methods}
            results["methods"] = run_rounds(
                rows,
                args.repeats,
                rate_key="samples_per_s",
                before_each=lambda: settle(server.pid, args.settle_s),
            )
    results["machine"]["load_after"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - started
    text, checks = report(results, args)
    results["goals"] = checks
    write_report("parquet", results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
