"""Clips decoded from the bytes of their packets alone (:class:`ClipPackets`,
:func:`decode_clip`), on the CPU or the GPU's video engine, and the probe that makes a
video's seek index at pack (:func:`probe_video`), proving its first frame decodes so."""

from __future__ import annotations

import io
import logging
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from stoker.format.video import (
    DATA_SEARCH_BYTES,
    MAX_EXTRADATA,
    MAX_PACKETS,
    VideoError,
    VideoIndex,
    import_av,
)

logger = logging.getLogger(__name__)

#: Codecs whose frames say whether others refer to them, so that the run-in from the
#: keyframe skips those none does (B-frames); AV1 and VP9 hide frames inside packets
#: shown later, so their run-in is decoded whole.
SKIPS_RUN_IN = frozenset({"h264", "hevc"})

#: Hardware decoders found usable (an ``HWAccel``) or not (None), by device, per process.
_DEVICES: dict[str, Any] = {}
_DEVICES_LOCK = threading.Lock()


def probe_video(data: bytes | memoryview, *, where: str) -> VideoIndex:
    """Demux a video's first video stream into its :class:`VideoIndex`, and decode its
    first frame from the index alone (as a clip would be), to prove it decodes.

    Raises:
        VideoError: Not a video PyAV reads, no video stream, a packet without a
            timestamp, a packet whose bytes are not in the file where the demuxer says,
            or a first frame that does not decode; naming ``where``.
    """
    av = import_av()
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
                    payload, max(pos, 0), max(pos, 0) + DATA_SEARCH_BYTES + len(payload)
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
        width: Frame width in pixels (as the seek index says).
        height: Frame height in pixels.
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
    width: int = 0
    height: int = 0
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
            width=index.width,
            height=index.height,
            device=device,
        )
        return clip, start, end


def clip_row(clip: ClipPackets) -> dict[str, Any]:
    """``clip`` as plain values (ints, lists of ints, bytes, strings), for a table column
    that carries it to another process (Ray's blocks)."""
    return {
        "codec": clip.codec,
        "extradata": clip.extradata,
        "offset": clip.offset.tolist(),
        "size": clip.size.tolist(),
        "pts": clip.pts.tolist(),
        "wanted": clip.wanted.tolist(),
        "where": clip.where,
        "width": clip.width,
        "height": clip.height,
        "device": clip.device,
    }


def clip_from_row(row: dict[str, Any]) -> ClipPackets:
    """The clip :func:`clip_row` made ``row`` of."""
    arrays = {
        name: np.asarray(row[name], dtype=np.int64) for name in ("offset", "size", "pts", "wanted")
    }
    return ClipPackets(
        codec=str(row["codec"]),
        extradata=bytes(row["extradata"]),
        where=str(row["where"]),
        width=int(row["width"]),
        height=int(row["height"]),
        device=str(row["device"]),
        **arrays,
    )


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


def decode_clip(
    clip: ClipPackets, blob: bytes | memoryview, *, size: tuple[int, int] | None = None
) -> list[np.ndarray]:
    """Decode ``clip``'s frames from ``blob``, the bytes fetched for its packets: RGB
    ``uint8`` arrays ``(height, width, 3)``, one per wanted timestamp; with ``size``,
    ``(width, height)``, scaled to it as they are converted to RGB (averaging pixels: a
    transform that shrinks the frames anyway converts a fraction of them).

    Frames before the clip's first that no other frame refers to (H.264 and HEVC B-frames
    of the run-in from the keyframe) are not decoded at all.

    Raises:
        VideoError: A codec this FFmpeg does not decode, packets outside ``blob``, or a
            frame that does not come out; naming the video.
    """
    av = import_av()
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

    scale: dict[str, Any] = {"format": "rgb24"}
    if size is not None:
        scale.update(width=size[0], height=size[1], interpolation="AREA")
    first_wanted = int(clip.wanted.min())
    skips = clip.codec in SKIPS_RUN_IN

    def take(decoded: Any) -> None:
        for frame in decoded:
            if frame.pts in found and found[frame.pts] is None:
                found[frame.pts] = frame.to_ndarray(**scale)

    p = 0
    try:
        for p in range(len(clip.pts)):
            if skips:  # a run-in frame nothing refers to need not be decoded
                context.skip_frame = "NONREF" if clip.pts[p] < first_wanted else "DEFAULT"
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
