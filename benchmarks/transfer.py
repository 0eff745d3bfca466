"""Download many small files from S3: a sequential boto3 loop, tqdm's thread_map with 10
threads, and `stoker download`, in one run, directly and through an emulated cloud link.

The data (25,000 JPEGs of about 10 KB by default) lives in a SeaweedFS server that this
script starts on loopback; the cloud link is stoker's delaying proxy (20 ms round trip,
1 Gbit/s). The sequential loop is timed on a sample of the files (it would take minutes
over all of them); the other methods download every file. Rates are files per second of
wall time, listing included.

    pip install -e '.[bench]'
    python benchmarks/transfer.py                 # full run (a few minutes on 2 cores)
    python benchmarks/transfer.py --files 2000    # quick look

Writes benchmarks/out/transfer.json and benchmarks/out/transfer.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from tqdm.contrib.concurrent import thread_map

from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, upload
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer

BUCKET = "bench-transfer"
OUT = Path(__file__).resolve().parent / "out"


def boto_client(endpoint: str, pool: int) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(max_pool_connections=pool, s3={"addressing_style": "path"}),
    )


def list_keys(client: Any, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return keys


def run_sequential(endpoint: str, dst: Path, sample: int) -> dict[str, Any]:
    started = time.perf_counter()
    client = boto_client(endpoint, 1)
    keys = list_keys(client, "images/")[:sample]
    for key in keys:
        target = dst / key
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, key, str(target))
    return {"files": len(keys), "seconds": time.perf_counter() - started}


def run_thread_map(endpoint: str, dst: Path, threads: int) -> dict[str, Any]:
    started = time.perf_counter()
    client = boto_client(endpoint, threads)
    keys = list_keys(client, "images/")

    def fetch(key: str) -> None:
        target = dst / key
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, key, str(target))

    thread_map(fetch, keys, max_workers=threads, disable=True)
    return {"files": len(keys), "seconds": time.perf_counter() - started}


def run_stoker(endpoint: str, dst: Path, workers: int | None) -> dict[str, Any]:
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
    }
    command = [
        sys.executable,
        "-m",
        "stoker",
        "download",
        f"s3://{BUCKET}/images",
        str(dst),
        "--json",
        "--no-progress",
    ]
    if workers:
        command += ["--workers", str(workers)]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"stoker download failed:\n{done.stderr}")
    report = json.loads(done.stdout)
    return {
        "files": report["files_transferred"],
        "seconds": seconds,
        "retries": report["requests"].get("retries", 0),
    }


def disk_limit(paths: list[Path], dst: Path) -> dict[str, Any]:
    """Write the same files from RAM to ``dst`` as fast as one thread can: the disk's limit."""
    payloads = [(p.parent.name + "/" + p.name, p.read_bytes()) for p in paths]
    started = time.perf_counter()
    for key, data in payloads:
        target = dst / key
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name("." + target.name + ".partial")
        partial.write_bytes(data)
        partial.replace(target)
    return {"files": len(payloads), "seconds": time.perf_counter() - started}


def measure(name: str, run: Callable[[Path], dict[str, Any]], scratch: Path) -> dict[str, Any]:
    dst = scratch / name.replace(" ", "_")
    shutil.rmtree(dst, ignore_errors=True)
    result = run(dst)
    result["files_per_s"] = result["files"] / result["seconds"]
    shutil.rmtree(dst, ignore_errors=True)
    print(
        f"  {name:<34} {result['files']:>6} files  {result['seconds']:7.2f} s  "
        f"{result['files_per_s']:8.0f} files/s",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=25_000)
    parser.add_argument("--sequential-sample", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=10, help="thread_map workers")
    parser.add_argument("--workers", type=int, default=None, help="stoker --workers")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=125e6, help="link bytes/s (1 Gbit/s)")
    parser.add_argument("--links", default="direct,cloud", help="direct, cloud or both")
    args = parser.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="stoker-bench-transfer-"))
    results: dict[str, Any] = {
        "benchmark": "transfer",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "files": args.files,
        "rtt_ms": args.rtt_ms,
        "rate_bytes_s": args.rate,
        "links": {},
    }
    try:
        source = scratch / "source"
        paths = write_image_folder(source, files=args.files, classes=100, width=200, height=150)
        total = sum(p.stat().st_size for p in paths)
        results["mean_file_bytes"] = total / len(paths)
        print(f"{args.files} JPEGs, mean {total / len(paths) / 1000:.1f} kB", flush=True)
        limit = measure("disk limit: write from RAM", lambda d: disk_limit(paths, d), scratch)
        results["disk_limit"] = limit
        with SeaweedServer() as server:
            server.create_bucket(BUCKET)
            store = open_store(f"s3://{BUCKET}/images", storage_options=server.storage_options())
            upload(source, store, config=TransferConfig(workers=64))
            link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.rate)
            with NetProxy("127.0.0.1", server.port, link=link) as proxy:
                endpoints = {"direct": server.endpoint, "cloud": proxy.endpoint}
                for link_name in args.links.split(","):
                    endpoint = endpoints[link_name]
                    label = (
                        "loopback, no delay"
                        if link_name == "direct"
                        else f"emulated cloud: {args.rtt_ms:g} ms RTT, "
                        f"{args.rate * 8 / 1e9:g} Gbit/s"
                    )
                    print(f"{link_name} ({label})", flush=True)
                    rows = {
                        "sequential boto3 loop": measure(
                            "sequential boto3 loop",
                            lambda d, e=endpoint: run_sequential(e, d, args.sequential_sample),
                            scratch,
                        ),
                        f"thread_map, {args.threads} threads": measure(
                            f"thread_map, {args.threads} threads",
                            lambda d, e=endpoint: run_thread_map(e, d, args.threads),
                            scratch,
                        ),
                        "stoker download": measure(
                            "stoker download",
                            lambda d, e=endpoint: run_stoker(e, d, args.workers),
                            scratch,
                        ),
                    }
                    results["links"][link_name] = {"label": label, "methods": rows}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    lines = [
        f"# Transfer benchmark: {args.files} files of {results['mean_file_bytes'] / 1000:.1f} kB",
        "",
        "| link | method | files | seconds | files/s | vs sequential | vs thread_map |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for link in results["links"].values():
        methods = link["methods"]
        base = methods["sequential boto3 loop"]["files_per_s"]
        pool = methods[f"thread_map, {args.threads} threads"]["files_per_s"]
        for method, row in methods.items():
            row["vs_sequential"] = row["files_per_s"] / base
            row["vs_thread_map"] = row["files_per_s"] / pool
            lines.append(
                f"| {link['label']} | {method} | {row['files']} | {row['seconds']:.2f} | "
                f"{row['files_per_s']:.0f} | {row['vs_sequential']:.1f}x | "
                f"{row['vs_thread_map']:.2f}x |"
            )
    lines += [
        "",
        f"Sequential loop timed on the first {args.sequential_sample} files. Disk limit (the "
        f"same files written from RAM, one thread): {limit['files_per_s']:.0f} files/s. "
        f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}.",
    ]
    table = "\n".join(lines)
    (OUT / "transfer.json").write_text(json.dumps(results, indent=2))
    (OUT / "transfer.md").write_text(table + "\n")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
