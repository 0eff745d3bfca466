"""Reliability figures: faults injected, retries, samples lost, corruptions detected, crashes.

Runs against a SeaweedFS server that this script starts on loopback, through stoker's proxy
(stoker.testing.netproxy) injecting faults into a fraction of the requests, every kind in the
mix: 503 SlowDown, 500, a reset before the response, a reset mid-body, a truncated body and a
response stalled past the client's timeout. Then:

* download: every file compared with its source by MD5;
* pack from a bucket image folder into the bucket: verify() and the sample keys checked;
* two loader epochs: every sample id counted, per epoch;
* corruption: bytes flipped in some samples of the packed shards (and once outside any
  sample); what verify() and reads report;
* crashes: `stoker download` and `stoker pack` killed with SIGKILL mid-run, then rerun;
* a simulated listing of a million objects: peak RSS growth of Store.list, `stoker ls -r`
  and download's listing (tests/reliability/listing_child.py, one child process each).

Retries are counted by the stores (download, loader) or the pack report's request
counters; requests and faults by the proxy.

    pip install -e '.[bench]'
    python benchmarks/reliability.py                 # about two minutes on 2 cores
    python benchmarks/reliability.py --files 500     # quick look

Writes benchmarks/out/reliability.json and benchmarks/out/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import write_report
from stoker.errors import CorruptShardError
from stoker.format.reader import open_dataset
from stoker.format.spec import PACK_STATE_DIR
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.storage import open_store
from stoker.storage.checksum import md5_tree
from stoker.storage.transfer import PARTIAL_SUFFIX, TransferConfig, download, upload
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import FAULT_KINDS, FaultConfig, LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

BUCKET = "bench-reliability"
LISTING_CHILD = (
    Path(__file__).resolve().parent.parent / "tests" / "reliability" / "listing_child.py"
)
MiB = 1024 * 1024
RETRY = {"base_delay_s": 0.01, "max_delay_s": 0.2, "throttle_base_delay_s": 0.05}
TIMEOUT_S = 2.0


def _faults(proxy: NetProxy, before: Any) -> dict[str, Any]:
    after = proxy.stats()
    by_kind = {k: after.faults[k] - before.faults[k] for k in FAULT_KINDS}
    return {
        "requests": after.requests - before.requests,
        "faults": sum(by_kind.values()),
        "faults_by_kind": by_kind,
    }


def run_download(server: SeaweedServer, proxy: NetProxy, work: Path, files: int) -> dict[str, Any]:
    source = work / "download-src"
    write_image_folder(source, files=files, classes=10, width=64, height=48)
    (source / "large").mkdir()
    for i in range(4):
        (source / "large" / f"blob{i}.bin").write_bytes(os.urandom(12 * MiB + i))
    direct = server.storage_options()
    upload(source, open_store(f"s3://{BUCKET}/download", storage_options=direct))
    before = proxy.stats()
    store = open_store(
        f"s3://{BUCKET}/download",
        storage_options={
            **server.storage_options(proxy.endpoint),
            "retry": RETRY,
            "timeout_s": TIMEOUT_S,
            "part_size_bytes": 5 * MiB,
            "multipart_threshold_bytes": 5 * MiB,
        },
    )
    started = time.perf_counter()
    report = download(store, work / "download-dst", config=TransferConfig(workers=32))
    seconds = time.perf_counter() - started
    want, got = md5_tree(source), md5_tree(work / "download-dst")
    counters = store.counters.snapshot()
    return {
        **_faults(proxy, before),
        "retries": counters.get("retries", 0),
        "throttles": counters.get("throttles", 0),
        "errors": {k[7:]: v for k, v in counters.items() if k.startswith("errors.")},
        "files": len(want),
        "files_md5_equal": sum(1 for k, v in want.items() if got.get(k) == v),
        "files_lost": sum(1 for k in want if k not in got),
        "partial_files_left": len(list((work / "download-dst").rglob(f"*{PARTIAL_SUFFIX}"))),
        "transferred": report.files_transferred,
        "seconds": round(seconds, 2),
    }


def run_pack(server: SeaweedServer, proxy: NetProxy, work: Path, files: int) -> dict[str, Any]:
    source = work / "pack-src"
    write_image_folder(source, files=files, classes=10, width=64, height=48)
    upload(source, open_store(f"s3://{BUCKET}/raw", storage_options=server.storage_options()))
    options = {**server.storage_options(proxy.endpoint), "retry": RETRY, "timeout_s": TIMEOUT_S}
    before = proxy.stats()
    started = time.perf_counter()
    report = pack(
        f"s3://{BUCKET}/raw",
        f"s3://{BUCKET}/packed",
        config=PackConfig(samples_per_shard=50, workers=16),
        storage_options=options,
    )
    seconds = time.perf_counter() - started
    faults = _faults(proxy, before)
    dataset = open_dataset(f"s3://{BUCKET}/packed", storage_options=server.storage_options())
    check = dataset.verify()
    keys = list(dataset.index.keys)
    originals = {p.relative_to(source).with_suffix("").as_posix() for p in source.rglob("*.jpg")}
    return {
        **faults,
        "retries": sum(side.get("retries", 0) for side in report.requests.values()),
        "samples_in": len(originals),
        "samples_packed": report.samples,
        "shards": report.shards,
        "verify_ok": check.ok,
        "samples_verified": check.samples,
        "samples_lost": len(originals - set(keys)),
        "samples_duplicated": len(keys) - len(set(keys)),
        "seconds": round(seconds, 2),
    }


def run_loader(server: SeaweedServer, proxy: NetProxy) -> dict[str, Any]:
    url = f"s3://{BUCKET}/packed"
    total = len(open_dataset(url, storage_options=server.storage_options()))
    options = {**server.storage_options(proxy.endpoint), "retry": RETRY, "timeout_s": TIMEOUT_S}
    before = proxy.stats()
    epochs = []
    started = time.perf_counter()
    order = OrderConfig(block_size=4, group_blocks=8)  # short blocks: many ranged GETs
    with Loader(url, batch_size=64, seed=1, storage_options=options, order=order) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            seen: list[int] = []
            for batch in loader:
                seen.extend(int(i) for i in batch["index"])
            epochs.append(
                {
                    "delivered": len(seen),
                    "lost": len(set(range(total)) - set(seen)),
                    "duplicated": len(seen) - len(set(seen)),
                }
            )
        stats = loader.stats()
    return {
        **_faults(proxy, before),
        "retries": stats.requests.get("retries", 0),
        "get_requests": stats.requests.get("requests.get", 0),
        "bytes_read": stats.requests.get("bytes.read", 0),
        "shard_bytes": sum(
            meta.size
            for meta in open_store(url, storage_options=server.storage_options()).list("")
            if meta.key.rpartition("/")[2].startswith("shard-")
        ),
        "samples": total,
        "epochs": epochs,
        "seconds": round(time.perf_counter() - started, 2),
    }


def run_corruption(server: SeaweedServer) -> dict[str, Any]:
    """Flip one byte in some samples (and once in a shard's end padding) and look."""
    url = f"s3://{BUCKET}/packed"
    options = server.storage_options()
    store = open_store(url, storage_options=options)
    dataset = open_dataset(url, storage_options=options)
    index = dataset.index
    rng = random.Random(7)
    by_shard: dict[int, list[int]] = {}
    for i in rng.sample(range(len(index)), 6):
        by_shard.setdefault(int(index.shard[i]), []).append(i)
    victims = sorted(i for ids in by_shard.values() for i in ids)
    for shard, ids in by_shard.items():
        name = index.shards[shard].name
        data = bytearray(store.get(name))
        for i in ids:
            data[int(index.offset[i]) + int(index.length[i]) // 2] ^= 0x5A
        store.put(name, bytes(data))
    spare = next(n for n in range(len(index.shards)) if n not in by_shard)
    name = index.shards[spare].name
    data = bytearray(store.get(name))
    data[-100] ^= 0xFF  # in the end-of-archive blocks: no sample's bytes
    store.put(name, bytes(data))
    check = open_dataset(url, storage_options=options).verify()
    raised = 0
    for i in victims:
        try:
            dataset[i]
        except CorruptShardError:
            raised += 1
    return {
        "injected_in_samples": len(victims),
        "injected_outside_samples": 1,
        "detected_by_verify": len(check.corrupt),
        "verify_findings": [list(c) for c in check.corrupt],
        "corrupt_reads_raised": raised,
        "corrupt_reads_returned": len(victims) - raised,
    }


def _env(server: SeaweedServer, endpoint: str) -> dict[str, str]:
    options = server.storage_options()
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }


def _kill_when(child: subprocess.Popen[bytes], ready: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child.poll() is None and not ready():
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.communicate()


def run_crashes(server: SeaweedServer, work: Path) -> dict[str, Any]:
    stoker = [sys.executable, "-m", "stoker"]
    results: dict[str, Any] = {}
    with NetProxy("127.0.0.1", server.port, link=LinkConfig(rtt_s=0.03)) as slow:
        # download: the files under download/ (already in the bucket)
        dst = work / "crash-download"
        command = [*stoker, "download", f"s3://{BUCKET}/download", str(dst), "--no-progress"]
        child = subprocess.Popen(
            [*command, "--workers", "4"],
            env=_env(server, slow.endpoint),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _kill_when(child, lambda: len(list(dst.rglob("*.jpg"))) >= 100)
        done = len([p for p in dst.rglob("*") if p.is_file() and PARTIAL_SUFFIX not in p.name])
        partial = len(list(dst.rglob(f"*{PARTIAL_SUFFIX}")))
        rerun = subprocess.run(
            [*command, "--json"],
            env=_env(server, server.endpoint),
            capture_output=True,
            text=True,
            check=False,
        )
        report = json.loads(rerun.stdout) if rerun.returncode == 0 else {}
        want = md5_tree(work / "download-src")
        results["download"] = {
            "complete_at_kill": done,
            "partial_files_at_kill": partial,
            "rerun_exit": rerun.returncode,
            "rerun_skipped": report.get("files_skipped"),
            "rerun_transferred": report.get("files_transferred"),
            "files_md5_equal": sum(1 for k, v in md5_tree(dst).items() if want.get(k) == v),
            "files": len(want),
            "partial_files_left": len(list(dst.rglob(f"*{PARTIAL_SUFFIX}"))),
        }
        # pack: raw/ into crash-packed/
        store = open_store(f"s3://{BUCKET}/crash-packed", storage_options=server.storage_options())
        command = [*stoker, "pack", f"s3://{BUCKET}/raw", f"s3://{BUCKET}/crash-packed"]
        command += ["--samples-per-shard", "50", "--no-progress"]

        def records() -> int:
            return len([m for m in store.list(PACK_STATE_DIR) if "shard-" in m.key])

        child = subprocess.Popen(
            [*command, "--workers", "2"],
            env=_env(server, slow.endpoint),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _kill_when(child, lambda: records() >= 3)
        at_kill = records()
        rerun = subprocess.run(
            [*command, "--json"],
            env=_env(server, server.endpoint),
            capture_output=True,
            text=True,
            check=False,
        )
        report = json.loads(rerun.stdout) if rerun.returncode == 0 else {}
        dataset = open_dataset(
            f"s3://{BUCKET}/crash-packed", storage_options=server.storage_options()
        )
        check = dataset.verify()
        keys = list(dataset.index.keys)
        results["pack"] = {
            "shards_complete_at_kill": at_kill,
            "rerun_exit": rerun.returncode,
            "shards": report.get("shards"),
            "shards_reused": report.get("shards_reused"),
            "samples": len(keys),
            "samples_duplicated": len(keys) - len(set(keys)),
            "verify_ok": check.ok,
        }
    return results


def run_listing(objects: int) -> dict[str, Any]:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "simulated",
        "AWS_SECRET_ACCESS_KEY": "simulated",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_REGION": "us-east-1",
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("list", "ls", "download"):
            child = subprocess.run(
                [sys.executable, str(LISTING_CHILD), mode, str(objects), str(Path(tmp) / mode)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            results[mode] = json.loads(child.stdout.strip().splitlines()[-1])
    return results


def _table(results: dict[str, Any]) -> str:
    d, p, lo = results["download"], results["pack"], results["loader"]
    c, k, li = results["corruption"], results["crashes"], results["listing"]
    rows = [
        "| run | requests | faults injected | retries | lost | checked |",
        "|---|---:|---:|---:|---:|---|",
        f"| download ({d['files']} files) | {d['requests']} | {d['faults']} | {d['retries']} | "
        f"{d['files_lost']} | {d['files_md5_equal']}/{d['files']} files MD5-equal |",
        f"| pack ({p['samples_in']} images, bucket to bucket) | {p['requests']} | {p['faults']} | "
        f"{p['retries']} | {p['samples_lost']} | verify {'clean' if p['verify_ok'] else 'FAILED'},"
        f" {p['samples_verified']} samples, {p['samples_duplicated']} duplicates |",
        f"| loader, 2 epochs ({lo['samples']} samples) | {lo['requests']} | {lo['faults']} | "
        f"{lo['retries']} | {sum(e['lost'] for e in lo['epochs'])} | "
        + ", ".join(f"epoch {n}: {e['delivered']} delivered" for n, e in enumerate(lo["epochs"]))
        + f", {sum(e['duplicated'] for e in lo['epochs'])} duplicates |",
    ]
    per_epoch = lo["bytes_read"] / len(lo["epochs"])
    rows += [
        "",
        "| loader (its own count, retries included) | MB read per epoch | x shard bytes "
        "| GETs per epoch |",
        "|---|---:|---:|---:|",
        f"| {lo['samples']} samples, blocks of 4 | {per_epoch / 1e6:,.1f} | "
        f"{per_epoch / lo['shard_bytes']:.3f}x | {lo['get_requests'] / len(lo['epochs']):,.0f} |",
    ]
    kinds = ["", "| faults by kind | " + " | ".join(FAULT_KINDS) + " |"]
    kinds.append("|---|" + "---:|" * len(FAULT_KINDS))
    for name in ("download", "pack", "loader"):
        by = results[name]["faults_by_kind"]
        kinds.append(f"| {name} | " + " | ".join(str(by[k]) for k in FAULT_KINDS) + " |")
    corruption = [
        "",
        f"Corruption: {c['injected_in_samples']} samples with a flipped byte and 1 flip outside "
        f"any sample; verify() reported {c['detected_by_verify']} problems; "
        f"{c['corrupt_reads_raised']} of {c['injected_in_samples']} reads of a corrupted sample "
        f"raised CorruptShardError ({c['corrupt_reads_returned']} returned bytes).",
        "",
        f"Crashes: `stoker download` killed with {k['download']['complete_at_kill']} files "
        f"complete ({k['download']['partial_files_at_kill']} partial files); the rerun skipped "
        f"{k['download']['rerun_skipped']}, fetched {k['download']['rerun_transferred']}, "
        f"{k['download']['files_md5_equal']}/{k['download']['files']} MD5-equal, "
        f"{k['download']['partial_files_left']} partial files left. `stoker pack` killed with "
        f"{k['pack']['shards_complete_at_kill']} shards complete; the rerun reused "
        f"{k['pack']['shards_reused']} of {k['pack']['shards']} shards, verify "
        f"{'clean' if k['pack']['verify_ok'] else 'FAILED'}, {k['pack']['samples']} samples, "
        f"{k['pack']['samples_duplicated']} duplicates.",
        "",
        "Simulated listing of "
        f"{li['list']['objects']:,} objects, peak RSS growth: Store.list "
        f"{li['list']['rss_growth_mb']:.1f} MB, `stoker ls -r --json` "
        f"{li['ls']['rss_growth_mb']:.1f} MB, download's listing "
        f"{li['download']['rss_growth_mb']:.1f} MB.",
    ]
    return "\n".join(rows + kinds + corruption)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=2000, help="images per run")
    parser.add_argument("--fault-rate", type=float, default=0.05, help="fraction faulted")
    parser.add_argument("--seed", type=int, default=2024, help="seed of the fault decisions")
    parser.add_argument("--objects", type=int, default=1_000_000, help="simulated listing")
    args = parser.parse_args()
    faults = FaultConfig(fault_rate=args.fault_rate, kinds=FAULT_KINDS, seed=args.seed)
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "fault_rate": args.fault_rate,
        "fault_kinds": list(FAULT_KINDS),
        "timeout_s": TIMEOUT_S,
    }
    with tempfile.TemporaryDirectory() as tmp, SeaweedServer() as server:
        work = Path(tmp)
        server.create_bucket(BUCKET)
        with NetProxy("127.0.0.1", server.port, link=LinkConfig(rtt_s=0.0)) as proxy:
            proxy.set_faults(faults)
            results["download"] = run_download(server, proxy, work, args.files)
            print("download", json.dumps(results["download"]), flush=True)
            results["pack"] = run_pack(server, proxy, work, args.files)
            print("pack", json.dumps(results["pack"]), flush=True)
            results["loader"] = run_loader(server, proxy)
            print("loader", json.dumps(results["loader"]), flush=True)
        results["corruption"] = run_corruption(server)
        print("corruption", json.dumps(results["corruption"]), flush=True)
        results["crashes"] = run_crashes(server, work)
        print("crashes", json.dumps(results["crashes"]), flush=True)
    results["listing"] = run_listing(args.objects)
    print("listing", json.dumps(results["listing"]), flush=True)
    table = _table(results)
    write_report("reliability", results, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
