"""Clips of a packed dataset's videos as a Loader's source (see :mod:`stoker.pipeline.sources`).

Each unit is a clip (:mod:`stoker.pipeline.clips`): the bytes from the keyframe before its
first frame to the last packet its frames need, read with one ranged GET from the video's
shard (clips of one shard whose byte runs overlap or touch share one), and decoded by the
decode threads or processes from those packets alone
(:func:`stoker.format.video_decode.decode_clip`).
A unit carries ``key`` (the video's), ``label``, ``first_frame`` and ``timestamps`` (each
frame's, in seconds), and its ``clip`` for the decoder, which gives ``image`` as
``(T, H, W, 3)`` uint8, all frames with the clip's one augmentation.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from stoker.errors import ShardFormatError
from stoker.format.reader import ShardDataset
from stoker.format.video import VideoError, VideoIndex
from stoker.format.video_decode import ClipPackets
from stoker.format.video_table import MAX_VIDEOS_BYTES, VideoTable
from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.batching import BatchAssembler
from stoker.pipeline.clips import ClipTable, VideoConfig, clip_table
from stoker.pipeline.dataset_source import DatasetSource
from stoker.pipeline.order import EpochOrder, OrderConfig, epoch_order
from stoker.pipeline.source import Source

#: Seek indexes kept decoded per process (each a few arrays of one entry per frame).
_INDEXES_KEPT = 4096


def read_video_table(dataset: ShardDataset) -> VideoTable:
    """The seek indexes of ``dataset``'s videos (one GET, through its disk cache if any).

    Raises:
        ValueError: The dataset holds no videos.
        ShardFormatError: The videos object is missing, too large or not what the index
            names.
    """
    entry = dataset.index.videos
    if entry is None:
        raise ValueError(
            f"{dataset.url} holds no videos (fields {sorted(dataset.index.fields)}); "
            "pack a folder of .mp4/.mkv/.webm files with stoker pack"
        )
    where = f"{dataset.url}/{entry['name']}"
    if int(entry["bytes"]) > MAX_VIDEOS_BYTES:
        raise ShardFormatError(f"{where}: {int(entry['bytes']):,} bytes, over the limit")
    data = bytes(dataset.store.get(entry["name"]))
    return VideoTable.decode(data, entry, samples=len(dataset), where=where)


class VideoSource:
    """Clips of the videos of one packed dataset.

    Args:
        source: The dataset source of the videos.
        video: Frames per clip, stride, and which clips each video gives.

    Raises:
        ValueError: The dataset holds no videos, or no video gives a clip.
    """

    def __init__(self, source: DatasetSource, video: VideoConfig) -> None:
        self.source = source
        self.video = video
        dataset = source.dataset
        self.table = read_video_table(dataset)
        keys = dataset.index.keys
        if video.seconds is not None:
            video = replace(video, seconds=None, starts=self._frames_at(video.seconds))
            self.video = video
        frames = self.table.frame_counts
        rows = [
            (int(s), keys[int(s)], int(n)) for s, n in zip(self.table.samples, frames, strict=True)
        ]
        self.clips: ClipTable = clip_table(video, rows)
        if not len(self.clips):
            raise ValueError(f"{source.url}: no video gives a clip of {video.span} frames")
        self._sizes = self.clips.per_shard(
            np.asarray(dataset.index.shard, dtype=np.int64), len(dataset.shards)
        )
        self._index = functools.lru_cache(maxsize=_INDEXES_KEPT)(self.table.index)

    def _frames_at(self, seconds: Mapping[str, Sequence[float]]) -> dict[str, list[int]]:
        """The first frame shown at or after each listed time, by video key.

        Raises:
            ValueError: A key that is no video of the dataset, or a time past its end.
        """
        keys = self.source.dataset.index.keys
        rows = {keys[int(s)]: v for v, s in enumerate(self.table.samples.tolist())}
        frames: dict[str, list[int]] = {}
        for key, times in seconds.items():
            if key not in rows:
                raise ValueError(f"{self.source.url}: no video {key!r} (clip times given for it)")
            index = self.table.index(rows[key])
            shown = np.sort(index.seconds(index.pts))
            found = np.searchsorted(shown - shown[0], np.asarray(times, dtype=np.float64) - 1e-9)
            if (found >= len(shown)).any():
                raise ValueError(f"video {key!r}: a clip time past its {index.duration:.3f} s")
            frames[key] = found.tolist()
        return frames

    @property
    def url(self) -> str:
        return self.source.url

    @property
    def datasets(self) -> list[ShardDataset]:
        return self.source.datasets

    @property
    def extra_fields(self) -> tuple[str, ...]:
        return ("first_frame", "timestamps")

    # A clip is tens to hundreds of kB: the first batch need not wait for its read groups.
    cut_first_batch = True
    row_fields = None
    one_get_per_unit = False

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        return order

    def make_batcher(self, settings: BatcherSettings) -> Batcher:
        return BatchAssembler.for_source(
            self, settings, unit_shape=(self.video.frames,), images=True
        )

    @property
    def shard_sizes(self) -> list[int]:
        """Clips in each shard (a mix's blocks never cross them)."""
        return self._sizes

    def mix_batcher(
        self, mix: Source, parts: Sequence[object], settings: BatcherSettings
    ) -> Batcher:
        """The batcher of ``mix``, a mix of clips of this many frames.

        Raises:
            ValueError: A part that is no clips of as many frames.
        """
        frames = self.video.frames
        for part in parts:
            if not (isinstance(part, VideoSource) and part.video.frames == frames):
                raise ValueError(
                    f"a mix of clips takes clips of {frames} frames alone; "
                    f"{getattr(part, 'url', part)} gives other units"
                )
        return BatchAssembler.for_source(mix, settings, unit_shape=(frames,), images=True)

    def shard_of(self, unit: int) -> str | None:
        return self.source.shard_of(int(self.clips.sample[unit]))

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        return epoch_order(self._sizes, config=config, epoch=epoch)

    def units(self) -> int:
        return len(self.clips)

    def shuffled(self) -> bool:
        return self.source.shuffled()

    def unit_bytes(self) -> float:
        # A clip's share of its video, about: frames of the clip over the video's.
        table = self.table
        sizes = table.member_sizes.astype(np.float64)
        frames = np.maximum(table.frame_counts, 1)
        share = np.minimum(1.0, self.video.span / frames)
        return float((sizes * share).mean()) if len(sizes) else 1.0

    def plan(self, unit: int) -> tuple[int, ClipPackets, int, int]:
        """Clip ``unit``'s read: its sample, packets, and the byte range ``[start, end)`` of
        its shard.

        Raises:
            VideoError: Its video's seek index cannot be its video's.
        """
        sample = int(self.clips.sample[unit])
        row = self.table.video_of(sample)
        if row is None:
            raise ShardFormatError(f"{self.url}: clip {unit}'s sample {sample} has no video")
        index: VideoIndex = self._index(row)
        frames = self.video.clip_frames(int(self.clips.first[unit]), index.frames)
        key = self.source.dataset.index.keys[sample]
        where = f"{self.url}: video {key!r}"
        clip, start, end = ClipPackets.of(index, frames, where=where, device=self.video.device)
        offset = self.table.member(row)[0]
        return sample, clip, offset + start, offset + end

    def nbytes(self, ids: Sequence[int]) -> int:
        total = 0
        for unit in ids:
            try:
                _, _, start, end = self.plan(int(unit))
            except (VideoError, ShardFormatError):
                continue
            total += end - start
        return total

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        dataset = self.source.dataset
        index = dataset.index
        units: dict[int, dict[str, Any]] = {}
        runs: dict[int, list[tuple[int, int, int]]] = {}  # shard -> (start, end, unit)
        for unit in dict.fromkeys(int(i) for i in ids):
            sample = int(self.clips.sample[unit])
            found: dict[str, Any] = {
                "key": index.keys[sample],
                "label": int(index.label[sample]),
                "first_frame": np.int64(self.clips.first[unit]),
                "timestamps": np.zeros(self.video.frames),
            }
            units[unit] = found
            try:
                _, clip, start, end = self.plan(unit)
            except VideoError as exc:
                found["error"] = exc
                continue
            row = self.table.video_of(sample)
            video_index: VideoIndex = self._index(row)
            found["timestamps"] = video_index.seconds(clip.wanted)
            found["clip"] = clip
            runs.setdefault(int(index.shard[sample]), []).append((start, end, unit))
        reads = [
            (
                members,
                dataset.read_parts_async(
                    shard, start=start, end=end, parts=[(s, e) for s, e, _ in members]
                ),
            )
            for shard, parts in runs.items()
            for start, end, members in _merged(parts)
        ]
        got = await asyncio.gather(*(read for _, read in reads))  # every run's GET at once
        for (members, _), data in zip(reads, got, strict=True):
            for (_, _, unit), part in zip(members, data, strict=True):
                units[unit]["clip_bytes"] = bytes(part)  # picklable, for worker processes
        return [units[int(i)] for i in ids]


def _merged(
    parts: list[tuple[int, int, int]],
) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
    """Byte runs of one shard joined where they overlap or touch: ``(start, end,
    members)``, each member ``(start, end, unit)``."""
    runs: list[tuple[int, int, list[tuple[int, int, int]]]] = []
    for start, end, unit in sorted(parts):
        if runs and start <= runs[-1][1]:
            first, last, members = runs[-1]
            members.append((start, end, unit))
            runs[-1] = (first, max(last, end), members)
        else:
            runs.append((start, end, [(start, end, unit)]))
    return runs
