"""Token streams for language-model pretraining from a bucket: stoker's TokenLoader against
LitData, Mosaic Streaming and a numpy memmap loop.

Issue 24's benchmark. A corpus of random token documents (50-3,000 tokens, GPT-2's
vocabulary of 50,257 ids as ``uint16``, an end-of-text id after each; ~600 MB of tokens,
``--quick`` ~100 MB) is written once in each loader's own format (``tokens_data.py``) and
uploaded to SeaweedFS behind the 20 ms / 1 Gbit/s proxy. Every method delivers batches of
8 sequences of ``seq_len=2048`` as ``input_ids`` and ``targets`` (the next tokens), shuffled,
one whole epoch, in a process of its own (``tokens_children.py``):

- stoker, cold: ``TokenLoader`` on its defaults, no cache; its first batch counted from
  the process's start;
- stoker, warm: the same with a disk cache, its second epoch timed (read from the cache);
- LitData: ``StreamingDataset`` with ``TokensLoader(block_size=2049)`` over the same
  documents packed by its own ``optimize``, in its ``StreamingDataLoader`` (a row for
  each of ``--litdata-workers``, 1 and 2: with 2 it read 1.6x the bytes in a smoke run,
  both workers fetching a chunk; its faster row is the baseline), reading the bucket
  through boto3/obstore with its ``storage_options``; cold (a fresh cache directory);
- Mosaic Streaming: ``StreamingDataset`` over the stream cut into MDS samples of 2,049
  tokens (llm-foundry's layout), in a torch DataLoader (``--mosaic-workers``); cold;
- memmap loop: the stream in a local file, ``np.memmap``, sequences in a random order
  stacked into batches (nanoGPT's loop), one thread: the local-disk bound. Two rows: the
  uint16 rows with ``input_ids`` and ``targets`` as views of them (no cast), and the same
  arrays stoker delivers, ``int64`` ``input_ids`` and ``targets`` (each one cast of the
  stacked rows) and ``labels`` (a copy of ``input_ids``). The warm goal is against the
  second: the same arrays delivered;
- the link's ceiling: the tokens/s that 1 Gbit/s carries of ``uint16`` tokens.

Before each method the harness lets the machine settle (the corpus flushed to disk once;
then until the cores are idle and the server quiet, within ``--settle-s``), and every
interpreter it starts uses bytecode compiled once into benchmarks/out/pycache by one
untimed import of each method's modules, as an installed package has it (``quiet.py``).
Bytes and GETs per epoch are the proxy's own counts; CPU seconds are the method's process
and its worker processes over the timed epoch, per billion tokens of ``input_ids``. Every
method runs in a fresh process (``harness.py``) whose clock starts with it: tokens/s are
its tokens over the seconds from the process's start to its last batch (the warm row: its
second epoch's own loop). Every method runs ``--repeats`` times (3), the order rotated each
round, and the table shows medians. The output ends
with issue 24's goals, each with what was measured (shown, not asserted).

LitData and Mosaic Streaming are installed apart from the project's environment, for
these child processes only (their requirements would replace the CPU torch and numpy):

    pip install --target /tmp/tokens-libs --no-deps litdata mosaicml-streaming \\
        lightning-utilities xxhash zstd catalogue brotli python-snappy cramjam \\
        'transformers<5' 'huggingface_hub<1' safetensors regex 'tokenizers<0.23'
    python benchmarks/tokens.py --libs /tmp/tokens-libs           # ~600 MB of tokens, 3 rounds
    python benchmarks/tokens.py --libs /tmp/tokens-libs --quick   # ~100 MB, one round

A method whose library does not import is reported as not run, with why. Two settings
for the bucket here, on http://127.0.0.1, that a real S3 endpoint (https) needs neither
of: LitData's obstore client is allowed plain http (LitData has no option for it), and
Mosaic gets a torchvision stand-in where torchvision does not load (``tokens_libs.py``).
The first run writes the corpus in its three formats into benchmarks/out/data (~10 min
and 2.4 GB for 600 MB of tokens); later runs reuse it. Writes benchmarks/out/tokens.json
and benchmarks/out/tokens.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import add_round_args, machine, rounds, run_child, run_rounds, s3_env, write_report
from quiet import compiled_interpreters, settle
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer
from tokens_data import CHILD, OUT, Corpus, prepare
from tokens_libs import probe_libraries
from tokens_report import report


class Bench:
    """The methods, against one server, proxy and corpus."""

    def __init__(
        self,
        server: SeaweedServer,
        proxy: NetProxy,
        corpus: Corpus,
        args: argparse.Namespace,
        scratch: Path,
        paths: dict[str, str],
    ) -> None:
        self.server, self.proxy, self.corpus, self.args = server, proxy, corpus, args
        self.scratch, self.paths = scratch, paths

    def env(self, method: str) -> dict[str, str]:
        extra = self.paths.get(method)
        python_path = os.pathsep.join(filter(None, [extra, os.environ.get("PYTHONPATH")]))
        return s3_env(self.proxy.endpoint, {"PYTHONPATH": python_path} if extra else None)

    def child(self, method: str, command: list[str], clock: str = "launch") -> dict[str, Any]:
        """A method in its own process; its clock starts with the process."""
        before = self.proxy.stats()
        result = run_child(
            CHILD,
            command,
            env=self.env(method),
            rate_key="tokens_per_s",
            server_pid=self.server.pid,
            clock=clock,
        )
        after = self.proxy.stats()
        launched = result["launched_at"]
        result["import_s"] = result.pop("imported_at") - launched
        if "opened_at" in result:  # stoker: made the loader (read the index) by then
            result["open_s"] = result.pop("opened_at") - launched - result["import_s"]
        result.pop("started_at", None)
        result["bytes_per_epoch"] = after.bytes_down - before.bytes_down
        result["requests_per_epoch"] = after.requests - before.requests
        return result

    def _base(self) -> list[str]:
        return [str(self.args.seq_len), str(self.args.batch)]

    def stoker(self) -> dict[str, Any]:
        result = self.child("stoker", ["stoker", self.corpus.url("stoker"), *self._base()])
        result["data_bytes"] = self.corpus.formats["stoker"]
        return result

    def stoker_warm(self) -> dict[str, Any]:
        cache = self.scratch / "stoker-cache"
        try:
            command = ["stoker", self.corpus.url("stoker"), *self._base(), str(cache)]
            result = self.child("stoker", command, clock="loop")
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        # What its timed (second) epoch read from the store: the proxy saw both epochs.
        result["bytes_per_epoch"] = result["own_bytes_read"]
        result["requests_per_epoch"] = result["own_gets"]
        result["first_batch_s"] = None  # its timed epoch starts after a whole one
        result["data_bytes"] = self.corpus.formats["stoker"]
        return result

    def litdata(self, workers: int) -> dict[str, Any]:
        cache = self.scratch / "litdata-cache"
        try:
            url = self.corpus.url("litdata")
            command = ["litdata", url, *self._base(), str(workers), str(cache)]
            result = self.child("litdata", command)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        result["data_bytes"] = self.corpus.formats["litdata"]
        result["workers"] = workers
        return result

    def mosaic(self) -> dict[str, Any]:
        local = self.scratch / "mosaic-local"
        workers = str(self.args.mosaic_workers)
        try:
            command = ["mosaic", self.corpus.url("mds"), *self._base(), workers, str(local)]
            result = self.child("mosaic", command)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        result["data_bytes"] = self.corpus.formats["mds"]
        return result

    def memmap(self, dtype: str = "uint16") -> dict[str, Any]:
        command = ["memmap", str(self.corpus.stream), *self._base(), dtype]
        # The local-disk limit the warm row is held against: its loop alone, as the warm's.
        result = self.child("memmap", command, clock="loop")
        for key in ("bytes_per_epoch", "requests_per_epoch", "server_cores", "proxy_cores"):
            result.pop(key)
        result["first_batch_s"] = None  # local disk: not a cold start from the bucket
        return result


METHODS = ["stoker", "stoker_warm", "litdata", "mosaic", "memmap"]


def method_runs(bench: Bench, methods: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Each row's name and how to run it: LitData once for each of its worker counts; the
    memmap loop as uint16 views and as int64 arrays (what stoker delivers)."""
    runs: dict[str, Any] = {}
    for method in methods:
        if method == "litdata":
            for workers in args.litdata_workers:
                runs[f"litdata_{workers}"] = lambda w=workers: bench.litdata(w)
        elif method == "memmap":
            runs["memmap"] = bench.memmap
            runs["memmap_int64"] = lambda: bench.memmap("int64")
        else:
            runs[method] = getattr(bench, method)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--token-mb", type=int, default=600, help="MB of uint16 tokens")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8, help="sequences per batch")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--gbit", type=float, default=1.0, help="the proxy's link, Gbit/s")
    parser.add_argument(
        "--litdata-workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2],
        help="LitData's DataLoader workers: a row for each (the best is the baseline)",
    )
    parser.add_argument("--mosaic-workers", type=int, default=2)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument(
        "--libs", help="a folder with litdata and mosaicml-streaming (pip install --target)"
    )
    add_round_args(parser)  # --quick: ~100 MB of tokens, one round
    parser.add_argument(
        "--settle-s", type=float, default=20.0, help="most seconds to wait for a quiet machine"
    )
    args = parser.parse_args()
    args.repeats = rounds(args)
    if args.quick:
        args.token_mb = 100
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    with tempfile.TemporaryDirectory(prefix="stoker-tokens-") as tmp:
        scratch = Path(tmp)
        libraries = probe_libraries(args.libs, scratch)
        results["libraries"] = libraries
        paths = {name: lib["path"] for name, lib in libraries.items() if lib["ok"]}
        wanted = args.methods.split(",")
        methods = [m for m in METHODS if m in wanted and libraries.get(m, {"ok": True})["ok"]]
        with SeaweedServer() as server:
            server.create_bucket("bench-tokens")
            corpus = prepare(args.token_mb, args.seq_len, server, paths=paths)
            results["corpus"] = {
                "key": corpus.key,
                "tokens": corpus.tokens,
                "documents": corpus.documents,
                "token_bytes": corpus.token_bytes,
                "formats": corpus.formats,
            }
            link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.gbit * 125e6)
            with NetProxy("127.0.0.1", server.port, link=link) as proxy:
                bench = Bench(server, proxy, corpus, args, scratch, paths)
                rows = method_runs(bench, methods, args)
                os.sync()  # what prepare wrote goes to disk now, not during a timed run
                compiled_interpreters(
                    OUT / "pycache",
                    [
                        (
                            [str(CHILD), "warm", m],
                            {"PYTHONPATH": bench.env(m).get("PYTHONPATH", "")},
                        )
                        for m in ("stoker", *paths)
                    ],
                )
                results["methods"] = run_rounds(
                    rows,
                    args.repeats,
                    rate_key="tokens_per_s",
                    before_each=lambda: settle(server.pid, args.settle_s),
                    show=lambda rate: f"{rate / 1e6:,.2f} M",
                )
    results["machine"]["load_after"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - started
    text, goals = report(results, args)
    results["goals"] = goals
    write_report("tokens", results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
