"""Region-of-interest JPEG decoding against the whole-image decode, in RAM.

Both paths of ``stoker.pipeline.decode.decode_planned`` on the same photos and the same
RandomResizedCrop(224) boxes, written into a batch row: ``region`` (stoker._jpegroi: only the
crop's rows and columns at the DCT scale) and ``whole`` (simplejpeg decodes the image at the
DCT scale, then the crop is cut out), and ``whole, every scale``: the whole decode at any of
libjpeg-turbo's eight scales, as stoker decoded before the region decoder. Rounds rotate the
order so that load from other processes falls on all alike; the table gives medians, of
wall time and (one thread) of the thread's CPU time.

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


MODES = ("whole, every scale", "whole", "region")
EVERY_SCALE = ((1, 8), (1, 4), (3, 8), (1, 2), (5, 8), (3, 4), (7, 8))


def _run(images: list[bytes], threads: int, mode: str) -> tuple[float, float]:
    """Wall and CPU seconds (CPU: this thread's, meaningful for one thread) for one pass."""
    out = np.empty((len(images), 224, 224, 3), dtype=np.uint8)

    def one(i: int) -> None:
        decode_planned(images[i], TRANSFORM, random.Random(i), out=out[i])

    decoder = decode._roi_decoder if mode == "region" else (lambda: None)
    scales = EVERY_SCALE if mode == "whole, every scale" else decode._DCT_SCALES
    with (
        mock.patch.object(decode, "_roi_decoder", decoder),
        mock.patch.object(decode, "_DCT_SCALES", scales),
    ):
        start, cpu = time.perf_counter(), time.thread_time()
        if threads == 1:
            for i in range(len(images)):
                one(i)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, range(len(images)), chunksize=16))
        return time.perf_counter() - start, time.thread_time() - cpu


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
    results: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for threads in (1, 2):
        seconds: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
        for mode in MODES:  # warm up
            _run(images, threads, mode)
        for round_ in range(args.rounds):
            for k in range(len(MODES)):
                mode = MODES[(round_ + k) % len(MODES)]
                seconds[mode].append(_run(images, threads, mode))
        results[str(threads)] = seconds
    print(f"{len(images)} photos from {args.data}, RandomResizedCrop(224)+flip, {args.rounds}")
    print("| decode | 1 thread: ms/image | CPU ms/image | 2 threads: images/s | CPU vs before |")
    print("| --- | ---: | ---: | ---: | ---: |")
    summary: dict[str, dict[str, float]] = {}
    for mode in MODES:
        one = results["1"][mode]
        wall = statistics.median(w for w, _ in one) / len(images) * 1e3
        cpu = statistics.median(c for _, c in one) / len(images) * 1e3
        rate = len(images) / statistics.median(w for w, _ in results["2"][mode])
        summary[mode] = {"ms_per_image": wall, "cpu_ms_per_image": cpu, "images_per_s_2": rate}
    for mode in MODES:
        row = summary[mode]
        ratio = row["cpu_ms_per_image"] / summary[MODES[0]]["cpu_ms_per_image"]
        print(
            f"| {mode} | {row['ms_per_image']:.3f} | {row['cpu_ms_per_image']:.3f} "
            f"| {row['images_per_s_2']:,.0f} | {ratio:.2f}x |"
        )
    out = Path("benchmarks/out/jpeg_roi.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"images": len(images), "raw": results, "median": summary}, indent=1))


if __name__ == "__main__":
    main()
