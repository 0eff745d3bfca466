"""Stream a packed dataset from a bucket into batches: stoker against the usual baselines.

Two datasets made from real photographs (scikit-image's sample photos and, if installed,
Debian's mate-backgrounds): (a) 20,000 photos of 500x375 (~100 kB) and (b) 25,000 of
150x150. Data sit in SeaweedFS behind the 20 ms / 1 Gbit/s proxy. Every method produces
batches of 256 RandomResizedCrop(224) + flip uint8 images, on this machine's cores:

- limit: the same bytes already in RAM, decoded and transformed by the fastest path we
  have (libjpeg-turbo with DCT scaling, both cores), no I/O at all;
- stoker: ``stoker bench`` in its own process (cold: no cache), packed shards;
- per-object DataLoader: torch DataLoader(num_workers=2), one boto3 GET per sample;
- download + ImageFolder-style: ``stoker download`` of the originals, then a
  DataLoader(num_workers=2) reading local files (torchvision does not import beside the
  CPU torch wheel here, so its ImageFolder is reproduced: PIL open, RGB, crop, resize);
- WebDataset over the same shards (presigned HTTP URLs through the proxy, num_workers=2).

    pip install -e '.[bench,torch]' scikit-image && apt-get install mate-backgrounds
    python benchmarks/loader.py                    # both sets, ~10 minutes on 2 cores

Writes benchmarks/out/loader.json and benchmarks/out/loader.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import torch
import webdataset as wds
from botocore.config import Config
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.decode import decode_planned
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, download, upload
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.photos import write_photo_folder
from stoker.testing.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer

OUT = Path(__file__).resolve().parent / "out"
BUCKET = "bench-loader"
BATCH = 256
TRANSFORM = RandomResizedCrop(224, flip=True)
SETS = {
    "a": {"files": 20_000, "width": 500, "height": 375, "quality": 95, "grain": 8.0},
    "b": {"files": 25_000, "width": 150, "height": 150, "quality": 90, "grain": 3.0},
}


def pil_transform(data: bytes, rng: random.Random) -> np.ndarray:
    """What a torchvision pipeline does: full PIL decode, then crop, resize, flip."""
    with Image.open(io.BytesIO(data)) as image:
        rgb = image.convert("RGB")
    plan = TRANSFORM.plan(rgb.width, rgb.height, rng)
    left, top, w, h = plan.box
    out = rgb.resize(plan.size[::-1], Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if plan.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.array(out)  # writable, as torch's collate wants


def boto(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=4),
    )


class PerObject(Dataset[tuple[np.ndarray, int]]):
    def __init__(self, endpoint: str, keys: list[str]) -> None:
        self.endpoint, self.keys, self.client = endpoint, keys, None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        if self.client is None:
            self.client = boto(self.endpoint)
        body = self.client.get_object(Bucket=BUCKET, Key=self.keys[i])["Body"].read()
        label = int(self.keys[i].split("class_")[1][:3])
        return pil_transform(body, random.Random(i)), label


class LocalFiles(Dataset[tuple[np.ndarray, int]]):
    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return pil_transform(self.paths[i].read_bytes(), random.Random(i)), 0


def wds_map(sample: dict[str, Any]) -> tuple[np.ndarray, int]:
    """WebDataset's per-sample work: the same PIL decode and transform."""
    return pil_transform(sample["jpg"], random.Random(sample["__key__"])), 0


def time_loader(loader: Any, limit: int) -> dict[str, float]:
    started = time.perf_counter()
    first = 0.0
    seen = 0
    for batch in loader:
        if not seen:
            first = time.perf_counter() - started
        seen += len(batch[0]) if isinstance(batch, list | tuple) else len(batch)
        if seen >= limit:
            break
    seconds = time.perf_counter() - started
    return {
        "images": seen,
        "seconds": seconds,
        "images_per_s": seen / seconds,
        "first_batch_s": first,
    }


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (None: this one), from /proc."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def limit_rate(paths: list[Path], count: int, threads: int) -> dict[str, float]:
    data = [p.read_bytes() for p in paths[:count]]
    out = np.empty((BATCH, 224, 224, 3), dtype=np.uint8)

    def work(i: int) -> None:
        decode_planned(data[i], TRANSFORM, random.Random(i), out=out[i % BATCH])

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(len(data))))
    seconds = time.perf_counter() - started
    return {"images": len(data), "seconds": seconds, "images_per_s": len(data) / seconds}


def prepare_set(name: str, spec: dict[str, Any], server: SeaweedServer) -> tuple[list[Path], float]:
    """Generate set ``name`` (once; kept in benchmarks/out/data), upload it and pack it."""
    source = OUT / "data" / name
    marker = source / f".complete-{spec['files']}"
    if not marker.exists():
        shutil.rmtree(source, ignore_errors=True)
        print(f"[{name}] generating {spec['files']} photos", flush=True)
        write_photo_folder(
            source,
            files=spec["files"],
            width=spec["width"],
            height=spec["height"],
            quality=spec["quality"],
            grain=spec["grain"],
        )
        marker.touch()
    paths = sorted(source.rglob("*.jpg"))
    mean_kb = sum(p.stat().st_size for p in paths) / len(paths) / 1000
    direct = server.storage_options()
    upload(
        source,
        open_store(f"s3://{BUCKET}/{name}/raw", storage_options=direct),
        config=TransferConfig(workers=64, exclude=(".complete-*",)),
    )
    pack(
        f"s3://{BUCKET}/{name}/raw",
        f"s3://{BUCKET}/{name}/shards",
        storage_options=direct,
        config=PackConfig(max_shard_bytes=32_000_000),
    )
    print(f"[{name}] {len(paths)} photos, mean {mean_kb:.1f} kB, packed", flush=True)
    return paths, mean_kb


def run_set(
    name: str,
    spec: dict[str, Any],
    server: SeaweedServer,
    proxy: NetProxy,
    args: argparse.Namespace,
    scratch: Path,
) -> dict[str, Any]:
    paths, mean_kb = prepare_set(name, spec, server)
    source = OUT / "data" / name
    results: dict[str, Any] = {"mean_kb": mean_kb, "files": len(paths)}
    cores = os.cpu_count() or 2

    results["limit"] = limit_rate(paths, args.limit_images, cores)
    print(f"[{name}] limit {results['limit']['images_per_s']:.0f} images/s", flush=True)

    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": proxy.endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
    }
    batches = max(1, args.stoker_images // BATCH)
    server_cpu, harness_cpu, wall = cpu_seconds(server.pid), cpu_seconds(None), time.time()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stoker",
            "bench",
            f"s3://{BUCKET}/{name}/shards",
            "--batch-size",
            str(BATCH),
            "--batches",
            str(batches),
            "--size",
            "224",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    results["stoker"] = json.loads(done.stdout)
    wall = time.time() - wall
    # The server and the proxy (a thread of this process) share the cores with the client:
    # how much of the machine they took while stoker ran.
    results["stoker"]["server_cores"] = (cpu_seconds(server.pid) - server_cpu) / wall
    results["stoker"]["proxy_cores"] = (cpu_seconds(None) - harness_cpu) / wall
    print(f"[{name}] stoker {results['stoker']['images_per_s']:.0f} images/s", flush=True)

    if args.methods != "all":
        return results
    keys = [f"{name}/raw/{p.relative_to(source).as_posix()}" for p in paths]
    random.Random(0).shuffle(keys)
    per_object = DataLoader(
        PerObject(proxy.endpoint, keys),
        batch_size=BATCH,
        num_workers=2,
        multiprocessing_context="spawn",
    )
    results["per_object"] = time_loader(per_object, args.slow_images)
    print(f"[{name}] per-object {results['per_object']['images_per_s']:.0f} images/s", flush=True)

    started = time.perf_counter()
    local = scratch / f"{name}-download"
    download(
        open_store(
            f"s3://{BUCKET}/{name}/raw", storage_options=server.storage_options(proxy.endpoint)
        ),
        local,
    )
    download_s = time.perf_counter() - started
    local_paths = sorted(local.rglob("*.jpg"))
    random.Random(0).shuffle(local_paths)
    folder = DataLoader(
        LocalFiles(local_paths), batch_size=BATCH, num_workers=2, multiprocessing_context="spawn"
    )
    results["download_folder"] = {**time_loader(folder, args.slow_images), "download_s": download_s}
    shutil.rmtree(local, ignore_errors=True)
    print(
        f"[{name}] download {download_s:.1f} s, folder "
        f"{results['download_folder']['images_per_s']:.0f} images/s",
        flush=True,
    )

    client = boto(proxy.endpoint)
    shard_keys = sorted(
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=f"{name}/shards/shard-"
        )
        for o in page.get("Contents", [])
    )
    urls = [
        client.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": k}, ExpiresIn=3600
        )
        for k in shard_keys
    ]

    pipeline = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .shuffle(1000)
        .map(wds_map)
        .batched(BATCH)
    )
    results["webdataset"] = time_loader(
        DataLoader(pipeline, batch_size=None, num_workers=2, multiprocessing_context="spawn"),
        args.stoker_images,
    )
    print(f"[{name}] webdataset {results['webdataset']['images_per_s']:.0f} images/s", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sets", default="a,b")
    parser.add_argument("--limit-images", type=int, default=3000)
    parser.add_argument("--stoker-images", type=int, default=10_240)
    parser.add_argument(
        "--slow-images",
        type=int,
        default=2048,
        help="images timed for the per-object and folder baselines",
    )
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument(
        "--methods",
        choices=["all", "stoker"],
        default="all",
        help="'stoker' measures only the limit and stoker (quick)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="stoker-bench-loader-"))
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}
    }
    try:
        with SeaweedServer() as server:
            server.create_bucket(BUCKET)
            link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=125e6)
            with NetProxy("127.0.0.1", server.port, link=link) as proxy:
                for name in args.sets.split(","):
                    results[name] = run_set(name, SETS[name], server, proxy, args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    lines = [
        f"# Loader benchmark: batches of {BATCH} at 224x224, RandomResizedCrop + flip, "
        f"{args.rtt_ms:g} ms RTT, 1 Gbit/s, {os.cpu_count()} CPUs",
        "",
        "| set | method | images | images/s | vs limit | stoker is | first batch s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    names = {
        "limit": "limit: decode+transform from RAM",
        "stoker": "stoker",
        "per_object": "DataLoader, per-object GETs",
        "download_folder": "download, then folder DataLoader",
        "webdataset": "WebDataset, same shards",
    }
    for name in args.sets.split(","):
        r = results[name]
        stoker_rate = r["stoker"]["images_per_s"]
        for method, label in names.items():
            if method not in r:
                continue
            row = r[method]
            rate = row["images_per_s"]
            first = row.get("first_batch_s")
            count = row.get("images", row.get("samples"))
            lines.append(
                f"| {name} ({r['mean_kb']:.0f} kB) | {label} | {count} "
                f"| {rate:.0f} | {rate / r['limit']['images_per_s']:.2f}x | "
                f"{stoker_rate / rate:.2f}x | {'' if first is None else f'{first:.2f}'} |"
            )
        lines.append(f"| {name} | stoker peak RSS | | {r['stoker']['peak_rss_mb']:.0f} MB | | | |")
        lines.append(
            f"| {name} | cores taken by server + proxy during stoker's run | | "
            f"{r['stoker']['server_cores']:.2f} + {r['stoker']['proxy_cores']:.2f} | | | |"
        )
        if "download_folder" in r:
            lines.append(
                f"| {name} | download of all originals | | "
                f"{r['download_folder']['download_s']:.1f} s | | | |"
            )
    table = "\n".join(lines)
    (OUT / "loader.json").write_text(json.dumps(results, indent=2))
    (OUT / "loader.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
