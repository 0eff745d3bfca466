"""Videos stored as they are, with a seek index: what a clip needs, found without a decode.

At pack each video is demuxed once (no decode but its first frame, which proves the codec
decodes): its packets in decode order, each with the byte offset of its data in the file,
its size, its presentation timestamp and whether it is a keyframe; with the codec, its
extradata (H.264's ``avcC``, ...), frame size and time base. That is the video's
:class:`VideoIndex`. A clip of frames ``first, first + stride, ...`` (counted in
presentation order) then needs the packets from the keyframe at or before its first frame
to the last packet its frames need, in decode order: one contiguous run of the file's
bytes, fetched with one ranged GET and decoded by a bare decoder fed those packets
(:func:`stoker.format.video_decode.decode_clip`), with no container around them.

PyAV (``pip install 'stoker[video]'``, BSD; its wheels carry FFmpeg) is imported by
:func:`import_av` alone, only when a video is probed or decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Member extensions read as videos.
VIDEO_FIELDS = ("mp4", "mkv", "webm", "mov")
#: Most packets one video may have (about 4.6 hours at 60 frames/s): a bound on what a
#: lying or hostile file can make the index allocate.
MAX_PACKETS = 1_000_000
#: Longest codec extradata kept (real ones are tens to a few hundred bytes).
MAX_EXTRADATA = 1 << 16
#: A packet's data is searched for this far past the offset the demuxer gives (Matroska
#: gives the block's start, a few bytes before the frame's data).
DATA_SEARCH_BYTES = 64


class VideoError(ValueError):
    """A video that cannot be probed or decoded (the message says which and why)."""


def import_av() -> Any:
    try:
        import av
    except ImportError:
        raise VideoError(
            "videos need PyAV: pip install 'stoker[video]' (or pip install av)"
        ) from None
    av.logging.set_level(av.logging.ERROR)
    return av


@dataclass(frozen=True, slots=True, eq=False)
class VideoIndex:
    """One video's seek index: its packets in decode order and how to decode them.

    Attributes:
        codec: FFmpeg decoder name (``h264``, ``hevc``, ``vp9``, ``av1``, ...).
        extradata: The codec's out-of-band set-up bytes (may be empty).
        width: Frame width in pixels.
        height: Frame height in pixels.
        time_base: Seconds per timestamp unit, as ``(numerator, denominator)``.
        offset: Byte offset of each packet's data in the video file (int64).
        size: Bytes of each packet (int64).
        pts: Presentation timestamp of each packet (int64, in ``time_base`` units).
        key: Whether each packet is a keyframe (bool).
    """

    codec: str
    extradata: bytes
    width: int
    height: int
    time_base: tuple[int, int]
    offset: np.ndarray
    size: np.ndarray
    pts: np.ndarray
    key: np.ndarray

    @property
    def frames(self) -> int:
        """Frames in the video (one per packet)."""
        return len(self.pts)

    @property
    def nbytes(self) -> int:
        """Bytes of all its packets."""
        return int(self.size.sum())

    def presentation(self) -> np.ndarray:
        """Decode-order packet of each frame, frames in presentation order."""
        return np.argsort(self.pts, kind="stable")

    def seconds(self, pts: np.ndarray | int) -> np.ndarray:
        """Timestamps in seconds."""
        num, den = self.time_base
        return np.asarray(pts, dtype=np.float64) * num / den

    @property
    def duration(self) -> float:
        """Seconds from the first frame's start to the last one's end (the last frame
        lasting as long as the mean frame before it)."""
        if self.frames < 2:
            return 0.0
        first, last = int(self.pts.min()), int(self.pts.max())
        step = (last - first) / (self.frames - 1)
        num, den = self.time_base
        return (last - first + step) * num / den

    @property
    def fps(self) -> float:
        """Mean frames per second."""
        duration = self.duration
        return self.frames / duration if duration > 0 else 0.0

    def keyframe_seconds(self) -> np.ndarray:
        """Timestamps of the keyframes, in seconds, in presentation order."""
        return np.sort(self.seconds(self.pts[self.key]))

    def clip_packets(self, frames: np.ndarray) -> tuple[int, int]:
        """The decode-order packets ``[lo, hi)`` that frames ``frames`` (presentation
        order indices, ascending) need: from the keyframe at or before the first frame to
        the last of their packets.

        Raises:
            VideoError: A frame index outside the video, or no keyframe before the first.
        """
        if not len(frames):
            raise VideoError("a clip of no frames")
        if int(frames[0]) < 0 or int(frames[-1]) >= self.frames:
            raise VideoError(f"frames {frames[0]}..{frames[-1]} outside 0..{self.frames - 1}")
        packets = self.presentation()[frames]
        first_pts = self.pts[packets[0]]
        keys = np.flatnonzero(
            self.key & (self.pts <= first_pts) & (np.arange(self.frames) <= packets.min())
        )
        if not len(keys):
            raise VideoError(f"no keyframe at or before frame {int(frames[0])}")
        return int(keys[-1]), int(packets.max()) + 1

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` of the file holding packets ``[lo, hi)``."""
        start = int(self.offset[lo:hi].min())
        end = int((self.offset[lo:hi] + self.size[lo:hi]).max())
        return start, end

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (for a pack's per-shard record)."""
        return {
            "codec": self.codec,
            "extradata": self.extradata.hex(),
            "width": self.width,
            "height": self.height,
            "time_base": list(self.time_base),
            "offset": self.offset.tolist(),
            "size": self.size.tolist(),
            "pts": self.pts.tolist(),
            "key": self.key.astype(np.uint8).tolist(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VideoIndex:
        return cls(
            codec=str(data["codec"]),
            extradata=bytes.fromhex(data["extradata"]),
            width=int(data["width"]),
            height=int(data["height"]),
            time_base=(int(data["time_base"][0]), int(data["time_base"][1])),
            offset=np.asarray(data["offset"], dtype=np.int64),
            size=np.asarray(data["size"], dtype=np.int64),
            pts=np.asarray(data["pts"], dtype=np.int64),
            key=np.asarray(data["key"], dtype=bool),
        )

    def check(self, file_bytes: int, *, where: str) -> None:
        """Refuse an index that cannot be this video's: packets past the file's end,
        negative sizes, timestamps repeated, no keyframe first, an unknown time base.

        Raises:
            VideoError: Naming ``where`` and what is wrong.
        """
        n = self.frames
        if n == 0:
            raise VideoError(f"{where}: no video frames")
        if n > MAX_PACKETS:
            raise VideoError(f"{where}: {n:,} packets, more than the {MAX_PACKETS:,} allowed")
        if not (len(self.offset) == len(self.size) == len(self.key) == n):
            raise VideoError(f"{where}: the seek index's arrays differ in length")
        if self.time_base[0] <= 0 or self.time_base[1] <= 0:
            raise VideoError(f"{where}: time base {self.time_base} is not positive")
        if (self.offset < 0).any() or (self.size <= 0).any():
            raise VideoError(f"{where}: a packet with a negative offset or no bytes")
        end = int((self.offset + self.size).max())
        if end > file_bytes:
            raise VideoError(
                f"{where}: the seek index places a packet's end at byte {end:,}, past the "
                f"video's {file_bytes:,} bytes"
            )
        if len(np.unique(self.pts)) != n:
            raise VideoError(f"{where}: two frames share a timestamp")
        if not self.key[0]:
            raise VideoError(f"{where}: the first packet is not a keyframe")
        if self.width < 1 or self.height < 1:
            raise VideoError(f"{where}: frame size {self.width}x{self.height}")
