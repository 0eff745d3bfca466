"""Autotune against a hand-picked sweep: is ``threads="auto", prefetch="auto"`` near the best?

On the two datasets of ``loader.py`` (real photos, in SeaweedFS behind the 20 ms / 1 Gbit/s
proxy), stream batches of 256 RandomResizedCrop(224) + flip images with every combination
of decode threads and prefetch depth in the grid, each in a fresh process with a cold
store connection, then once more with both on "auto". Reports images/s of each, the best
hand-picked setting, and auto's ratio to it.

    pip install -e '.[bench]' scikit-image
    python benchmarks/autotune.py                     # both sets, ~15 minutes on 2 cores
    python benchmarks/autotune.py --sets b --images 2560 --threads 1,2,3 --prefetch 2,4

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
import json, logging, sys, time
from stoker import DecodeConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop

url, images, threads, prefetch = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
loader = Loader(
    url,
    batch_size=256,
    transform=RandomResizedCrop(224, flip=True),
    decode=DecodeConfig(threads=threads if threads == "auto" else int(threads)),
    prefetch=prefetch if prefetch == "auto" else int(prefetch),
)
started = time.perf_counter()
seen = 0
for batch in loader:
    seen += len(batch["label"])
    if seen >= images:
        break
seconds = time.perf_counter() - started
print(json.dumps({"images": seen, "seconds": seconds, "images_per_s": seen / seconds,
                  "threads": loader.num_threads, "prefetch": loader.prefetch}))
"""


def run_one(url: str, images: int, threads: str, prefetch: str, env: dict[str, str]) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(images), threads, prefetch],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout)
    result["log"] = [line for line in done.stderr.splitlines() if "autotune" in line]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sets", default="a,b")
    parser.add_argument("--images", type=int, default=7680, help="images per run")
    parser.add_argument("--threads", default="1,2,3,4")
    parser.add_argument("--prefetch", default="1,2,4,8")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from loader import BUCKET, SETS, prepare_set  # the same data as the loader benchmark
    from stoker.testing.netproxy import LinkConfig, NetProxy
    from stoker.testing.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer

    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"cpus": os.cpu_count(), "images_per_run": args.images}
    lines = [
        f"# Autotune against a sweep: batches of 256 at 224x224, {args.rtt_ms:g} ms RTT, "
        f"1 Gbit/s, {os.cpu_count()} CPUs, {args.images} images per run",
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
                _, mean_kb = prepare_set(name, SETS[name], server)
                url = f"s3://{BUCKET}/{name}/shards"
                grid: dict[str, Any] = {}
                for threads in args.threads.split(","):
                    for prefetch in args.prefetch.split(","):
                        started = time.perf_counter()
                        grid[f"{threads}/{prefetch}"] = run_one(
                            url, args.images, threads, prefetch, env
                        )
                        print(
                            f"[{name}] threads {threads} prefetch {prefetch}: "
                            f"{grid[f'{threads}/{prefetch}']['images_per_s']:.0f} images/s "
                            f"({time.perf_counter() - started:.0f} s)",
                            flush=True,
                        )
                auto = run_one(url, args.images, "auto", "auto", env)
                print(f"[{name}] auto: {auto['images_per_s']:.0f} images/s", flush=True)
                for line in auto["log"]:
                    print(f"[{name}]   {line}", flush=True)
                best_key = max(grid, key=lambda k: grid[k]["images_per_s"])
                best = grid[best_key]["images_per_s"]
                results[name] = {"mean_kb": mean_kb, "grid": grid, "auto": auto, "best": best_key}
                lines += [
                    f"## set {name} ({mean_kb:.0f} kB per image)",
                    "",
                    "| threads \\ prefetch | " + " | ".join(args.prefetch.split(",")) + " |",
                    "| --- |" + " ---: |" * len(args.prefetch.split(",")),
                ]
                for threads in args.threads.split(","):
                    cells = [
                        f"{grid[f'{threads}/{p}']['images_per_s']:.0f}"
                        for p in args.prefetch.split(",")
                    ]
                    lines.append(f"| {threads} | " + " | ".join(cells) + " |")
                lines += [
                    "",
                    f"Best hand-picked: threads/prefetch {best_key}, {best:.0f} images/s. "
                    f"Auto: {auto['images_per_s']:.0f} images/s "
                    f"(ended on {auto['threads']} threads, prefetch {auto['prefetch']}), "
                    f"**{auto['images_per_s'] / best:.2f}x** the best.",
                    "",
                ]
    (OUT / "autotune.json").write_text(json.dumps(results, indent=2))
    (OUT / "autotune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
