"""What the loader costs beyond decoding: CPU per image, loader against the bare decode.

No server and no proxy: the shards lie on local disk, so every CPU second is the loader's
own. Each measurement runs in a fresh process and reads the CPU time of the whole process
(all its threads). Runs alternate between the methods, ``--rounds`` times, and the table
shows the median of each:

- bare: the same samples already in RAM, decoded and transformed one after another into a
  reused array by the loader's own decoder, in one thread (the floor);
- loader, 1 and 2 decode threads: a whole epoch of batches of 256, shuffled.

"overhead" is loader CPU per image over bare CPU per image, minus one: reading and
checking the tar members, fetch scheduling, thread hand-offs, batch arrays, collate.

    pip install -e '.[bench]'
    python benchmarks/overhead.py                 # 8,000 photos of 150x150, ~2 minutes
    python benchmarks/overhead.py --images 2000 --rounds 1
    python benchmarks/overhead.py --against ../old/src   # this checkout against another

``--against SRC`` runs every method a second time with the stoker under ``SRC`` (another
checkout's ``src/``), alternating with this one's in every round, and adds its rows and
the ratio of the two: a change that should leave speed alone is checked in one run. Which
tree runs first alternates by round (ABBA), so use an even number of rounds.

Writes benchmarks/out/overhead.json and benchmarks/out/overhead.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"

CHILD = """
import json, resource, sys, time
import numpy as np
import stoker
from stoker.format.reader import open_dataset
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.pipeline.workers import SampleDecoder

url, method = sys.argv[1], sys.argv[2]
transform = RandomResizedCrop(224, flip=True)

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

if method == "bare":
    dataset = open_dataset(url)
    samples = dataset.read_many(list(range(len(dataset))))
    decoder = SampleDecoder(transform, 0)
    out = np.empty((224, 224, 3), np.uint8)
    cpu0, wall0 = cpu(), time.perf_counter()
    for i, sample in enumerate(samples):
        decoder(i, 0, sample, out)
    images = len(samples)
else:
    threads = int(method.rpartition("-")[2])
    if hasattr(stoker, "DecodeConfig"):
        options = {"decode": stoker.DecodeConfig(threads=threads)}
    else:  # a checkout from before the config objects (--against)
        options = {"num_threads": threads}
    with Loader(url, batch_size=256, transform=transform, **options) as loader:
        cpu0, wall0 = cpu(), time.perf_counter()
        images = sum(len(batch["label"]) for batch in loader)
        # What the epoch read from the store (an older checkout may not count it).
        counts = getattr(loader.stats(), "requests", {}) if hasattr(loader, "stats") else {}
        read = {"bytes_read": counts.get("bytes.read"), "gets": counts.get("requests.get")}
result = {"images": images, "cpu_s": cpu() - cpu0, "wall_s": time.perf_counter() - wall0}
print(json.dumps({**result, **(read if method != "bare" else {})}))
"""

METHODS = {
    "bare": "bare decode + transform from RAM, 1 thread",
    "loader-1": "loader, 1 decode thread",
    "loader-2": "loader, 2 decode threads",
}


def prepare(images: int) -> Path:
    """Generate ``images`` photos like the loader benchmark's set b (once) and pack them."""
    from stoker.pack.packer import pack
    from stoker.testing.photos import write_photo_folder

    source = OUT / "data" / f"overhead-{images}"
    packed = OUT / "data" / f"overhead-{images}-packed"
    marker = source / ".complete"
    if not marker.exists():
        print(f"generating {images} photos of 150x150", flush=True)
        write_photo_folder(source, files=images, width=150, height=150, quality=90, grain=3.0)
        marker.touch()
    if not (packed / "index.json").exists():
        pack(source, packed)
    return packed


def run_one(url: Path, method: str, src: Path | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(url), method],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{method} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--against",
        type=Path,
        metavar="SRC",
        help="another checkout's src/ directory: run every method with it too, alternating",
    )
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    url = prepare(args.images)
    trees: dict[str, Path | None] = {"this": None}
    if args.against is not None:
        trees["against"] = args.against.resolve()
    runs: dict[str, list[dict[str, Any]]] = {
        f"{method}@{tree}": [] for tree in trees for method in METHODS
    }
    for round_number in range(args.rounds):
        # ABBA: which tree goes first alternates by round, so drift and order cancel out.
        ordered = list(trees.items())[:: -1 if round_number % 2 else 1]
        for method in METHODS:
            for tree, src in ordered:
                result = run_one(url, method, src)
                runs[f"{method}@{tree}"].append(result)
                print(
                    f"round {round_number + 1}: {method:9s} {tree:7s} {result['cpu_s']:6.2f} s "
                    f"CPU {result['images'] / result['wall_s']:7.0f} images/s",
                    flush=True,
                )

    def median(run: str, key: str) -> float:
        return float(statistics.median(r[key] / r["images"] for r in runs[run]))

    title = (
        f"# Loader CPU beyond decoding: {args.images} photos of 150x150, RandomResizedCrop(224)"
        f" + flip, local disk, {os.cpu_count()} CPUs, median of {args.rounds} rounds"
    )
    if args.against is not None:
        title += f"; 'against' is {args.against}, alternating with this checkout (ABBA)"
    shard_bytes = sum(p.stat().st_size for p in url.glob("shard-*"))
    lines = [
        title,
        "",
        "| method | tree | ms CPU per image | overhead | images/s | MB read per epoch "
        "| x shard bytes | GETs per epoch |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    summary: dict[str, Any] = {"images": args.images, "rounds": args.rounds, "runs": runs}
    for method, label in METHODS.items():
        for tree in trees:
            run = f"{method}@{tree}"
            per_image = median(run, "cpu_s")
            rate = 1 / median(run, "wall_s")
            overhead = per_image / median(f"bare@{tree}", "cpu_s") - 1
            summary[run] = {"ms_cpu_per_image": 1000 * per_image, "overhead": overhead}
            shown = "" if method == "bare" else f"{100 * overhead:.0f} %"
            read = [r.get("bytes_read") for r in runs[run]]
            gets = [r.get("gets") for r in runs[run]]
            counted = "| | |"
            if None not in read and None not in gets:  # a whole epoch each: per epoch
                mb = statistics.median(read) / 1e6
                counted = (
                    f"{mb:,.1f} | {1e6 * mb / shard_bytes:.3f}x | {statistics.median(gets):,.0f} |"
                )
            lines.append(
                f"| {label} | {tree} | {1000 * per_image:.3f} | {shown} | {rate:.0f} | {counted}"
            )
    if args.against is not None:
        lines += ["", "| method | CPU per image, this / against | images/s, this / against |"]
        lines.append("| --- | ---: | ---: |")
        for method, label in METHODS.items():
            cpu_ratio = median(f"{method}@this", "cpu_s") / median(f"{method}@against", "cpu_s")
            rate_ratio = median(f"{method}@against", "wall_s") / median(f"{method}@this", "wall_s")
            lines.append(f"| {label} | {cpu_ratio:.3f} | {rate_ratio:.3f} |")
    text = "\n".join(lines) + "\n"
    (OUT / "overhead.md").write_text(text, encoding="utf-8")
    (OUT / "overhead.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
