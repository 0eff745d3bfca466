"""Autotune against a hand-picked sweep: are the Loader's defaults near the best?

On the two datasets of ``loader.py`` (real photos, in SeaweedFS behind the 20 ms / 1 Gbit/s
proxy; set a with RandomResizedCrop(224) + flip, set b with Resize(224x224) + flip),
stream two epochs (``--epochs``) of batches of 256 with every combination of decode
threads and prefetch depth in the grid, each in a fresh process with a cold store
connection, then once more on the Loader's defaults (``threads="cpus"``, one per CPU, and
``prefetch="auto"``; ``--auto-threads`` makes it ``threads="auto"``, the opt-in thread
tuner). A setting's rate is its images/s over the second half of its run (for auto: from
where it settled, if that came later), so that the comparison is of what autotune settles
on, against the best fixed setting (issue 16: at least 0.95x).
Each run's bytes and requests are the proxy's counts, per epoch.

    pip install -e '.[bench]' scikit-image
    python benchmarks/autotune.py                     # both sets, ~15 minutes on 2 cores
    python benchmarks/autotune.py --sets b --threads 1,2,3 --prefetch 2,4
    python benchmarks/autotune.py --quick             # 1,500 photos a set: a smoke run

Writes benchmarks/out/autotune.json and benchmarks/out/autotune.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"

CHILD = """
import json, logging, resource, sys, time
from stoker import DecodeConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop, Resize

url, kind, images, threads, prefetch = sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:6]
epochs = int(sys.argv[6])
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
transform = RandomResizedCrop(224, flip=True) if kind == "crop" else Resize((224, 224), flip=True)
loader = Loader(
    url,
    batch_size=256,
    transform=transform,
    decode=DecodeConfig(threads=threads if threads in ("auto", "cpus") else int(threads)),
    prefetch=prefetch if prefetch == "auto" else int(prefetch),
)
total = images or epochs * len(loader.dataset)
started = time.perf_counter()
seen, half, settled = 0, None, None
while seen < total:
    for batch in loader:  # epoch after epoch
        seen += len(batch["label"])
        now = time.perf_counter()
        if half is None and seen >= total // 2:
            half = (now, seen)
        if settled is None and loader.stats().autotune != "tuning":
            settled = (now, seen)
        if seen >= total:
            break
end = time.perf_counter()
stats = loader.stats()
marks = [m for m in (half, settled) if m is not None]
tail = max(marks) if marks else (started, 0)
print(json.dumps({
    "images": seen, "seconds": end - started, "images_per_s": seen / (end - started),
    # The second half of the run, or from where autotune settled if that came later.
    "tail_images_per_s": (seen - tail[1]) / (end - tail[0]) if end > tail[0] else 0.0,
    "settled_after_images": None if settled is None else settled[1],
    "threads": loader.num_threads, "prefetch": loader.prefetch,
    "own_bytes_read": stats.requests.get("bytes.read", 0),
    "own_gets": stats.requests.get("requests.get", 0),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def run_one(
    url: str, kind: str, args: Any, threads: str, prefetch: str, env: dict[str, str], proxy: Any
) -> Any:
    before = proxy.stats()
    command = [url, kind, str(args.images), threads, prefetch, str(args.epochs)]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *command],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    after = proxy.stats()
    result = json.loads(done.stdout)
    result["bytes"] = after.bytes_down - before.bytes_down
    result["requests"] = after.requests - before.requests
    result["log"] = [line for line in done.stderr.splitlines() if "autotune" in line]
    return result


def _table(name: str, prep: Any, grid: dict[str, Any], auto: Any, args: Any) -> list[str]:
    threads, prefetch = args.threads.split(","), args.prefetch.split(",")
    best_key = max(grid, key=lambda k: grid[k]["tail_images_per_s"])
    best = grid[best_key]["tail_images_per_s"]
    lines = [
        f"## set {name} ({prep.mean_kb:.0f} kB per image, {prep.files} images, {prep.transform})",
        "",
        "Images/s over the second half of each run (auto: from where it settled, if later):",
        "",
        "| threads \\ prefetch | " + " | ".join(prefetch) + " |",
        "| --- |" + " ---: |" * len(prefetch),
    ]
    for t in threads:
        cells = [f"{grid[f'{t}/{p}']['tail_images_per_s']:.0f}" for p in prefetch]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| run | images/s, whole run | images/s, tail | MB read per epoch | x shard bytes "
        "| requests per epoch | peak RSS MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, run in [*grid.items(), ("auto", auto)]:
        scale = prep.files / max(1, run["images"])
        approx = "" if run["images"] % prep.files == 0 else "~"
        per_epoch = run["bytes"] * scale
        lines.append(
            f"| {key} | {run['images_per_s']:.0f} | {run['tail_images_per_s']:.0f} | "
            f"{approx}{per_epoch / 1e6:,.1f} | {approx}{per_epoch / prep.shard_bytes:.3f}x | "
            f"{approx}{run['requests'] * scale:,.0f} | {run['peak_rss_mb']:,.0f} |"
        )
    ratio = auto["tail_images_per_s"] / best
    settled = auto["settled_after_images"]
    where = "never settled" if settled is None else f"settled after {settled:,} images"
    verdict = "PASS" if ratio >= 0.95 else "FAIL"
    lines += [
        "",
        f"Best fixed setting (threads/prefetch): {best_key}, {best:.0f} images/s. Auto: "
        f"{auto['tail_images_per_s']:.0f} images/s ({where}, on {auto['threads']} threads, "
        f"prefetch {auto['prefetch']}): **{ratio:.2f}x** the best "
        f"(issue 16: >= 0.95x: {verdict}); over the whole run "
        f"{auto['images_per_s'] / grid[best_key]['images_per_s']:.2f}x.",
        "",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sets", default="a,b")
    parser.add_argument("--files", type=int, help="photos per set (default: loader.py's sets)")
    parser.add_argument(
        "--images", type=int, default=0, help="images per run (0: --epochs whole epochs)"
    )
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run")
    parser.add_argument("--threads", default="1,2,3,4")
    parser.add_argument("--prefetch", default="2,8")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument(
        "--auto-threads",
        action="store_true",
        help='the last run tunes threads too (threads="auto") instead of the default, one per CPU',
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 1,500 photos, threads 1,2, prefetch 2"
    )
    args = parser.parse_args()
    if args.quick:
        args.files, args.threads, args.prefetch = args.files or 1500, "1,2", "2"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from loader_sets import BUCKET, prepare_set  # the same data as the loader benchmark
    from stoker.testing.netproxy import LinkConfig, NetProxy
    from stoker.testing.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer

    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"cpus": os.cpu_count(), "args": vars(args)}
    lines = [
        f"# Autotune against a sweep: batches of 256 at 224x224, {args.rtt_ms:g} ms RTT, "
        f"1 Gbit/s, {os.cpu_count()} CPUs, per run: "
        f"{f'{args.images} images' if args.images else f'{args.epochs} epochs'}",
        "",
    ]
    with SeaweedServer() as server:
        server.create_bucket(BUCKET)
        link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=125e6)
        with NetProxy("127.0.0.1", server.port, link=link) as proxy:
            env = {
                **os.environ,
                "AWS_ENDPOINT_URL": proxy.endpoint,
                "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION,
            }
            for name in args.sets.split(","):
                prep = prepare_set(name, server, files=args.files)
                url = f"s3://{BUCKET}/{prep.key}/shards"
                grid: dict[str, Any] = {}
                for threads in args.threads.split(","):
                    for prefetch in args.prefetch.split(","):
                        started = time.perf_counter()
                        run = run_one(url, prep.transform, args, threads, prefetch, env, proxy)
                        grid[f"{threads}/{prefetch}"] = run
                        print(
                            f"[{name}] threads {threads} prefetch {prefetch}: "
                            f"{run['tail_images_per_s']:.0f} images/s "
                            f"({time.perf_counter() - started:.0f} s)",
                            flush=True,
                        )
                threads = "auto" if args.auto_threads else "cpus"
                auto = run_one(url, prep.transform, args, threads, "auto", env, proxy)
                print(f"[{name}] auto: {auto['tail_images_per_s']:.0f} images/s", flush=True)
                for line in auto["log"]:
                    print(f"[{name}]   {line}", flush=True)
                results[name] = {"mean_kb": prep.mean_kb, "grid": grid, "auto": auto}
                lines += _table(name, prep, grid, auto, args)
    (OUT / "autotune.json").write_text(json.dumps(results, indent=2))
    (OUT / "autotune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
