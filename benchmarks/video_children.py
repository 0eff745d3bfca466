"""The methods of ``video.py``, each in a process of its own, timed from its start
(``harness.py``).

    python benchmarks/video_children.py stoker PACKED_URL FRAMES STRIDE CLIPS
    python benchmarks/video_children.py pyav RAW_URL FRAMES STRIDE CLIPS
    python benchmarks/video_children.py torchcodec RAW_URL FRAMES STRIDE CLIPS
    python benchmarks/video_children.py --warm stoker|pyav|torchcodec
    python benchmarks/video_children.py --probe torchcodec

Every method reads one cold epoch: ``CLIPS`` clips of ``FRAMES`` frames, ``STRIDE``
apart, from every video, the clips' first frames ``round(linspace(0, frames - span,
CLIPS))`` (span = (FRAMES - 1) * STRIDE + 1; frames counted in presentation order, as
``av.open(f).decode(video=0)`` yields them), every frame resized to 224x224 (OpenCV's area
resize for a shrink of 2x or more on both sides, else its bilinear one: what stoker's
``Resize((224, 224))`` does), and delivers batches of ``CLIPS`` clips: uint8 ``(CLIPS,
FRAMES, 224, 224, 3)``.

- stoker: ``Loader(SourceConfig(URL, video=VideoConfig(frames=FRAMES, stride=STRIDE,
  clips_per_video=CLIPS)), batch_size=CLIPS, transform=Resize((224, 224)))`` on its
  defaults (autotune on) over the packed videos; ``read_ahead`` off, so that the bytes
  counted are one epoch's.
- pyav: what a competent user writes with PyAV in a torch ``DataLoader(num_workers=2)``
  (the platform's default start method), shuffled over the videos: the bucket listed once
  with boto3, then in each item one video downloaded whole (boto3 ``get_object``, into
  memory) and opened with ``av.open``, ``thread_type = "AUTO"`` on its stream (PyAV's
  docs' advice for speed), and for each clip ``container.seek`` to its first frame's
  timestamp (``backward=True``: the keyframe at or before it) and a decode forward to its
  last frame, converting only its frames; frame ``n``'s timestamp is ``start_time + n *
  (1 / average_rate)`` in the stream's time base and the frame count the container's
  (``stream.frames``). An item is one video's clips: a batch of ``CLIPS``.
- torchcodec: the same DataLoader and listing, each video downloaded to a local file
  (boto3 ``download_file``) and read with ``torchcodec.decoders.VideoDecoder(path,
  dimension_order="NHWC", num_ffmpeg_threads=1)`` (exact seek mode, the default; one
  FFmpeg thread as its docs advise for several decoders in parallel), all the video's
  clips' frames asked for in one ``get_frames_at(indices)``, the frame count from its
  ``metadata.num_frames``; the file deleted after.

The baselines import neither stoker nor torchvision. A run prints one JSON line: clips
(``units``), ``first_batch_at`` and ``ended_at`` (``time.time()``: the harness counts both
from the moment it started the process), the loop's seconds and rate, CPU seconds of this
process and of its reaped worker processes, peak RSS, the bytes it downloaded by its own
count, and a digest of every clip (its video, first frame and the mean of each frame) that
``video.py`` compares across the methods. The store's credentials and endpoint come from
the ``AWS_*`` variables.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # before any other import: the interpreter's start ends here

import io  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import default_start_method, emit, peak_rss_mb  # noqa: E402

SIZE = 224
WORKERS = 2


def clip_firsts(frame_count: int, frames: int, stride: int, clips: int) -> list[int]:
    """First frames of a video's clips (the issue's rule; none where a clip does not fit)."""
    import numpy as np

    span = (frames - 1) * stride + 1
    if frame_count < span:
        return []
    if clips == 1:
        return [0]
    return [int(x) for x in np.round(np.linspace(0, frame_count - span, clips))]


def resized(frame: Any) -> Any:
    """One RGB frame at 224x224: OpenCV's area resize where it shrinks the frame 2x or
    more on both sides, else its bilinear one (what stoker's ``Resize`` does)."""
    import cv2

    shrink = min(frame.shape[0], frame.shape[1]) / SIZE
    interpolation = cv2.INTER_AREA if shrink >= 2 else cv2.INTER_LINEAR
    return cv2.resize(frame, (SIZE, SIZE), interpolation=interpolation)


def _timed(batches: Any) -> dict[str, Any]:
    """Iterate ``batches`` to their end: clips, the loop's seconds and rate (from its first
    ``next()``), the first and last batch's ``time.time()``, CPU of this process and its
    reaped children, bytes by the method's own count, and every clip's digest."""
    started, cpu_started = time.perf_counter(), time.process_time()
    first_at, seen, own_bytes, fields = 0.0, 0, 0, {}
    digest: list[list[Any]] = []
    for batch in batches:
        images = batch["image"]
        if not seen:
            first_at = time.time()
            fields = {"image": f"{images.dtype}{list(images.shape)}"}
            if tuple(images.shape[2:]) != (SIZE, SIZE, 3) or str(images.dtype) not in (
                "uint8",
                "torch.uint8",
            ):
                raise RuntimeError(f"clips of {images.dtype}{tuple(images.shape)}")
        # Each frame's mean over every 8th row and column: cheap, and a frame apart shows.
        sampled = images[:, :, ::8, ::8]
        if hasattr(sampled, "float"):  # a torch tensor (the DataLoader's)
            means = sampled.float().mean(dim=(2, 3, 4))
        else:
            means = sampled.mean(axis=(2, 3, 4))
        for key, first, row in zip(batch["key"], batch["first_frame"], means.tolist(), strict=True):
            digest.append([str(key), int(first), [round(x, 2) for x in row]])
        seen += len(batch["key"])
        own_bytes += int(batch.get("bytes", 0))
    ended_at = time.time()
    seconds = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "clips": seen,
        "units": seen,
        "seconds": seconds,
        "cpu_s": time.process_time() - cpu_started,
        "workers_cpu_s": children.ru_utime + children.ru_stime,
        "workers_peak_rss_mb": children.ru_maxrss / 1024,
        "clips_per_s": seen / seconds,
        "first_batch_at": first_at,
        "ended_at": ended_at,
        "fields": fields,
        "own_bytes": own_bytes,
        "digest": digest,
    }


# --- stoker ------------------------------------------------------------------------------


def run_stoker(url: str, frames: int, stride: int, clips: int) -> dict[str, Any]:
    """One cold epoch of the Loader on its defaults over the packed videos."""
    from stoker.pipeline.clips import VideoConfig
    from stoker.pipeline.config import SourceConfig
    from stoker.pipeline.loader import Loader
    from stoker.pipeline.transforms import Resize

    imported_at = time.time()
    video = VideoConfig(frames=frames, stride=stride, clips_per_video=clips)
    source = SourceConfig(url, video=video)
    with Loader(source, batch_size=clips, transform=Resize((SIZE, SIZE))) as loader:
        loader.read_ahead = False  # one epoch is measured: its bytes, not the next one's
        opened_at = time.time()
        result = _timed(loader)
        stats = loader.stats()
        result.update(
            window=loader.order_config.windows,
            block_size=loader.order_config.blocks,
            group_blocks=loader.order_config.groups,
            own_bytes=stats.requests.get("bytes.read", 0),
            own_gets=stats.requests.get("requests.get", 0),
            threads=stats.threads,
            prefetch=stats.prefetch,
            autotune=stats.autotune,
            stages={name: [t.seconds, t.calls] for name, t in stats.stages.items()},
        )
    result.update(
        imported_at=imported_at,
        opened_at=opened_at,
        started_at=STARTED_AT,
        peak_rss_mb=peak_rss_mb(),
    )
    return result


# --- the baselines: a bucket of video files, a DataLoader over them -----------------------


def _bucket_and_prefix(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix.rstrip("/") + "/"


def list_videos(url: str) -> list[tuple[str, int]]:
    """The videos under ``url`` (one boto3 listing) with their labels: the class folders'
    names sorted, numbered from 0."""
    import boto3

    bucket, prefix = _bucket_and_prefix(url)
    pages = (
        boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    )
    keys = sorted(
        item["Key"]
        for page in pages
        for item in page.get("Contents", [])
        if item["Key"].endswith((".mp4", ".mkv", ".webm", ".mov"))
    )
    classes = sorted({key[len(prefix) :].rpartition("/")[0] for key in keys})
    label = {name: n for n, name in enumerate(classes)}
    return [(key, label[key[len(prefix) :].rpartition("/")[0]]) for key in keys]


class VideoClips:
    """A map-style dataset of a bucket's videos: item ``i`` is every clip of video ``i``
    (its ``decode`` cuts them from the downloaded video), with a boto3 client of its
    own in each process."""

    def __init__(
        self, url: str, videos: list[tuple[str, int]], frames: int, stride: int, clips: int
    ) -> None:
        self.bucket, self.prefix = _bucket_and_prefix(url)
        self.videos, self.frames, self.stride, self.clips = videos, frames, stride, clips
        self.client: Any = None  # made in each worker, after the fork

    def __len__(self) -> int:
        return len(self.videos)

    def _client(self) -> Any:
        if self.client is None:
            import boto3

            self.client = boto3.client("s3")
        return self.client

    def __getitem__(self, i: int) -> dict[str, Any]:
        import numpy as np

        key, label = self.videos[i]
        image, firsts, nbytes = self.decode(key)
        name = key[len(self.prefix) :]
        return {
            "image": image,
            "key": [name] * len(firsts),
            "label": np.full(len(firsts), label),
            "first_frame": np.asarray(firsts, dtype=np.int64),
            "bytes": nbytes,
        }

    def decode(self, key: str) -> tuple[Any, list[int], int]:
        raise NotImplementedError


class PyAVClips(VideoClips):
    """Each video downloaded into memory and its clips cut with PyAV's seek and decode."""

    def decode(self, key: str) -> tuple[Any, list[int], int]:
        import av
        import numpy as np

        body = self._client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        with av.open(io.BytesIO(body)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            tick = round(1 / (stream.average_rate * stream.time_base))  # a frame's duration
            origin = stream.start_time or 0
            firsts = clip_firsts(stream.frames, self.frames, self.stride, self.clips)
            out = np.empty((len(firsts), self.frames, SIZE, SIZE, 3), dtype=np.uint8)
            for c, first in enumerate(firsts):
                wanted = {origin + (first + t * self.stride) * tick: t for t in range(self.frames)}
                last = max(wanted)
                container.seek(min(wanted), stream=stream, backward=True, any_frame=False)
                got = 0
                for frame in container.decode(stream):
                    t = wanted.get(frame.pts) if frame.pts is not None else None
                    if t is not None:
                        out[c, t] = resized(frame.to_ndarray(format="rgb24"))
                        got += 1
                    if frame.pts is not None and frame.pts >= last:
                        break
                if got != self.frames:
                    raise RuntimeError(f"{key}: clip at frame {first} gave {got} frames")
        return out, firsts, len(body)


class TorchCodecClips(VideoClips):
    """Each video downloaded to a local file and its clips read with torchcodec's
    ``VideoDecoder.get_frames_at``."""

    def decode(self, key: str) -> tuple[Any, list[int], int]:
        import numpy as np
        from torchcodec.decoders import VideoDecoder

        with tempfile.TemporaryDirectory(prefix="video-bench-") as folder:
            path = Path(folder) / key.rpartition("/")[2]
            self._client().download_file(self.bucket, key, str(path))
            nbytes = path.stat().st_size
            decoder = VideoDecoder(str(path), dimension_order="NHWC", num_ffmpeg_threads=1)
            frame_count = decoder.metadata.num_frames
            firsts = clip_firsts(frame_count, self.frames, self.stride, self.clips)
            indices = [first + t * self.stride for first in firsts for t in range(self.frames)]
            out = np.empty((len(firsts), self.frames, SIZE, SIZE, 3), dtype=np.uint8)
            if indices:
                data = decoder.get_frames_at(indices=indices).data.numpy()
                for n, frame in enumerate(data):
                    out[n // self.frames, n % self.frames] = resized(frame)
            del decoder
        return out, firsts, nbytes


def run_baseline(kind: str, url: str, frames: int, stride: int, clips: int) -> dict[str, Any]:
    """A DataLoader of two workers over the bucket's videos, one video's clips an item."""
    from torch.utils.data import DataLoader

    if kind == "torchcodec":
        import torchcodec.decoders  # noqa: F401  (fails here, not in a worker)
    imported_at = time.time()
    videos = list_videos(url)
    kinds = {"pyav": PyAVClips, "torchcodec": TorchCodecClips}
    dataset = kinds[kind](url, videos, frames, stride, clips)
    loader = DataLoader(dataset, batch_size=None, shuffle=True, num_workers=WORKERS)
    opened_at = time.time()
    result = _timed(loader)
    result.update(
        imported_at=imported_at,
        opened_at=opened_at,
        started_at=STARTED_AT,
        videos=len(videos),
        start_method=f"{default_start_method()} (the platform's default)",
        peak_rss_mb=peak_rss_mb(),  # the training process's; its workers' apart
    )
    return result


def probe(kind: str) -> None:
    """Import what ``kind`` needs; on failure print why (each error of the chain, innermost
    last, with torch's build) and exit 1."""
    try:
        import torch
        from torchcodec.decoders import VideoDecoder  # noqa: F401
    except Exception as exc:  # what a failed import raises: ImportError, OSError, ...
        chain: list[str] = []
        inner: BaseException | None = exc
        while inner is not None and len(chain) < 4:
            text = str(inner).replace(str(Path(__file__).resolve().parent), "benchmarks")
            if text and text not in chain:
                chain.append(text)
            inner = inner.__cause__ or inner.__context__
        try:
            import torch

            build = f"torch {torch.__version__}"
        except ImportError:
            build = "no torch"
        print(f"{type(exc).__name__}: {' <- '.join(chain)} ({build})", flush=True)
        raise SystemExit(1) from None
    print(f"ok: {kind} with torch {torch.__version__}", flush=True)


def warm(method: str) -> None:
    """Import what ``method`` imports (compiling it), and exit."""
    if method == "stoker":
        from stoker.format import video  # noqa: F401
        from stoker.pipeline.clips import VideoConfig  # noqa: F401
        from stoker.pipeline.config import SourceConfig  # noqa: F401
        from stoker.pipeline.loader import Loader  # noqa: F401
        from stoker.pipeline.transforms import Resize  # noqa: F401
    else:
        import boto3  # noqa: F401
        from torch.utils.data import DataLoader  # noqa: F401

        if method == "torchcodec":
            from torchcodec.decoders import VideoDecoder  # noqa: F401
    import av  # noqa: F401
    import cv2  # noqa: F401
    import numpy  # noqa: F401


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "--warm":
        warm(args[0])
        return 0
    if command == "--probe":
        probe(args[0])
        return 0
    url, frames, stride, clips = args[0], int(args[1]), int(args[2]), int(args[3])
    if command == "stoker":
        result = run_stoker(url, frames, stride, clips)
    elif command in ("pyav", "torchcodec"):
        result = run_baseline(command, url, frames, stride, clips)
    else:
        raise SystemExit(f"unknown command {command!r}")
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
