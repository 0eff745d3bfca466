"""Clips of videos in a bucket: stoker's packed videos, each clip one ranged GET of the
packets it needs, against downloading each video and cutting its clips with PyAV, and
against torchcodec's ``VideoDecoder`` seeking in downloaded files.

The issue's benchmark: 200 videos of 30-60 s, 720p H.264 (libx264, or the best encoder
PyAV's wheel has; see ``video_data.py`` for how they are made), 8 clips of 16 frames per
video, every frame resized to 224x224, through SeaweedFS behind the 20 ms / 1 Gbit/s
proxy, cold (no cache). Every method delivers the same clips: for each video of F frames
the 8 clips starting at frames ``round(linspace(0, F - 16, 8))`` (stoker's
``VideoConfig(frames=16, clips_per_video=8)`` rule), in batches of 8 clips, uint8
``(8, 16, 224, 224, 3)``:

- stoker: ``Loader(SourceConfig(url, video=VideoConfig(frames=16, stride=1,
  clips_per_video=8)), batch_size=8, transform=Resize((224, 224)))`` on its defaults, over
  the videos packed once by ``stoker.pack`` before any timing;
- PyAV: a torch ``DataLoader(num_workers=2)`` (the platform's default start method) over
  the bucket's video files, each video downloaded whole with boto3 and its clips cut with
  ``container.seek`` and a decode forward (``thread_type="AUTO"``);
- torchcodec: the same DataLoader, each video downloaded to a file and its clips read with
  ``VideoDecoder(path).get_frames_at(indices)``. It is installed into
  benchmarks/out/libs (``pip install --no-deps --target``) unless this environment imports
  it; where it cannot load (PyPI's Linux wheel is the CUDA build, which a CPU-only torch
  cannot load; ``--torchcodec-index`` names another index, PyTorch's CPU one say), its row
  says "unavailable" and why, and the others run.

``video_children.py`` holds the methods (and says what each does, exactly). Every method
runs in a fresh process of its own (``harness.py``), its clock started with the process:
clips/s are its clips over the seconds from the process's start to its last batch, and its
first batch is counted from there. Every method runs ``--repeats`` times (3), the order
rotated each round; the table shows medians. Before each method the harness lets the
machine settle, and every interpreter reads bytecode compiled once into
benchmarks/out/pycache. Bytes and requests are the proxy's own counts (what the server
sent, response heads included), against the bytes of the video files; each method's own
count (stoker's store counters, the baselines' downloaded object sizes) is in the JSON.
Every method reports a digest of each clip (its video, first frame and each frame's mean);
the report says whether they deliver the same clips, and how far apart their pixels are.
The output ends with the issue's goals, each with its measured figure.

    pip install -e '.[bench,video]'
    python benchmarks/video.py                     # 200 videos of 30-60 s at 720p, 3 rounds
    python benchmarks/video.py --videos 24 --seconds 20-40 --height 480   # a middle size
    python benchmarks/video.py --quick             # 6 videos of 8-12 s at 360p, one round

The first run of a size makes its videos (kept in benchmarks/out/data; at 720p about 25
ms of one core a frame: the default set is about 2.5 hours of video, an hour on 2 cores).
Writes benchmarks/out/video.json and benchmarks/out/video.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    add_round_args,
    machine,
    method_lines,
    rounds,
    run_child,
    run_rounds,
    s3_env,
    strongest,
    write_report,
)
from quiet import compiled_interpreters, settle, settled_text
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer
from video_data import BUCKET, VideoSet, VideoSpec, encoder, licences, prepare, torchcodec_path

CHILD = Path(__file__).resolve().parent / "video_children.py"
OUT = Path(__file__).resolve().parent / "out"
PYCACHE = OUT / "pycache"
METHODS = ["stoker", "pyav", "torchcodec"]
BASELINES = ["pyav", "torchcodec"]
NAMES = {
    "stoker": "stoker: packed videos, a ranged GET a clip",
    "pyav": "PyAV: download each video, seek + decode, DataLoader(2)",
    "torchcodec": "torchcodec: download to a file, VideoDecoder.get_frames_at, DataLoader(2)",
}
#: The issue's goals.
GOAL_VS_BASELINE = 2.0
GOAL_FIRST_BATCH_S = 2.0
GOAL_BYTES = 0.5


class Bench:
    """The methods, against one server and proxy."""

    def __init__(
        self,
        data: VideoSet,
        server: SeaweedServer,
        proxy: NetProxy,
        clip_args: list[str],
        extra: dict[str, dict[str, str]],
    ) -> None:
        self.data, self.server, self.proxy = data, server, proxy
        self.clip_args, self.extra = clip_args, extra

    def _run(self, method: str, url: str) -> dict[str, Any]:
        """A method in its own process, and what the proxy saw of it."""
        before = self.proxy.stats()
        result = run_child(
            CHILD,
            [method, url, *self.clip_args],
            env=s3_env(self.proxy.endpoint, self.extra.get(method)),
            rate_key="clips_per_s",
            server_pid=self.server.pid,
        )
        after = self.proxy.stats()
        result["bytes"] = after.bytes_down - before.bytes_down
        result["requests"] = after.requests - before.requests
        launched = result["launched_at"]
        result["start_s"] = result.pop("started_at") - launched
        result["import_s"] = result.pop("imported_at") - launched - result["start_s"]
        result["open_s"] = result.pop("opened_at") - launched
        return result

    def stoker(self) -> dict[str, Any]:
        return self._run("stoker", self.data.packed_url)

    def pyav(self) -> dict[str, Any]:
        return self._run("pyav", self.data.url)

    def torchcodec(self) -> dict[str, Any]:
        return self._run("torchcodec", self.data.url)


def _clip_key(key: str) -> str:
    """A clip's video as every method names it: its path in the set, no extension."""
    for extension in (".mp4", ".mkv", ".webm", ".mov"):
        key = key.removesuffix(extension)
    return key


def agreement(rows: dict[str, dict[str, Any]], expected: int) -> dict[str, Any]:
    """Whether every method delivered the same clips as the first in ``rows``: missing and
    extra clips, and the largest difference of a frame's mean (8-bit levels) between
    them. Each row's digest is taken out of it."""
    digests = {
        method: {(_clip_key(k), first): means for k, first, means in row.pop("digest", [])}
        for method, row in rows.items()
    }
    found: dict[str, Any] = {"expected": expected}
    if not digests:
        return found
    reference_method = next(iter(digests))
    reference = digests[reference_method]
    for method, clips in digests.items():
        common = reference.keys() & clips.keys()
        worst = max(
            (
                abs(a - b)
                for clip in common
                for a, b in zip(reference[clip], clips[clip], strict=True)
            ),
            default=0.0,
        )
        found[method] = {
            "clips": len(clips),
            "missing": len(reference.keys() - clips.keys()),
            "extra": len(clips.keys() - reference.keys()),
            "max_frame_mean_diff": worst,
            "against": reference_method,
        }
    return found


def _mb(value: float | None) -> str:
    return "" if value is None else f"{value / 1e6:,.1f}"


def report(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The Markdown table, the clips' agreement, the goals and their figures."""
    rows = results["methods"]
    data = results["data"]
    unavailable = results.get("unavailable", {})
    best = strongest(rows, BASELINES, "clips_per_s")
    span = (args.frames - 1) * args.stride + 1
    lines = [
        f"# video.py: clips of {data['videos']} videos of {args.seconds} s in a bucket "
        f"({date.today().isoformat()})",
        "",
        f"{data['videos']} videos ({data['seconds'] / 60:,.1f} min, {data['frames']:,} frames) "
        f"of {data['width']}x{data['height']} at {args.fps} frames/s, {data['codec']}, a "
        f"keyframe every {args.keyframe_s:g} s at most, MP4; {data['file_bytes'] / 1e6:,.1f} "
        f"MB ({8 * data['file_bytes'] / data['seconds'] / 1e6:.2f} Mbit/s), packed "
        f"{data['packed_bytes'] / 1e6:,.1f} MB. {args.clips} clips of {args.frames} frames "
        f"(stride {args.stride}) per video, each frame resized to 224x224, batches of "
        f"{args.clips} clips, uint8. SeaweedFS behind the {args.rtt_ms:g} ms / {args.gbit:g} "
        f"Gbit/s proxy, cold. Machine: {results['machine']['cpus']} CPUs, Python "
        f"{results['machine']['python']}, load {results['machine']['load_before'][0]:.2f} "
        "before the run.",
        "",
        "| method | clips/s | vs the better baseline | first batch s | MB fetched | "
        "x the videos' size | requests | peak RSS MB | CPU ms per clip |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method in METHODS:
        if method in unavailable:
            lines.append(f"| {NAMES[method]} | unavailable: {unavailable[method]} | | | | | | | |")
        if method not in rows:
            continue
        row = rows[method]
        rate = row["clips_per_s"]
        ratio = f"{rate / best[1]:.2f}x" if best else ""
        x_data = row["bytes"] / data["file_bytes"]
        cpu = 1000 * (row["cpu_s"] + row["workers_cpu_s"]) / max(1, row["clips"])
        rss = row.get("peak_rss_mb", 0) + row.get("workers_peak_rss_mb", 0)
        lines.append(
            f"| {NAMES[method]} | {rate:,.1f} | {ratio} | {row['first_batch_s']:.2f} | "
            f"{_mb(row['bytes'])} | {x_data:.3f}x | {row['requests']:,.0f} | {rss:,.0f} | "
            f"{cpu:.0f} |"
        )
    clip_bytes = data["file_bytes"] / max(1, results["agreement"]["expected"])
    ceiling = args.gbit * 125e6 / clip_bytes
    if any(word in " ".join(unavailable.values()) for word in ("nvrtc", "cuda")):
        lines += [
            "",
            "torchcodec: PyPI's Linux wheel is built against CUDA torch (it needs "
            "libtorch_cuda.so and CUDA's libnvrtc), which a CPU-only torch cannot load; "
            "PyTorch's own index has the CPU build (`--torchcodec-index`).",
        ]
    lines += [
        "",
        "MB fetched and requests: the proxy's counts for the method's whole run (index and "
        "listing included); x the videos' size: those bytes over the video files'. Peak RSS: "
        "the method's process plus the largest of its DataLoader workers. CPU ms per clip: "
        "the method's process and its worker processes over its loop. Each round's clips/s: "
        + "; ".join(
            f"{m} " + ", ".join(f"{r:,.1f}" for r in rows[m]["each_round"])
            for m in METHODS
            if m in rows
        )
        + ".",
        f"The link's ceiling for whole videos: {args.gbit:g} Gbit/s carries {ceiling:,.0f} "
        f"clips/s of them ({clip_bytes / 1e6:.2f} MB of video a clip); the server and the "
        "proxy share this machine's cores with the method.",
        "",
    ]
    lines += _agreement_lines(results["agreement"], span)
    lines += [
        "",
        *method_lines(
            args.repeats,
            "every method from its process's start (imports, listing or index, workers counted)",
            "the baselines' DataLoaders: "
            + str(rows.get("pyav", {}).get("start_method", "not run"))
            + "; stoker: none (threads)",
        ),
        f"Settling before each run: {settled_text(list(rows.values()))}.",
        "",
    ]
    checks: dict[str, Any] = {}
    ours = rows.get("stoker")
    if ours:
        lines.append("Goals (the issue's), stoker:")
        if best:
            ratio = ours["clips_per_s"] / best[1]
            checks["vs_baseline"] = {"value": ratio, "pass": ratio >= GOAL_VS_BASELINE}
            lines.append(
                f"- clips/s >= {GOAL_VS_BASELINE:g}x the better baseline ({NAMES[best[0]]}): "
                f"{ratio:.2f}x ({'PASS' if ratio >= GOAL_VS_BASELINE else 'FAIL'})"
            )
        first = ours["first_batch_s"]
        checks["first_batch"] = {"value": first, "pass": first <= GOAL_FIRST_BATCH_S}
        lines.append(
            f"- first batch <= {GOAL_FIRST_BATCH_S:g} s after process start: {first:.2f} s "
            f"({'PASS' if first <= GOAL_FIRST_BATCH_S else 'FAIL'}; interpreter "
            f"{ours['start_s']:.2f} s, imports {ours['import_s']:.2f} s, Loader open at "
            f"{ours['open_s']:.2f} s)"
        )
        x_data = ours["bytes"] / data["file_bytes"]
        checks["bytes"] = {"value": x_data, "pass": x_data <= GOAL_BYTES}
        lines.append(
            f"- bytes <= {GOAL_BYTES:g}x the videos' size: {x_data:.3f}x "
            f"({'PASS' if x_data <= GOAL_BYTES else 'FAIL'})"
        )
    if results.get("licences"):
        lines += ["", "Libraries (version: licence, as their wheels ship it):"]
        lines += [f"- {name} {text}" for name, text in results["licences"].items()]
    return "\n".join(lines), checks


def _agreement_lines(found: dict[str, Any], span: int) -> list[str]:
    """The report's lines on whether the methods delivered the same clips."""
    methods = [m for m in METHODS if m in found]
    if not methods:
        return []
    parts = []
    for method in methods:
        row = found[method]
        parts.append(
            f"{method} {row['clips']:,} clips"
            + (
                ""
                if method == row["against"]
                else f" ({row['missing']} missing, {row['extra']} extra, frame means at most "
                f"{row['max_frame_mean_diff']:.2f} levels apart)"
            )
        )
    same = all(
        found[m]["missing"] == 0
        and found[m]["extra"] == 0
        and found[m]["clips"] == found["expected"]
        for m in methods
    )
    return [
        f"Same clips ({found['expected']:,} expected: every video's, each spanning {span} "
        f"frames), first round, against {found[methods[0]]['against']}: "
        + "; ".join(parts)
        + (". They agree." if same else ". **They differ: the rates are not comparable.**")
    ]


def _seconds(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    pair = (float(low), float(high or low))
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"seconds {text!r}: want S or MIN-MAX, 0 < MIN <= MAX")
    return pair


def _probe_torchcodec(index_url: str | None) -> tuple[dict[str, str], str | None, Path | None]:
    """The torchcodec child's extra environment, or why it cannot run."""
    path, failed = torchcodec_path(index_url)
    if failed:
        return {}, failed, None
    extra = {"PYTHONPATH": str(path)} if path else {}
    done = subprocess.run(
        [sys.executable, str(CHILD), "--probe", "torchcodec"],
        capture_output=True,
        text=True,
        env={**os.environ, **extra},
    )
    if done.returncode:
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        return {}, lines[-1] if lines else f"exit {done.returncode}", path
    return extra, None, path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--videos", type=int, default=200)
    parser.add_argument(
        "--seconds", default="30-60", help="each video's length: S, or MIN-MAX (drawn)"
    )
    parser.add_argument("--height", type=int, default=720, help="frame height (16:9)")
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--keyframe-s", type=float, default=2.0, help="keyframe interval, most")
    parser.add_argument("--codec", default="", help="PyAV encoder (default: libx264 if there)")
    parser.add_argument("--frames", type=int, default=16, help="frames per clip")
    parser.add_argument("--stride", type=int, default=1, help="frames between a clip's frames")
    parser.add_argument("--clips", type=int, default=8, help="clips per video (and per batch)")
    parser.add_argument("--methods", default="", help="only these methods (comma-separated)")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--gbit", type=float, default=1.0, help="the proxy's link, Gbit/s")
    parser.add_argument(
        "--settle-s", type=float, default=20.0, help="most seconds to wait for a quiet machine"
    )
    parser.add_argument(
        "--torchcodec-index", default=None, help="pip index to install torchcodec from"
    )
    add_round_args(parser)  # --quick: 6 videos of 8-12 s at 360p, one round
    args = parser.parse_args()
    args.repeats = rounds(args)
    if args.quick:
        args.videos, args.seconds, args.height = 6, "8-12", 360
    spec = VideoSpec(
        seconds=_seconds(args.seconds),
        height=args.height,
        fps=args.fps,
        keyframe_s=args.keyframe_s,
        codec=args.codec or encoder(),
    )
    chosen = args.methods.split(",") if args.methods else METHODS
    methods = [m for m in METHODS if m in chosen]
    started = time.perf_counter()
    results: dict[str, Any] = {"machine": machine(), "args": vars(args), "unavailable": {}}
    extra: dict[str, dict[str, str]] = {}
    torchcodec_libs = None
    if "torchcodec" in methods:
        extra["torchcodec"], failed, torchcodec_libs = _probe_torchcodec(args.torchcodec_index)
        if failed:
            print(f"[video] torchcodec unavailable: {failed}", flush=True)
            results["unavailable"]["torchcodec"] = failed
            methods.remove("torchcodec")
    results["licences"] = licences(torchcodec_libs)
    with SeaweedServer() as server:
        server.create_bucket(BUCKET)
        data = prepare(spec, args.videos, server)
        span = (args.frames - 1) * args.stride + 1
        expected = sum(
            args.clips
            for i in range(data.videos)
            if spec.frames_of(i) >= span  # shorter ones give no clip (stoker's "drop")
        )
        results["data"] = {
            "videos": data.videos,
            "frames": data.frames,
            "seconds": data.seconds,
            "width": spec.width,
            "height": spec.height,
            "codec": spec.codec,
            "file_bytes": data.file_bytes,
            "packed_bytes": data.packed_bytes,
            "index_bytes": data.index_bytes,
        }
        os.sync()  # what prepare wrote goes to disk now, not during a timed run
        warm: list[Any] = [[str(CHILD), "--warm", "stoker"], [str(CHILD), "--warm", "pyav"]]
        if "torchcodec" in methods:
            warm.append(([str(CHILD), "--warm", "torchcodec"], extra["torchcodec"]))
        compiled_interpreters(PYCACHE, warm)
        link = LinkConfig(rtt_s=args.rtt_ms / 1000, bandwidth_bytes_s=args.gbit * 125e6)
        clip_args = [str(args.frames), str(args.stride), str(args.clips)]
        with NetProxy("127.0.0.1", server.port, link=link) as proxy:
            bench = Bench(data, server, proxy, clip_args, extra)
            rows = {method: getattr(bench, method) for method in methods}
            results["methods"] = run_rounds(
                rows,
                args.repeats,
                rate_key="clips_per_s",
                before_each=lambda: settle(server.pid, args.settle_s),
                show=lambda rate: f"{rate:,.1f}",
            )
    results["agreement"] = agreement(results["methods"], expected)
    results["machine"]["load_after"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - started
    text, checks = report(results, args)
    results["goals"] = checks
    write_report("video", results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
