"""Best-fit packing of token documents (issue 35, item 3): its padding against first-fit
and plain concatenation, and its tokens/s against the plain token stream.

A corpus of random token documents with lognormal lengths (median 1,000 tokens, sigma 1.0,
16 to 65,536 tokens, an end-of-text id after each, GPT-2's vocabulary as ``uint16``:
heavy-tailed, a quarter of them longer than a sequence of 2,049; ~100 M tokens,
``--quick`` 10 M) is written once into benchmarks/out/data as a stoker token dataset on
local disk. Two parts:

- **Padding** (the harness's process, pure CPU: the plan is a function of the index): the
  packing plan of every method over the same documents, timed. ``best-fit`` is
  :func:`~stoker.pipeline.token_packing.best_fit` (best-fit decreasing) within windows of
  1,024 consecutive documents, as ``TokenLoader(packing="best-fit")`` packs;
  ``first-fit`` the same windows packed in arrival order, each document into the earliest
  opened sequence it fits (the baseline of the goal); ``first-fit-decreasing`` for
  reference; ``concat`` the plain stream with document masks (``documents=True``), which
  pads nothing but cuts documents at every sequence boundary. Padding fraction: padding
  tokens over all the sequences' tokens. Documents cut: those split over two sequences
  or more (with packing, only those longer than a sequence).
- **Tokens/s** (one fresh process per run, timed from its start by the harness: imports,
  reading the index and, packed, computing the plan are counted): one shuffled epoch of
  batches of 8 x 2,048 ``int64`` tokens, ``TokenLoader`` over the local dataset (no
  bucket: this measures the loader's own cost, which packing adds to), plain and
  ``packing="best-fit"``, each without and with ``documents=True``. Tokens/s counts the
  ``input_ids`` positions delivered (padding included); ``real tokens/s`` only the
  document tokens (labels other than -100).

Every part runs ``--repeats`` rounds (3), the order rotated each round; medians. Writes
benchmarks/out/packing.json and benchmarks/out/packing.md; the goals (padding <= 0.75x
first-fit's, tokens/s >= 0.8x the plain stream's) are shown, not asserted::

    python benchmarks/packing.py            # ~100 M tokens, 3 rounds
    python benchmarks/packing.py --quick    # ~10 M tokens, one round (a smoke run)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STARTED = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (  # noqa: E402
    OUT,
    add_round_args,
    emit,
    machine,
    method_lines,
    peak_rss_mb,
    rounds,
    run_child,
    run_rounds,
    write_report,
)

VOCAB = 50_257  # GPT-2's: ids 0..50,255 and the end-of-text id
EOS = VOCAB - 1
MEDIAN_DOC, SIGMA, MIN_DOC, MAX_DOC = 1000, 1.0, 16, 65_536
WINDOW = 1024  # TokenLoader's default packing window
FITS = ("best-fit", "first-fit", "first-fit-decreasing")
LOADERS = ("plain", "plain+documents", "best-fit", "best-fit+documents")


def document_starts(tokens: int, seed: int) -> Any:
    """Stream positions of each document's first token and the end: lognormal lengths
    (eos included) until ``tokens`` are reached."""
    import numpy as np

    rng = np.random.default_rng(seed)
    raw = rng.lognormal(np.log(MEDIAN_DOC), SIGMA, tokens // 300 + 16)
    lengths = np.clip(raw, MIN_DOC, MAX_DOC).astype(np.int64)
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, tokens)) + 1
    return np.concatenate([[0], ends[:count]]).astype(np.int64)


def prepare(tokens: int, seed: int) -> tuple[Path, Any]:
    """The corpus's dataset (written once, kept) and its document starts."""
    import numpy as np

    from stoker.format.token_writer import write_token_dataset
    from stoker.storage import open_store

    bounds = document_starts(tokens, seed)
    path = OUT / "data" / f"packing-{tokens // 1_000_000}M-seed{seed}"
    if not (path / "index.json").exists():
        started = time.perf_counter()
        stream = np.random.default_rng(seed + 1).integers(0, EOS, int(bounds[-1]), np.uint16)
        docs = (
            (f"doc{n:08d}", stream[bounds[n] : bounds[n + 1] - 1]) for n in range(len(bounds) - 1)
        )
        write_token_dataset(
            open_store(path), docs, dtype=np.dtype("uint16"), eos_id=EOS, packed_with={}
        )
        print(f"[packing] corpus written in {time.perf_counter() - started:.0f} s", flush=True)
    return path, bounds


def plan_run(method: str, bounds: Any, span: int) -> dict[str, Any]:
    """One method's sequences over the corpus: padding, documents cut, time to plan."""
    import numpy as np

    from stoker.pipeline.token_packing import FITS as RULES
    from stoker.pipeline.token_packing import pack_documents

    documents, tokens = len(bounds) - 1, int(bounds[-1])
    started = time.perf_counter()
    if method == "concat":
        sequences, padding = tokens // span, 0
        first, last = bounds[:-1] // span, (bounds[1:] - 1) // span
        cut = int(np.count_nonzero(first != last))
    else:
        plan = pack_documents(bounds, capacity=span, window=WINDOW, fit=RULES[method])
        sequences, padding = plan.sequences, plan.padding_tokens
        cut = int(np.count_nonzero(np.diff(bounds) > span))
    seconds = time.perf_counter() - started
    return {
        "sequences": sequences,
        "padding_tokens": padding,
        "padding_fraction": padding / max(sequences * span, 1),
        "documents_cut_fraction": cut / max(documents, 1),
        "plan_s": seconds,
        "documents_per_s": documents / max(seconds, 1e-9),
    }


def loader_run(path: Path, method: str, seq_len: int, batch: int) -> dict[str, Any]:
    """One epoch of ``method`` in a fresh process, timed by the harness from its start."""
    return run_child(
        Path(__file__),
        ["--child", method, str(path), str(seq_len), str(batch)],
        env=os.environ,
        rate_key="tokens_per_s",
    )


def child(method: str, path: str, seq_len: int, batch: int) -> None:
    """A loader's epoch: emits tokens (``input_ids`` positions) and real tokens."""
    from stoker.pipeline.token_loader import TokenLoader

    packing = "best-fit" if method.startswith("best-fit") else "concat"
    documents = method.endswith("+documents")
    loader = TokenLoader(
        path, seq_len=seq_len, batch_size=batch, packing=packing, documents=documents, seed=0
    )
    opened_at = time.time()
    loop_started = time.perf_counter()
    first_at, rows, real = 0.0, 0, 0
    for item in loader:
        if not rows:
            first_at = time.time()
        rows += len(item["input_ids"])
        real += (
            int((item["labels"] != -100).sum()) if packing == "best-fit" else item["labels"].size
        )
    ended_at = time.time()
    seconds = time.perf_counter() - loop_started
    emit(
        {
            "units": rows * seq_len,
            "real_tokens": real,
            "sequences": rows,
            "tokens_per_s": rows * seq_len / seconds,
            "open_s": opened_at - STARTED,
            "first_batch_at": first_at,
            "ended_at": ended_at,
            "peak_rss_mb": peak_rss_mb(),
        }
    )


def _padding_table(plans: dict[str, dict[str, Any]], span: int, documents: int) -> list[str]:
    lines = [
        f"Padding: {documents:,} documents, sequences of {span:,} tokens, windows of "
        f"{WINDOW:,} documents (harness process, pure CPU)",
        "",
        "| method | sequences | padding | padding fraction | documents cut | plan s "
        "| documents/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in plans.items():
        lines.append(
            f"| {name} | {row['sequences']:,} | {row['padding_tokens']:,.0f} | "
            f"{row['padding_fraction']:.4%} | {row['documents_cut_fraction']:.2%} | "
            f"{row['plan_s']:.2f} | {row['documents_per_s']:,.0f} |"
        )
    return lines


def _loader_table(runs: dict[str, dict[str, Any]], tokens: int) -> list[str]:
    lines = [
        f"Tokens/s: one epoch of {tokens / 1e6:,.0f} M tokens from local disk, batches of "
        "8 x 2,048 int64 (a fresh process per run, timed from its start)",
        "",
        "| loader | tokens/s | real tokens/s | loop tokens/s | first batch s | total s "
        "| peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in runs.items():
        real = row["real_tokens"] / row["total_s"]
        lines.append(
            f"| {name} | {row['tokens_per_s'] / 1e6:,.1f} M | {real / 1e6:,.1f} M | "
            f"{row['loop_tokens_per_s'] / 1e6:,.1f} M | {row['first_batch_s']:.2f} | "
            f"{row['total_s']:.2f} | {row['peak_rss_mb']:,.0f} |"
        )
    return lines


def _goals(plans: dict[str, dict[str, Any]], runs: dict[str, dict[str, Any]]) -> list[str]:
    best, first = plans["best-fit"]["padding_fraction"], plans["first-fit"]["padding_fraction"]
    lines = [
        "Goals (shown, not asserted):",
        "",
        f"- padding: best-fit {best:.4%} = {best / first:.2f}x first-fit's {first:.4%} "
        f"(goal <= 0.75x): {'met' if best <= 0.75 * first else 'NOT met'}",
    ]
    for packed, plain in (("best-fit", "plain"), ("best-fit+documents", "plain+documents")):
        if packed in runs and plain in runs:
            ratio = runs[packed]["tokens_per_s"] / runs[plain]["tokens_per_s"]
            lines.append(
                f"- tokens/s: {packed} {ratio:.2f}x {plain} (goal >= 0.8x): "
                f"{'met' if ratio >= 0.8 else 'NOT met'}"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens-m", type=int, default=None, help="M tokens (100; quick 10)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    add_round_args(parser)
    args = parser.parse_args()
    repeats = rounds(args)
    tokens = (args.tokens_m or (10 if args.quick else 100)) * 1_000_000
    span = args.seq_len + 1
    path, bounds = prepare(tokens, args.seed)
    plan_rows: dict[str, Callable[[], dict[str, Any]]] = {
        name: (lambda name=name: plan_run(name, bounds, span)) for name in (*FITS, "concat")
    }
    plans = run_rounds(
        plan_rows,
        repeats,
        rate_key="documents_per_s",
        label="[padding] ",
        show=lambda rate: f"{rate:,.0f}",
    )
    loader_rows: dict[str, Callable[[], dict[str, Any]]] = {
        name: (lambda name=name: loader_run(path, name, args.seq_len, args.batch))
        for name in LOADERS
    }
    runs = run_rounds(loader_rows, repeats, rate_key="tokens_per_s", label="[tokens/s] ")
    text = "\n".join(
        [
            "# Best-fit packing of token documents",
            "",
            *method_lines(repeats, "padding: in the harness; tokens/s: process launch", "none"),
            "",
            *_padding_table(plans, span, len(bounds) - 1),
            "",
            *_loader_table(runs, int(bounds[-1])),
            "",
            *_goals(plans, runs),
        ]
    )
    write_report(
        "packing",
        {"machine": machine(), "args": vars(args), "plans": plans, "loaders": runs},
        text,
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        method, location, seq_len, batch = sys.argv[2:6]
        child(method, location, int(seq_len), int(batch))
    else:
        raise SystemExit(main())
