"""Re-encoding a video once at pack (``stoker pack --resize N`` or ``--fps F`` over videos):
smaller frames, or a steady frame rate, as H.264 in MP4 with a keyframe every second,
so that a clip's group of pictures is at most a second of video. Without either option a
video is stored byte for byte."""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from stoker.format.video import VideoError

#: Seconds between keyframes of a re-encoded video.
KEYFRAME_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class VideoPolicy:
    """What the pack does to each video.

    Attributes:
        resize_shorter: Scale so the shorter side is this many pixels (never enlarges).
        max_side: Scale so the longer side is at most this many pixels.
        fps: Re-time to this many frames per second (frames dropped or repeated: the
            frame showing at each new frame's time).
    """

    resize_shorter: int | None = None
    max_side: int | None = None
    fps: float | None = None

    def __post_init__(self) -> None:
        if self.fps is not None and not 0 < self.fps <= 1000:
            raise ValueError(f"fps must be in (0, 1000], got {self.fps}")

    @property
    def rewrites(self) -> bool:
        """Whether videos are re-encoded."""
        return bool(self.resize_shorter or self.max_side or self.fps)

    def size(self, width: int, height: int) -> tuple[int, int]:
        """The re-encoded frame size (even sides, as 4:2:0 needs)."""
        scale = 1.0
        if self.resize_shorter:
            scale = min(1.0, self.resize_shorter / min(width, height))
        elif self.max_side:
            scale = min(1.0, self.max_side / max(width, height))
        return max(2, round(width * scale / 2) * 2), max(2, round(height * scale / 2) * 2)


def reencode_video(data: bytes, policy: VideoPolicy, *, where: str) -> bytes:
    """``data`` decoded and encoded again as ``policy`` says: H.264 in MP4.

    Raises:
        VideoError: Not a video that decodes, naming ``where``.
    """
    import av

    out = io.BytesIO()
    source: Any
    target: Any
    try:
        with av.open(io.BytesIO(data)) as source, av.open(out, mode="w", format="mp4") as target:
            stream = source.streams.video[0]
            rate = Fraction(policy.fps).limit_denominator(1001) if policy.fps else None
            rate = rate or stream.average_rate or Fraction(30)
            width, height = policy.size(stream.codec_context.width, stream.codec_context.height)
            encoder = target.add_stream("libx264", rate=rate)
            encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
            encoder.codec_context.time_base = 1 / rate
            encoder.codec_context.gop_size = max(1, round(float(rate) * KEYFRAME_SECONDS))
            made = 0

            def emit(frame: Any) -> None:
                nonlocal made
                scaled = frame.reformat(width=width, height=height, format="yuv420p")
                scaled.pts, scaled.time_base = made, 1 / rate
                for packet in encoder.encode(scaled):
                    target.mux(packet)
                made += 1

            shown: Any = None  # the source frame showing at the next new frame's time
            for frame in source.decode(stream):
                if policy.fps is None:
                    emit(frame)
                    continue
                seconds = float(frame.time or 0.0)
                while shown is not None and made / float(rate) < seconds - 1e-9:
                    emit(shown)
                shown = frame
            if shown is not None:  # the last frame, from its own time
                while made == 0 or made / float(rate) <= float(shown.time or 0.0) + 1e-9:
                    emit(shown)
            for packet in encoder.encode(None):
                target.mux(packet)
    except Exception as exc:
        raise VideoError(f"{where}: cannot re-encode: {exc}") from exc
    return out.getvalue()
