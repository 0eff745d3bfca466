"""Pack 25,000 small JPEGs from a bucket into shards in the same bucket, through an emulated
cloud link, against a sequential loop over the same files and against stoker's own
parallel download of them (the upper bound for reading them). Pack checks every image as
training's decoder would (a strict libjpeg-turbo decode of each JPEG's scan); a second pack
with no image check shows what that costs. The goal: pack >= 0.8x the download bound.

    pip install -e '.[bench]'
    python benchmarks/pack.py                 # 25,000 files (a few minutes on 2 cores)
    python benchmarks/pack.py --files 3000    # quick look

Writes benchmarks/out/pack.json and benchmarks/out/pack.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.pack.reencode import ImagePolicy
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, download, upload
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

BUCKET = "bench-pack"
OUT = Path(__file__).resolve().parent / "out"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=25_000)
    parser.add_argument("--sequential-sample", type=int, default=1000)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=125e6, help="link bytes/s (1 Gbit/s)")
    parser.add_argument("--workers", type=int, default=64)
    args = parser.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="stoker-bench-pack-"))
    rows: dict[str, dict[str, Any]] = {}
    try:
        paths = write_image_folder(
            scratch / "src", files=args.files, classes=100, width=200, height=150
        )
        total = sum(p.stat().st_size for p in paths)
        print(f"{args.files} JPEGs, mean {total / len(paths) / 1000:.1f} kB", flush=True)
        with SeaweedServer() as server:
            server.create_bucket(BUCKET)
            upload(
                scratch / "src",
                open_store(f"s3://{BUCKET}/raw", storage_options=server.storage_options()),
                config=TransferConfig(workers=64),
            )
            link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.rate)
            with NetProxy("127.0.0.1", server.port, link=link) as proxy:
                options = server.storage_options(proxy.endpoint)
                store = open_store(f"s3://{BUCKET}/raw", storage_options=options)

                keys = sorted(m.key for m in store.list(""))[: args.sequential_sample]
                started = time.perf_counter()
                read = sum(len(store.get(k)) for k in keys)
                seconds = time.perf_counter() - started
                rows["sequential GET loop (read only)"] = {
                    "files": len(keys),
                    "bytes": read,
                    "seconds": seconds,
                }

                started = time.perf_counter()
                report = download(store, scratch / "dl", config=TransferConfig(workers=64))
                rows["stoker download (the bound)"] = {
                    "files": report.files_transferred,
                    "bytes": report.bytes_transferred,
                    "seconds": time.perf_counter() - started,
                }
                shutil.rmtree(scratch / "dl")

                started = time.perf_counter()
                packed = pack(
                    f"s3://{BUCKET}/raw",
                    f"s3://{BUCKET}/packed",
                    storage_options=options,
                    config=PackConfig(workers=args.workers),
                )
                rows["stoker pack"] = {
                    "files": packed.samples,
                    "bytes": packed.bytes_in,
                    "seconds": time.perf_counter() - started,
                    "shards": packed.shards,
                }
                # The same pack with no image check at all, to show what the checks cost
                # (the JPEG check decodes every scan strictly at 1/8 scale, as training would).
                started = time.perf_counter()
                unchecked = pack(
                    f"s3://{BUCKET}/raw",
                    f"s3://{BUCKET}/packed-unchecked",
                    storage_options=options,
                    config=PackConfig(workers=args.workers, images=ImagePolicy(check=False)),
                )
                rows["stoker pack, images unchecked"] = {
                    "files": unchecked.samples,
                    "bytes": unchecked.bytes_in,
                    "seconds": time.perf_counter() - started,
                    "shards": unchecked.shards,
                }
                dataset = open_dataset(f"s3://{BUCKET}/packed", storage_options=options)
                verified = dataset.verify()
                if not verified.ok or len(dataset) != args.files:
                    raise SystemExit(f"pack did not verify: {verified.corrupt[:5]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    bound = rows["stoker download (the bound)"]
    bound_rate = bound["files"] / bound["seconds"]
    lines = [
        f"# Pack benchmark: {args.files} JPEGs of {total / args.files / 1000:.1f} kB, "
        f"{args.rtt_ms:g} ms RTT, {args.rate * 8 / 1e9:g} Gbit/s",
        "",
        "| method | files | seconds | images/s | MB/s | vs download bound |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in rows.items():
        row["images_per_s"] = row["files"] / row["seconds"]
        row["mb_per_s"] = row["bytes"] / row["seconds"] / 1e6
        row["vs_download"] = row["images_per_s"] / bound_rate
        lines.append(
            f"| {name} | {row['files']} | {row['seconds']:.2f} | "
            f"{row['images_per_s']:.0f} | {row['mb_per_s']:.1f} | "
            f"{row['vs_download']:.2f}x |"
        )
    lines += [
        "",
        f"Sequential loop timed on the first {len(keys)} files. Pack wrote "
        f"{rows['stoker pack']['shards']} shards and verified them. Machine: "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}.",
    ]
    table = "\n".join(lines)
    (OUT / "pack.json").write_text(json.dumps({"files": args.files, "rows": rows}, indent=2))
    (OUT / "pack.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
