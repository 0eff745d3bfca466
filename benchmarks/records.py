"""Records of any fields from a bucket into batches: stoker against WebDataset and numpy.

Issue 23's benchmark. Two datasets of WebDataset tars written by ``webdataset.TarWriter``,
uploaded to SeaweedFS behind the 20 ms / 1 Gbit/s proxy and indexed in place by stoker
(``stoker index``: the tars stay as they are, so both loaders read the very same objects),
and the same records packed by ``stoker.pack`` (every field, in a seeded random order):

- pairs: image-caption-JSON records in the LAION / CC3M layout (``0001.jpg``,
  ``0001.txt``, ``0001.json``): ~100 kB photos of 500x375 (set a of ``loader.py``, made
  from scikit-image's sample photos), a caption of 8-30 words, a JSON object of metadata;
- arrays: ``npy`` records of 10,000 float32 (40 kB) with a ``cls`` label.

The methods, each cold (no cache), every field of every sample decoded:

- stoker (pairs): the Loader on its defaults in its own process, ``RandomResizedCrop(224)``,
  batches of 256 with ``image`` (uint8), ``txt`` (str), ``json`` (objects); its first batch
  counted from the process's start; on the tars indexed in place and on the packed records
  (whose random order needs no mixing window before the first batch);
- WebDataset (pairs): the same tars over presigned HTTP URLs through the proxy,
  ``shuffle(1000)``, PIL decode + the same crop and resize as ``loader.py``'s WebDataset
  row, captions decoded from UTF-8, JSON parsed, ``batched(256)``, in a torch
  DataLoader(num_workers=2) with the platform's default start method (fork on Linux), in
  its own process; its first batch counted from the process's start;
- numpy loop in RAM (arrays): the members already in memory, ``np.load`` of each from a
  BytesIO, ``int`` of each label, ``np.stack`` of batches of 256, one thread: the limit;
- stoker (arrays): the Loader, no transform, through the proxy, on the tars and on the
  packed records; and on the tars without the proxy (SeaweedFS on loopback) and on local
  disk, which show what it does when the link does not bound it.

Every method but the numpy loop runs in a fresh process of its own (``harness.py``), its
clock started with the process: samples/s are its samples over the seconds from the
process's start to its last batch. Every method runs ``--repeats`` times (3), the order
rotated each round, and the table shows medians. Before each method the harness lets the
machine settle (the data it wrote flushed to disk once; then until the cores are idle and
the server quiet, within ``--settle-s``), and every interpreter it starts (stoker's
children, the DataLoader's workers) uses bytecode compiled once into
benchmarks/out/pycache by one untimed import of each method's modules, as an installed
package has it: a first batch counted from a process's start then counts the imports a
user's process makes, not compiling stale sources (``PYTHONDONTWRITEBYTECODE``) or another
job's load. Bytes and requests per epoch are the proxy's own counts against the bytes of
what the method reads (the tars, or the packed shards). The output ends with issue 23's
acceptance checks, and the link's ceiling for each set: a loader that streams the data in
its timed epoch cannot feed more samples/s.

    pip install -e '.[bench]'
    python benchmarks/records.py            # 8,000 pairs, 10,000 arrays, 3 rounds: ~6 min
    python benchmarks/records.py --quick    # 1,500 pairs, 2,000 arrays, one round: a smoke run

Writes benchmarks/out/records.json and benchmarks/out/records.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np

from harness import add_round_args, machine, rounds, run_child, run_rounds, s3_env, write_report
from loader_baselines import boto
from loader_sets import BATCH
from quiet import compiled_interpreters, settle
from records_data import ARRAY_VALUES, BUCKET, OUT, RecordSet, in_ram_members, prepare
from records_report import report
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

CHILD = Path(__file__).resolve().parent / "records_children.py"
#: Compiled bytecode for every interpreter the benchmark starts (PYTHONPYCACHEPREFIX).
PYCACHE = OUT / "pycache"


def compiled_records_interpreters() -> None:
    """Bytecode for the children and the DataLoader's workers (their imports)."""
    compiled_interpreters(PYCACHE, [[str(CHILD), "--warm"]])


class Bench:
    """The methods, against one server and proxy."""

    def __init__(
        self, server: SeaweedServer, proxy: NetProxy, args: argparse.Namespace, scratch: Path
    ) -> None:
        self.server, self.proxy, self.args, self.scratch = server, proxy, args, scratch
        self.sets: dict[str, RecordSet] = {}
        self.in_ram: list[tuple[bytes, bytes]] = []

    def counted(self, records: RecordSet, run: Any, *, packed: bool = False) -> dict[str, Any]:
        """Run one method; add what the proxy saw, per epoch, against the bytes it reads
        (the tars, or with ``packed`` the packed shards)."""
        before = self.proxy.stats()
        result: dict[str, Any] = run()
        after = self.proxy.stats()
        scale = records.count / max(1, result["samples"])
        result["epoch_scale"] = scale
        result["bytes_per_epoch"] = (after.bytes_down - before.bytes_down) * scale
        result["requests_per_epoch"] = (after.requests - before.requests) * scale
        result["data_bytes"] = records.packed_bytes if packed else records.shard_bytes
        return result

    def run(self, args: list[str], endpoint: str) -> dict[str, Any]:
        """A method in its own process; its clock starts with the process."""
        return run_child(
            CHILD,
            args,
            env=s3_env(endpoint),
            rate_key="samples_per_s",
            server_pid=self.server.pid,
        )

    def child(self, url: str, transform: str, endpoint: str) -> dict[str, Any]:
        """stoker in its own process; its first batch split into the interpreter's start,
        the imports, opening the Loader and the rest."""
        result = self.run([url, transform, "0"], endpoint)
        launched = result["launched_at"]
        result["start_s"] = result["started_at"] - launched  # the interpreter's own start
        result["import_s"] = result.pop("imported_at") - result.pop("started_at")
        result["open_s"] = result.pop("opened_at") - launched - result["start_s"]
        result["open_s"] -= result["import_s"]
        return result

    def pairs_stoker(self) -> dict[str, Any]:
        pairs = self.sets["pairs"]
        return self.counted(pairs, lambda: self.child(pairs.url, "crop", self.proxy.endpoint))

    def pairs_stoker_packed(self) -> dict[str, Any]:
        pairs = self.sets["pairs"]
        return self.counted(
            pairs, lambda: self.child(pairs.packed_url, "crop", self.proxy.endpoint), packed=True
        )

    def pairs_webdataset(self) -> dict[str, Any]:
        pairs = self.sets["pairs"]
        client = boto(self.proxy.endpoint)
        urls = [
            client.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": f"{pairs.key}/{p.name}"}
            )
            for p in sorted(pairs.local.glob("*.tar"))
        ]
        urls_file = self.scratch / "urls.json"
        urls_file.write_text(json.dumps(urls))
        command = ["webdataset", str(urls_file), str(pairs.count)]
        return self.counted(pairs, lambda: self.run(command, self.proxy.endpoint))

    def arrays_limit(self) -> dict[str, Any]:
        records = self.in_ram
        started, cpu_started = time.perf_counter(), time.process_time()
        for start in range(0, len(records), BATCH):
            chunk = records[start : start + BATCH]
            arrays = np.stack([np.load(io.BytesIO(npy)) for npy, _ in chunk])
            labels = np.array([int(cls) for _, cls in chunk], dtype=np.int64)
            if arrays.shape != (len(chunk), ARRAY_VALUES) or len(labels) != len(chunk):
                raise RuntimeError(f"numpy loop: a batch of shape {arrays.shape}")
        seconds = time.perf_counter() - started
        return {
            "samples": len(records),
            "seconds": seconds,
            "cpu_s": time.process_time() - cpu_started,
            "samples_per_s": len(records) / seconds,
            "clock": "in RAM",
        }

    def arrays_stoker(self) -> dict[str, Any]:
        arrays = self.sets["arrays"]
        return self.counted(arrays, lambda: self.child(arrays.url, "none", self.proxy.endpoint))

    def arrays_stoker_packed(self) -> dict[str, Any]:
        arrays = self.sets["arrays"]
        return self.counted(
            arrays,
            lambda: self.child(arrays.packed_url, "none", self.proxy.endpoint),
            packed=True,
        )

    def arrays_stoker_loopback(self) -> dict[str, Any]:
        arrays = self.sets["arrays"]
        return self.child(arrays.url, "none", self.server.endpoint)

    def arrays_stoker_local(self) -> dict[str, Any]:
        return self.child(str(self.sets["arrays"].local), "none", self.proxy.endpoint)


METHODS = {
    "pairs": ["pairs_stoker", "pairs_stoker_packed", "pairs_webdataset"],
    "arrays": [
        "arrays_limit",
        "arrays_stoker",
        "arrays_stoker_packed",
        "arrays_stoker_loopback",
        "arrays_stoker_local",
    ],
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=8000, help="image-caption-JSON records")
    parser.add_argument("--arrays", type=int, default=10_000, help="npy records of 40 kB")
    parser.add_argument("--parts", default="pairs,arrays")
    parser.add_argument(
        "--methods", default="", help="only these methods (comma-separated; a smoke run)"
    )
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--gbit", type=float, default=1.0, help="the proxy's link, Gbit/s")
    add_round_args(parser)  # --quick: 1,500 pairs, 2,000 arrays, one round
    parser.add_argument(
        "--settle-s", type=float, default=20.0, help="most seconds to wait for a quiet machine"
    )
    args = parser.parse_args()
    args.repeats = rounds(args)
    if args.quick:
        args.pairs, args.arrays = 1500, 2000
    parts = args.parts.split(",")
    started = time.perf_counter()
    results: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    with SeaweedServer() as server, tempfile.TemporaryDirectory(prefix="stoker-records-") as tmp:
        server.create_bucket(BUCKET)
        link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.gbit * 125e6)
        with NetProxy("127.0.0.1", server.port, link=link) as proxy:
            bench = Bench(server, proxy, args, Path(tmp))
            for part in parts:
                bench.sets[part] = prepare(part, getattr(args, part), server)
                results[part] = {
                    "count": bench.sets[part].count,
                    "shard_bytes": bench.sets[part].shard_bytes,
                    "packed_bytes": bench.sets[part].packed_bytes,
                }
            if "arrays" in parts:
                bench.in_ram = in_ram_members(bench.sets["arrays"].local)
            os.sync()  # what prepare wrote goes to disk now, not during a timed run
            compiled_records_interpreters()
            methods = [m for part in parts for m in METHODS[part]]
            if args.methods:
                methods = [m for m in methods if m in args.methods.split(",")]
            rows = {method: getattr(bench, method) for method in methods}
            merged = run_rounds(
                rows,
                args.repeats,
                rate_key="samples_per_s",
                before_each=lambda: settle(server.pid, args.settle_s),
            )
            for method, result in merged.items():
                results[method.partition("_")[0]][method] = result
    results["machine"]["load_after"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - started
    text, checks = report(results, args)
    results["acceptance"] = checks
    write_report("records", results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
