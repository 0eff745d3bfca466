"""Region-of-interest JPEG decoding against the whole-image decode, in RAM.

Both paths of ``stoker.pipeline.decode.decode_planned`` on the same photos and the same
RandomResizedCrop(224) boxes, written into a batch row: ``region`` (stoker._jpegroi: only the
crop's rows and columns at the DCT scale) and ``whole`` (simplejpeg decodes the image at the
DCT scale, then the crop is cut out). Rounds alternate (region, whole, whole, region, ...) so
that load from other processes falls on both alike; the table gives medians.

    python benchmarks/jpeg_roi.py [--images 400] [--rounds 6] [--data benchmarks/out/data/a]

The photos are those ``benchmarks/loader.py`` generates (set a: about 500x375); writes
``benchmarks/out/jpeg_roi.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np

from stoker.pipeline import decode
from stoker.pipeline.decode import decode_planned, roi_decoding
from stoker.pipeline.transforms import RandomResizedCrop

TRANSFORM = RandomResizedCrop(224, flip=True)


def _run(images: list[bytes], threads: int, *, region: bool) -> float:
    """Seconds for one pass over ``images``."""
    out = np.empty((len(images), 224, 224, 3), dtype=np.uint8)

    def one(i: int) -> None:
        decode_planned(images[i], TRANSFORM, random.Random(i), out=out[i])

    decoder = decode._roi_decoder if region else (lambda: None)
    with mock.patch.object(decode, "_roi_decoder", decoder):
        start = time.perf_counter()
        if threads == 1:
            for i in range(len(images)):
                one(i)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, range(len(images)), chunksize=16))
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--data", type=Path, default=Path("benchmarks/out/data/a"))
    args = parser.parse_args()
    if not roi_decoding():
        raise SystemExit("stoker._jpegroi is not available: nothing to compare")
    paths = sorted(args.data.glob("*/*.jpg"))[: args.images]
    if not paths:
        raise SystemExit(f"no photos under {args.data}: run benchmarks/loader.py first")
    images = [p.read_bytes() for p in paths]
    results: dict[str, dict[str, list[float]]] = {}
    for threads in (1, 2):
        seconds: dict[str, list[float]] = {"region": [], "whole": []}
        _run(images, threads, region=True)  # warm up both
        _run(images, threads, region=False)
        for round_ in range(args.rounds):
            order = ["region", "whole"] if round_ % 2 == 0 else ["whole", "region"]
            for name in order:
                seconds[name].append(_run(images, threads, region=name == "region"))
        results[str(threads)] = seconds
    print(f"{len(images)} photos from {args.data}, RandomResizedCrop(224)+flip, {args.rounds}")
    print("| threads | whole: ms/image | region: ms/image | region / whole |")
    print("| ---: | ---: | ---: | ---: |")
    summary = {}
    for threads, seconds in results.items():
        whole = statistics.median(seconds["whole"]) / len(images) * 1e3
        region = statistics.median(seconds["region"]) / len(images) * 1e3
        summary[threads] = {"whole_ms": whole, "region_ms": region, "ratio": region / whole}
        print(f"| {threads} | {whole:.3f} | {region:.3f} | {region / whole:.2f}x |")
    out = Path("benchmarks/out/jpeg_roi.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"images": len(images), "raw": results, "median": summary}, indent=1))


if __name__ == "__main__":
    main()
