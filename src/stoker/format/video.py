"""Videos stored as they are, with a seek index: what a clip needs, found without a decode.

At pack each video is demuxed once (no decode but its first frame, which proves the codec
decodes): its packets in decode order, each with the byte offset of its data in the file,
its size, its presentation timestamp and whether it is a keyframe; with the codec, its
extradata (H.264's ``avcC``, ...), frame size and time base. That is the video's
:class:`VideoIndex`. A clip of frames ``first, first + stride, ...`` (counted in
presentation order) then needs the packets from the keyframe at or before its first frame
to the last packet its frames need, in decode order: one contiguous run of the file's
bytes, fetched with one ranged GET and decoded by a bare decoder fed those packets
(:func:`decode_clip`), with no container around them.

PyAV (``pip install 'stoker[video]'``, BSD; its wheels carry FFmpeg) is imported only here,
and only when a video is probed or decoded.
"""

from __future__ import annotations

import io
import logging
import threading
from dataclasses import dataclass
from fractions import Fraction
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
_DATA_SEARCH_BYTES = 64


logger = logging.getLogger(__name__)

#: Hardware decoders found usable (an ``HWAccel``) or not (None), by device, per process.
_DEVICES: dict[str, Any] = {}
_DEVICES_LOCK = threading.Lock()


class VideoError(ValueError):
    """A video that cannot be probed or decoded (the message says which and why)."""


def _av() -> Any:
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


def probe_video(data: bytes | memoryview, *, where: str) -> VideoIndex:
    """Demux a video's first video stream into its :class:`VideoIndex`, and decode its
    first frame from the index alone (as a clip would be), to prove it decodes.

    Raises:
        VideoError: Not a video PyAV reads, no video stream, a packet without a
            timestamp, a packet whose bytes are not in the file where the demuxer says,
            or a first frame that does not decode; naming ``where``.
    """
    av = _av()
    raw = bytes(data)
    rows: list[tuple[int, int, int, bool]] = []
    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            if not container.streams.video:
                raise VideoError(f"{where}: no video stream")
            stream = container.streams.video[0]
            context = stream.codec_context
            codec = context.name
            extradata = bytes(context.extradata or b"")
            width, height = int(context.width), int(context.height)
            time_base = stream.time_base or Fraction(1, 1)
            for packet in container.demux(stream):
                if not packet.size:
                    continue
                if packet.pts is None:
                    raise VideoError(f"{where}: packet {len(rows)} has no timestamp")
                payload = bytes(packet)
                pos = int(packet.pos if packet.pos is not None else -1)
                found = raw.find(
                    payload, max(pos, 0), max(pos, 0) + _DATA_SEARCH_BYTES + len(payload)
                )
                if pos < 0 or found < 0:
                    raise VideoError(
                        f"{where}: packet {len(rows)}'s bytes are not stored as they decode "
                        "(a container that transforms them); re-encode or remux it to mp4"
                    )
                rows.append((found, len(payload), int(packet.pts), bool(packet.is_keyframe)))
                if len(rows) > MAX_PACKETS:
                    raise VideoError(f"{where}: more than {MAX_PACKETS:,} packets")
    except VideoError:
        raise
    except Exception as exc:  # PyAV's errors (InvalidDataError, ...) and what FFmpeg says
        raise VideoError(f"{where}: not a readable video: {exc}") from exc
    if len(extradata) > MAX_EXTRADATA:
        raise VideoError(f"{where}: {len(extradata):,} bytes of codec extradata")
    table = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
    index = VideoIndex(
        codec=codec,
        extradata=extradata,
        width=width,
        height=height,
        time_base=(int(time_base.numerator), int(time_base.denominator)),
        offset=table[:, 0].copy(),
        size=table[:, 1].copy(),
        pts=table[:, 2].copy(),
        key=table[:, 3].astype(bool),
    )
    index.check(len(raw), where=where)
    clip, start, end = ClipPackets.of(index, np.zeros(1, dtype=np.int64), where=where)
    decode_clip(clip, raw[start:end])
    return index


@dataclass(frozen=True, slots=True, eq=False)
class ClipPackets:
    """What decoding one clip takes, its bytes apart: the packets from the keyframe before
    its first frame to the last packet it needs (:meth:`VideoIndex.clip_packets`), placed
    in the bytes fetched for them, and the timestamps of the frames wanted.

    Attributes:
        codec: FFmpeg decoder name.
        extradata: The codec's set-up bytes.
        offset: Each packet's data offset in the fetched bytes (int64, decode order).
        size: Each packet's size (int64).
        pts: Each packet's timestamp (int64).
        wanted: Timestamps of the clip's frames, in the clip's order (int64; may repeat).
        where: The video, for messages.
        device: ``"cpu"``, or ``"cuda"`` to decode on the GPU's video engine (NVDEC,
            through FFmpeg) where there is one, else on the CPU (said once per process).
    """

    codec: str
    extradata: bytes
    offset: np.ndarray
    size: np.ndarray
    pts: np.ndarray
    wanted: np.ndarray
    where: str
    device: str = "cpu"

    @classmethod
    def of(
        cls, index: VideoIndex, frames: np.ndarray, *, where: str, device: str = "cpu"
    ) -> tuple[ClipPackets, int, int]:
        """The packets of frames ``frames`` (presentation order indices, ascending, may
        repeat) of ``index``'s video, with the byte range ``[start, end)`` of the video
        file to fetch for them.

        Raises:
            VideoError: A frame outside the video, or no keyframe before the first.
        """
        lo, hi = index.clip_packets(frames)
        start, end = index.span(lo, hi)
        clip = cls(
            codec=index.codec,
            extradata=index.extradata,
            offset=index.offset[lo:hi] - start,
            size=index.size[lo:hi].copy(),
            pts=index.pts[lo:hi].copy(),
            wanted=index.pts[index.presentation()[frames]],
            where=where,
            device=device,
        )
        return clip, start, end


def _hardware(av: Any, device: str) -> Any:
    """The hardware decoder of ``device`` for this process, or None for the CPU: where
    the device cannot decode (no GPU, no driver, an FFmpeg without it), one warning and
    the CPU from then on."""
    if device == "cpu":
        return None
    with _DEVICES_LOCK:
        if device not in _DEVICES:
            from av.codec.hwaccel import HWAccel, hwdevices_available

            try:
                if device not in hwdevices_available():
                    raise VideoError(f"this FFmpeg has no {device} decoding")
                accel = HWAccel(device_type=device, allow_software_fallback=True)
                av.CodecContext.create("h264", "r", hwaccel=accel)  # opens the device
                _DEVICES[device] = accel
            except Exception as exc:
                logger.warning(
                    "video decode on %s unavailable (%s); decoding on the CPU", device, exc
                )
                _DEVICES[device] = None
        return _DEVICES[device]


def decode_clip(clip: ClipPackets, blob: bytes | memoryview) -> list[np.ndarray]:
    """Decode ``clip``'s frames from ``blob``, the bytes fetched for its packets: RGB
    ``uint8`` arrays ``(height, width, 3)``, one per wanted timestamp.

    Raises:
        VideoError: A codec this FFmpeg does not decode, packets outside ``blob``, or a
            frame that does not come out; naming the video.
    """
    av = _av()
    where = clip.where
    wanted = clip.wanted.tolist()
    found: dict[int, np.ndarray | None] = dict.fromkeys(wanted)
    try:
        context = av.CodecContext.create(clip.codec, "r", hwaccel=_hardware(av, clip.device))
    except Exception as exc:
        raise VideoError(f"{where}: codec {clip.codec!r} does not decode here: {exc}") from exc
    if clip.extradata:
        context.extradata = clip.extradata
    context.thread_count = 1  # clips decode in parallel already, one per decode thread
    view = memoryview(blob)

    def take(decoded: Any) -> None:
        for frame in decoded:
            if frame.pts in found and found[frame.pts] is None:
                found[frame.pts] = frame.to_ndarray(format="rgb24")

    p = 0
    try:
        for p in range(len(clip.pts)):
            first = int(clip.offset[p])
            last = first + int(clip.size[p])
            if first < 0 or last > len(view):
                raise VideoError(f"{where}: packet {p} lies outside the bytes fetched")
            packet = av.Packet(view[first:last])
            packet.pts = int(clip.pts[p])
            take(context.decode(packet))
        take(context.decode(None))
    except VideoError:
        raise
    except Exception as exc:
        raise VideoError(f"{where}: packet {p} of the clip does not decode: {exc}") from exc
    frames = [found[pts] for pts in wanted]
    missing = [n for n, frame in enumerate(frames) if frame is None]
    if missing:
        raise VideoError(f"{where}: frames {missing} of the clip did not decode from its packets")
    return [frame for frame in frames if frame is not None]
