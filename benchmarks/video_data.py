"""The videos of ``video.py``: generated once with PyAV (kept in benchmarks/out/data),
uploaded as they are into the bucket of this run's server for the baselines and packed by
stoker.

Each video is a camera moving over the photographs :mod:`stoker.testing.photos` provides:
a window panning and zooming across one photograph, cutting to another every 3-8 s, with
sensor noise (``GRAIN``), so that consecutive frames differ as in real footage (720p comes
out at about 1.4 Mbit/s) and the encoder meets scene cuts. The encoder is libx264 where
PyAV's wheel has it (its wheels do), else the first of ``ENCODERS`` it has, on its
defaults (CRF 23, CABAC, 3 B-frames) but for the ``veryfast`` preset (``PRESET``:
making the videos is the slow part of a first run on 2 cores) and the keyframe interval
(``--keyframe-s``, 2 s by default: what phone cameras (1 s) and streaming services (2 s)
write, where the encoder's own default, 250 frames, is 8 s at 30 frames/s). The
container is MP4 (``moov`` at the end, as FFmpeg writes it by default). Video ``i``'s
length is drawn from ``--seconds`` with seed ``i``, so a set of 50 videos is the first 50
of a set of 200 and the videos already made are reused (kept in ``all/``; each set is a
folder of hard links to them, ``class_NN/video_NNNNN.mp4``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from stoker.pack.packer import pack
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, upload
from stoker.testing.seaweed import SeaweedServer

OUT = Path(__file__).resolve().parent / "out"
BUCKET = "bench-video"
#: Encoders in the order of preference (the first PyAV's FFmpeg has is used).
ENCODERS = ("libx264", "libopenh264", "libx265", "libsvtav1", "libvpx-vp9", "mpeg4")
#: x264's preset for the generated videos (see the module docstring).
PRESET = "veryfast"
#: Class folders the videos are spread over (video ``i`` in ``i % CLASSES``).
CLASSES = 10
#: Seconds a shot lasts before the camera cuts to another photograph.
SHOT_S = (3.0, 8.0)
#: Sensor noise on every frame (standard deviation, 8-bit levels), drawn from a bank of
#: ``GRAIN_FRAMES`` noise frames: without it the smooth, upscaled photographs compress to
#: a fraction of the bit rate of camera footage.
GRAIN = 6.0
GRAIN_FRAMES = 8
LIBS = OUT / "libs"
#: What the torchcodec baseline installs into benchmarks/out/libs (``--no-deps``: it
#: takes the torch of this environment).
TORCHCODEC = "torchcodec==0.17.0"


@dataclass(frozen=True)
class VideoSpec:
    """What each video of a set is.

    Attributes:
        seconds: Shortest and longest length; each video's is drawn between them.
        height: Frame height (the width is 16/9 of it, even).
        fps: Frames per second.
        keyframe_s: Seconds between keyframes at most.
        codec: PyAV encoder.
    """

    seconds: tuple[float, float]
    height: int
    fps: int
    keyframe_s: float
    codec: str

    @property
    def width(self) -> int:
        return 2 * round(self.height * 16 / 9 / 2)

    @property
    def key(self) -> str:
        low, high = self.seconds
        span = f"{low:g}" if low == high else f"{low:g}-{high:g}"
        return f"video-{span}s-{self.height}p-{self.fps}fps-{self.codec}-k{self.keyframe_s:g}s"

    def frames_of(self, index: int) -> int:
        """Frames of video ``index``."""
        low, high = self.seconds
        return max(1, round(random.Random(index).uniform(low, high) * self.fps))


@dataclass(frozen=True)
class VideoSet:
    """The videos, local, in the bucket and packed by stoker.

    Attributes:
        spec: What each video is.
        local: The set's folder (class folders of hard links into ``all/``).
        videos: Videos.
        frames: Frames of all videos.
        file_bytes: Bytes of the video files (what the baselines download).
        seconds: Seconds of all videos.
        packed_bytes: Bytes of the packed shards.
        index_bytes: Bytes of the packed dataset's other objects (index, seek indexes).
    """

    spec: VideoSpec
    local: Path
    videos: int
    frames: int
    file_bytes: int
    seconds: float
    packed_bytes: int
    index_bytes: int

    @property
    def key(self) -> str:
        return f"{self.spec.key}-n{self.videos}"

    @property
    def url(self) -> str:
        """The video files' folder in the bucket (class folders)."""
        return f"s3://{BUCKET}/{self.key}/raw"

    @property
    def packed_url(self) -> str:
        return f"s3://{BUCKET}/{self.key}/packed"


def encoder() -> str:
    """The first of ``ENCODERS`` that PyAV's FFmpeg has."""
    import av

    available = set(av.codecs_available)
    for name in ENCODERS:
        if name in available:
            return name
    raise RuntimeError(f"PyAV's FFmpeg has none of the encoders {ENCODERS}")


def _cover(photo: np.ndarray, width: int, height: int) -> np.ndarray:
    """``photo`` scaled to cover ``width`` x ``height`` and cut to it (centred)."""
    import cv2

    h, w = photo.shape[:2]
    scale = max(width / w, height / h)
    scaled = cv2.resize(
        photo, (max(width, round(w * scale)), max(height, round(h * scale))), cv2.INTER_CUBIC
    )
    top = (scaled.shape[0] - height) // 2
    left = (scaled.shape[1] - width) // 2
    return np.ascontiguousarray(scaled[top : top + height, left : left + width])


def _shots(frames: int, fps: int, photos: int, rng: random.Random) -> list[tuple[int, int]]:
    """``(frames, photograph)`` of each shot, together ``frames`` long."""
    shots, left, last = [], frames, -1
    while left > 0:
        length = min(left, max(1, round(rng.uniform(*SHOT_S) * fps)))
        photo = rng.choice([p for p in range(photos) if p != last] or [0])
        shots.append((length, photo))
        left, last = left - length, photo
    return shots


def make_video(path: Path, spec: VideoSpec, index: int) -> None:
    """Write video ``index`` of ``spec`` to ``path`` (see the module docstring)."""
    import av
    import cv2

    from stoker.testing.photos import source_photos

    width, height, fps = spec.width, spec.height, spec.fps
    # The canvas a shot moves over: 1.5x the frame, so the window can pan and zoom.
    canvas_w, canvas_h = 3 * width // 2, 3 * height // 2
    photos = [np.asarray(p) for p in source_photos(max_side=2048)]
    rng = random.Random(index)
    noise = np.random.default_rng(index)
    grain = [
        noise.normal(0, GRAIN, (height, width, 3)).astype(np.int16) for _ in range(GRAIN_FRAMES)
    ]
    frames = spec.frames_of(index)
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as muxer:
        stream = muxer.add_stream(spec.codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = max(1, round(spec.keyframe_s * fps))
        stream.codec_context.time_base = Fraction(1, fps)
        stream.codec_context.thread_count = 1  # one process per core makes the videos
        if spec.codec == "libx264":
            stream.codec_context.options = {"preset": PRESET}
        elif spec.codec == "libx265":
            stream.codec_context.options = {"preset": PRESET, "x265-params": "log-level=error"}
        elif spec.codec == "libsvtav1":
            stream.codec_context.options = {"svtav1-params": "log-level=0"}
        n = 0
        for length, photo in _shots(frames, fps, len(photos), rng):
            canvas = _cover(photos[photo], canvas_w, canvas_h)
            # The window's size (1.0-1.5x the frame) and centre, at the shot's start and end.
            zoom = (rng.uniform(1.0, 1.5), rng.uniform(1.0, 1.5))
            centre = [(rng.uniform(0.35, 0.65), rng.uniform(0.35, 0.65)) for _ in range(2)]
            for t in range(length):
                f = t / max(1, length - 1)
                z = zoom[0] + (zoom[1] - zoom[0]) * f
                w, h = min(canvas_w, round(width * z)), min(canvas_h, round(height * z))
                cx = (centre[0][0] + (centre[1][0] - centre[0][0]) * f) * canvas_w
                cy = (centre[0][1] + (centre[1][1] - centre[0][1]) * f) * canvas_h
                left = int(min(max(0, cx - w / 2), canvas_w - w))
                top = int(min(max(0, cy - h / 2), canvas_h - h))
                pixels = cv2.resize(
                    canvas[top : top + h, left : left + w], (width, height), cv2.INTER_LINEAR
                )
                pixels = cv2.add(pixels, grain[rng.randrange(GRAIN_FRAMES)], dtype=cv2.CV_8U)
                frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
                frame.pts, frame.time_base = n, Fraction(1, fps)
                n += 1
                for packet in stream.encode(frame):
                    muxer.mux(packet)
        for packet in stream.encode(None):
            muxer.mux(packet)
    part = path.with_suffix(".part")
    part.write_bytes(out.getvalue())
    part.rename(path)


def _made(spec: VideoSpec, count: int) -> Path:
    """The first ``count`` videos of ``spec`` in ``all/`` (those missing made, one process
    per core)."""
    folder = OUT / "data" / spec.key / "all"
    folder.mkdir(parents=True, exist_ok=True)
    missing = [i for i in range(count) if not (folder / f"video_{i:05d}.mp4").exists()]
    if missing:
        seconds = sum(spec.frames_of(i) for i in missing) / spec.fps
        print(
            f"[video] making {len(missing)} videos ({seconds / 60:,.0f} min of "
            f"{spec.width}x{spec.height} {spec.codec})",
            flush=True,
        )
        started = time.perf_counter()
        with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
            jobs = [
                pool.submit(make_video, folder / f"video_{i:05d}.mp4", spec, i) for i in missing
            ]
            for done, job in enumerate(jobs, 1):
                job.result()
                if done % 10 == 0 or done == len(jobs):
                    print(
                        f"[video] {done}/{len(jobs)} made, {time.perf_counter() - started:.0f} s",
                        flush=True,
                    )
    return folder


def _linked(spec: VideoSpec, count: int) -> Path:
    """The set's folder: class folders of hard links to the first ``count`` videos."""
    source = _made(spec, count)
    dest = OUT / "data" / spec.key / f"n{count}"
    for i in range(count):
        link = dest / f"class_{i % CLASSES:02d}" / f"video_{i:05d}.mp4"
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(source / link.name, link)
    return dest


def prepare(spec: VideoSpec, count: int, server: SeaweedServer) -> VideoSet:
    """Make the videos (once, kept), upload them and pack them into the bucket."""
    local = _linked(spec, count)
    paths = sorted(local.rglob("*.mp4"))
    direct = server.storage_options()
    key = f"{spec.key}-n{count}"
    started = time.perf_counter()
    upload(
        local,
        open_store(f"s3://{BUCKET}/{key}/raw", storage_options=direct),
        config=TransferConfig(workers=16, include=("*.mp4",)),
    )
    uploaded_s = time.perf_counter() - started
    started = time.perf_counter()
    packed = f"s3://{BUCKET}/{key}/packed"
    report = pack(local, packed, storage_options=direct)
    store = open_store(packed, storage_options=direct)
    sizes = {info.key: info.size for info in store.list("")}
    shards = {k: v for k, v in sizes.items() if k.rpartition("/")[2].startswith("shard-")}
    frames = sum(spec.frames_of(int(p.stem.rpartition("_")[2])) for p in paths)
    result = VideoSet(
        spec=spec,
        local=local,
        videos=len(paths),
        frames=frames,
        file_bytes=sum(p.stat().st_size for p in paths),
        seconds=frames / spec.fps,
        packed_bytes=sum(shards.values()),
        index_bytes=sum(sizes.values()) - sum(shards.values()),
    )
    print(
        f"[video] {result.videos} videos, {result.seconds / 60:,.1f} min, "
        f"{result.file_bytes / 1e6:,.0f} MB ({8 * result.file_bytes / result.seconds / 1e6:.2f} "
        f"Mbit/s), uploaded in {uploaded_s:.1f} s, packed in {time.perf_counter() - started:.1f} "
        f"s into {report.shards} shards ({result.packed_bytes / 1e6:,.0f} MB)",
        flush=True,
    )
    return result


def torchcodec_path(index_url: str | None) -> tuple[Path | None, str | None]:
    """A folder holding torchcodec for the torchcodec child's ``PYTHONPATH`` (None where
    this environment imports it already), installed once with ``pip install --no-deps
    --target`` from PyPI or ``index_url``; or why it could not be installed."""
    probe = [sys.executable, "-c", "import torchcodec"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return None, None
    where = "pypi" if index_url is None else hashlib.sha256(index_url.encode()).hexdigest()[:8]
    target = LIBS / f"torchcodec-{where}"
    if not (target / ".complete").exists():
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target"]
        command += [str(target), TORCHCODEC]
        if index_url is not None:
            command += ["--index-url", index_url]
        print(f"[video] installing {TORCHCODEC} into {target}", flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            return None, f"pip install {TORCHCODEC} failed: {lines[-1] if lines else '?'}"
        (target / ".complete").touch()
    return target, None


def licences(path: Path | None) -> dict[str, str]:
    """The licence each library of the baselines ships in its wheel (its dist-info's
    licence file's first words), read with ``path`` (torchcodec's folder) on the import
    path."""
    probe = (
        "import importlib.metadata as md, json\n"
        "out = {}\n"
        "for name in ('av', 'torch', 'boto3', 'opencv-python-headless', 'opencv-python',\n"
        "             'torchcodec'):\n"
        "    try:\n"
        "        dist = md.distribution(name)\n"
        "    except md.PackageNotFoundError:\n"
        "        continue\n"
        "    text = ''\n"
        "    for f in dist.files or []:\n"
        "        if 'licen' in f.name.lower() and 'third_party' not in str(f):\n"
        "            text = f.read_text() or ''\n"
        "            break\n"
        "    words = ' '.join(text.replace('\\ufeff', '').split())[:60]\n"
        "    meta = dist.metadata\n"
        "    field = meta.get('License-Expression') or meta.get('License') or ''\n"
        "    out[name] = f'{dist.version}: {field[:80]} ({words})'\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(path) if path else ""}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    if done.returncode:
        return {"error": done.stderr[-500:]}
    found: dict[str, str] = json.loads(done.stdout)
    return found
