"""A packed dataset's videos: every video's seek index (:class:`~stoker.format.video.VideoIndex`)
in one object beside the index, ``videos.npz``, named with its size and SHA-256 by the
manifest's ``videos`` entry (docs/FORMAT.md).

The object is a NumPy ``.npz`` of plain arrays (read with ``allow_pickle=False``: nothing in
it is ever unpickled): per video its sample, the absolute byte offset and size of its
member's data in its shard, codec, extradata, frame size and time base; per packet its
offset in the video, size, timestamp and keyframe flag, concatenated over the videos.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.errors import ShardFormatError
from stoker.format.video import MAX_PACKETS, VideoError, VideoIndex

#: Name of the videos object, beside ``index.json``.
VIDEOS_NAME = "videos.npz"
#: Largest videos object read (a bound on what a lying manifest can make a reader fetch).
MAX_VIDEOS_BYTES = 4 << 30


@dataclass(frozen=True, slots=True)
class VideoEntry:
    """One packed video: its sample, where its member's data lies in the shard, its index."""

    sample: int
    offset: int
    size: int
    index: VideoIndex


def encode_videos(entries: Sequence[VideoEntry]) -> bytes:
    """The ``videos.npz`` bytes of ``entries`` (in sample order)."""
    counts = np.asarray([e.index.frames for e in entries], dtype=np.int64)
    extra = [e.index.extradata for e in entries]
    codecs = sorted({e.index.codec for e in entries})

    def cat(name: str, dtype: str) -> np.ndarray:
        parts = [np.asarray(getattr(e.index, name), dtype=dtype) for e in entries]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    arrays = {
        "sample": np.asarray([e.sample for e in entries], dtype=np.int64),
        "member_offset": np.asarray([e.offset for e in entries], dtype=np.int64),
        "member_size": np.asarray([e.size for e in entries], dtype=np.int64),
        "codec_names": np.asarray(codecs, dtype="U32"),
        "codec": np.asarray([codecs.index(e.index.codec) for e in entries], dtype=np.int32),
        "width": np.asarray([e.index.width for e in entries], dtype=np.int32),
        "height": np.asarray([e.index.height for e in entries], dtype=np.int32),
        "time_base": np.asarray([e.index.time_base for e in entries], dtype=np.int64).reshape(
            -1, 2
        ),
        "extradata": np.frombuffer(b"".join(extra), dtype=np.uint8),
        "extradata_start": np.concatenate([[0], np.cumsum([len(x) for x in extra])]).astype(
            np.int64
        ),
        "packet_start": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        "packet_offset": cat("offset", "<i8"),
        "packet_size": cat("size", "<i8"),
        "packet_pts": cat("pts", "<i8"),
        "packet_key": cat("key", "u1"),
    }
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def videos_manifest(data: bytes) -> dict[str, Any]:
    """The manifest's ``videos`` entry for the object ``data``."""
    return {"name": VIDEOS_NAME, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class VideoTable:
    """The videos of a packed dataset, by sample (read from ``videos.npz``).

    Raises:
        ShardFormatError: From :meth:`decode`: an object that is not this table, or whose
            arrays disagree with each other or with the dataset (naming the video).
    """

    def __init__(self, arrays: dict[str, np.ndarray], *, where: str) -> None:
        self.where = where
        self._a = arrays
        self.samples: np.ndarray = arrays["sample"]
        self._by_sample = {int(s): v for v, s in enumerate(self.samples.tolist())}

    @classmethod
    def decode(
        cls, data: bytes, manifest: dict[str, Any], *, samples: int, where: str
    ) -> VideoTable:
        """Check ``data`` against the manifest's entry and read it."""
        if len(data) != int(manifest.get("bytes", -1)):
            raise ShardFormatError(
                f"{where}: {len(data):,} bytes, the index says {manifest.get('bytes')}"
            )
        if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            raise ShardFormatError(f"{where}: its SHA-256 is not the one the index names")
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as found:
                arrays = {name: found[name] for name in found.files}
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
            raise ShardFormatError(f"{where}: not a videos table: {exc}") from exc
        table = cls(arrays, where=where)
        table._check(samples)
        return table

    def _check(self, samples: int) -> None:
        a = self._a
        count = len(self.samples)
        starts = a["packet_start"]
        extra = a["extradata_start"]
        if len(starts) != count + 1 or len(extra) != count + 1:
            raise ShardFormatError(f"{self.where}: its offsets do not match its {count} videos")
        if (np.diff(starts) < 0).any() or int(starts[-1]) != len(a["packet_pts"]):
            raise ShardFormatError(f"{self.where}: its packet offsets are not in order")
        if (np.diff(starts) > MAX_PACKETS).any():
            raise ShardFormatError(f"{self.where}: a video with more than {MAX_PACKETS:,} packets")
        if count and (self.samples.min() < 0 or self.samples.max() >= samples):
            raise ShardFormatError(f"{self.where}: a video of a sample the dataset does not have")
        if len(self._by_sample) != count:
            raise ShardFormatError(f"{self.where}: a sample with two videos")

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def frame_counts(self) -> np.ndarray:
        """Frames of each video (one per packet)."""
        return np.diff(self._a["packet_start"])

    @property
    def member_sizes(self) -> np.ndarray:
        """Bytes of each video."""
        return self._a["member_size"]

    def video_of(self, sample: int) -> int | None:
        """The table's row for ``sample``, or None if it has no video."""
        return self._by_sample.get(int(sample))

    def member(self, video: int) -> tuple[int, int]:
        """``(offset, size)`` of the video's data in its shard."""
        return int(self._a["member_offset"][video]), int(self._a["member_size"][video])

    def index(self, video: int) -> VideoIndex:
        """The seek index of row ``video``, checked against its member's size.

        Raises:
            VideoError: An index that cannot be this video's (naming its sample).
        """
        a = self._a
        lo, hi = int(a["packet_start"][video]), int(a["packet_start"][video + 1])
        e0, e1 = int(a["extradata_start"][video]), int(a["extradata_start"][video + 1])
        codec = int(a["codec"][video])
        names = a["codec_names"]
        if not 0 <= codec < len(names):
            raise VideoError(f"{self.where}: video {video}: codec number {codec} unknown")
        num, den = (int(x) for x in a["time_base"][video])
        index = VideoIndex(
            codec=str(names[codec]),
            extradata=a["extradata"][e0:e1].tobytes(),
            width=int(a["width"][video]),
            height=int(a["height"][video]),
            time_base=(num, den),
            offset=a["packet_offset"][lo:hi].astype(np.int64),
            size=a["packet_size"][lo:hi].astype(np.int64),
            pts=a["packet_pts"][lo:hi].astype(np.int64),
            key=a["packet_key"][lo:hi].astype(bool),
        )
        index.check(self.member(video)[1], where=f"{self.where}: sample {int(self.samples[video])}")
        return index
