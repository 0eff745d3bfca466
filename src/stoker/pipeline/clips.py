"""Clips of videos as the unit of an epoch: which frames each clip takes (pure functions).

A clip is ``frames`` frames of one video, ``stride`` apart, counted in presentation order.
Each video gives ``clips_per_video`` clips spread evenly over it (first and last frame
included), or with ``step`` a clip every ``step`` frames (sliding windows), or the clips
a list names (:attr:`VideoConfig.starts`). Clips are numbered video by video in the
dataset's order, so the clips of one shard have consecutive ids and an epoch's order over
them is :func:`~stoker.pipeline.order.epoch_order` of the clips per shard, with the
partition and resume guarantees that gives samples.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class VideoConfig:
    """How a packed dataset's videos become clips.

    Attributes:
        frames: Frames per clip (``T``); a batch's ``image`` is ``(N, T, H, W, 3)``.
        stride: Frames between consecutive frames of a clip (1: adjacent frames).
        clips_per_video: Clips spread evenly over each video, the first at its first frame
            and the last ending at its last (default 1, with neither ``step`` nor
            ``starts``).
        step: A clip every ``step`` frames instead (sliding windows; overlapping where
            ``step`` is under the clip's span).
        starts: The clips a list names instead: video key -> first frames.
        seconds: The clips a list names by time instead: video key -> start times in
            seconds (a clip starts at the first frame shown at or after its time).
        short: A video with fewer frames than one clip spans: ``"drop"`` it (counted and
            logged), ``"pad"`` (one clip from its first frame, its last frame repeated),
            or ``"error"``.
        device: Where clips decode: ``"cpu"`` (the decode threads or processes), or
            ``"cuda"``: the GPU's video decoder (NVDEC, through FFmpeg), frames then
            copied to host memory for the transform; where no CUDA device can decode,
            a warning and the CPU.
    """

    frames: int
    stride: int = 1
    clips_per_video: int | None = None
    step: int | None = None
    starts: Mapping[str, Sequence[int]] | None = None
    seconds: Mapping[str, Sequence[float]] | None = None
    short: Literal["drop", "pad", "error"] = "drop"
    device: Literal["cpu", "cuda"] = "cpu"

    def __post_init__(self) -> None:
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1, got {self.frames}")
        if self.stride < 1:
            raise ValueError(f"stride must be >= 1, got {self.stride}")
        ways = ("clips_per_video", "step", "starts", "seconds")
        given = [n for n in ways if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of {', '.join(ways)}, not {given}")
        if self.clips_per_video is not None and self.clips_per_video < 1:
            raise ValueError(f"clips_per_video must be >= 1, got {self.clips_per_video}")
        if self.step is not None and self.step < 1:
            raise ValueError(f"step must be >= 1, got {self.step}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.short not in ("drop", "pad", "error"):
            raise ValueError(f"short must be 'drop', 'pad' or 'error', got {self.short!r}")

    @property
    def span(self) -> int:
        """Frames from a clip's first to its last, both included."""
        return (self.frames - 1) * self.stride + 1

    def clip_frames(self, first: int, frame_count: int) -> np.ndarray:
        """The frames of the clip starting at ``first`` of a video of ``frame_count``
        frames (a padded clip repeats the last frame)."""
        frames = first + np.arange(self.frames, dtype=np.int64) * self.stride
        return np.minimum(frames, frame_count - 1)


@dataclass(frozen=True, slots=True)
class ClipTable:
    """Every clip of a dataset: the video (its sample) and first frame of each, in order.

    Attributes:
        sample: The sample holding each clip's video (int64).
        first: Each clip's first frame (int64).
        dropped: Keys of the videos too short for a clip (``short="drop"``).
    """

    sample: np.ndarray
    first: np.ndarray
    dropped: list[str]

    def __len__(self) -> int:
        return len(self.sample)

    def per_shard(self, sample_shard: np.ndarray, shards: int) -> list[int]:
        """Clips in each shard (clips are numbered shard by shard)."""
        counts: list[int] = np.bincount(sample_shard[self.sample], minlength=shards).tolist()
        return counts


def clip_starts(config: VideoConfig, frame_count: int, key: str) -> np.ndarray | None:
    """First frames of a video's clips; None for a video too short with ``short="drop"``.

    Raises:
        ValueError: A video too short with ``short="error"``, or a listed start past the
            video's end; naming the video.
    """
    span = config.span
    if config.starts is not None:
        firsts = np.asarray(config.starts.get(key, ()), dtype=np.int64)
        bad = firsts[(firsts < 0) | (firsts >= frame_count)]
        if len(bad):
            raise ValueError(
                f"video {key!r}: clip start {int(bad[0])} outside its {frame_count} frames"
            )
        if len(firsts) and frame_count < span and config.short == "error":
            raise ValueError(f"video {key!r} has {frame_count} frames; a clip spans {span}")
        return np.sort(firsts)
    if frame_count < span:
        if config.short == "error":
            raise ValueError(
                f"video {key!r} has {frame_count} frames; a clip spans {span} "
                "(VideoConfig(short='drop' or 'pad') to go on)"
            )
        return None if config.short == "drop" else np.zeros(1, dtype=np.int64)
    last = frame_count - span
    if config.step is not None:
        return np.arange(0, last + 1, config.step, dtype=np.int64)
    count = config.clips_per_video or 1
    if count == 1:
        return np.zeros(1, dtype=np.int64)
    return np.round(np.linspace(0, last, count)).astype(np.int64)


def clip_table(config: VideoConfig, videos: Sequence[tuple[int, str, int]]) -> ClipTable:
    """The clips of ``videos``: ``(sample, key, frame count)`` each, in sample order."""
    samples: list[np.ndarray] = []
    firsts: list[np.ndarray] = []
    dropped: list[str] = []
    for sample, key, frame_count in videos:
        starts = clip_starts(config, frame_count, key)
        if starts is None:
            dropped.append(key)
            continue
        samples.append(np.full(len(starts), sample, dtype=np.int64))
        firsts.append(starts)
    if dropped:
        logger.warning(
            "%d video(s) shorter than a clip of %d frames left out (short='drop'): %s",
            len(dropped),
            config.span,
            ", ".join(repr(k) for k in dropped[:5]) + (" ..." if len(dropped) > 5 else ""),
        )
    return ClipTable(_cat(samples), _cat(firsts), dropped)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
