"""Test videos: a window panning over one of the benchmark photographs
(:mod:`stoker.testing.photos`), encoded by PyAV (``pip install 'stoker[video]'``) with the
codec, keyframe interval and frame timing asked for, so frames differ from each other as
in real footage and every codec's reordering (B-frames) is exercised."""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

import numpy as np

#: Container of each codec's test videos.
CONTAINERS = {"libx264": "mp4", "libx265": "mp4", "libvpx-vp9": "webm", "libsvtav1": "mp4"}
_FORMATS = {"mp4": "mp4", "mkv": "matroska", "webm": "webm"}


def make_video(
    *,
    frames: int,
    width: int = 160,
    height: int = 96,
    codec: str = "libx264",
    gop: int = 12,
    fps: int = 30,
    variable: bool = False,
    container: str | None = None,
    photo: int = 0,
) -> bytes:
    """A video of ``frames`` frames panning over photograph ``photo`` (modulo the count).

    Args:
        frames: Frames to encode.
        width: Frame width (even).
        height: Frame height (even).
        codec: PyAV encoder (``libx264``, ``libx265``, ``libvpx-vp9``, ``libsvtav1``).
        gop: Frames between keyframes at most.
        fps: Nominal frame rate.
        variable: Frames 1, 2 or 3 ticks of ``1/fps`` apart in turn (variable frame rate).
        container: ``mp4``, ``mkv`` or ``webm`` (default: the codec's usual one).
        photo: Which source photograph.
    """
    import av

    from stoker.testing.photos import source_photos

    photos = source_photos(max_side=max(4 * width, 4 * height))
    source = np.asarray(photos[photo % len(photos)].resize((2 * width, 2 * height)))
    extension = container or CONTAINERS.get(codec, "mp4")
    out = io.BytesIO()
    muxer: Any
    with av.open(out, mode="w", format=_FORMATS[extension]) as muxer:
        stream: Any = muxer.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        stream.codec_context.time_base = Fraction(1, fps)
        if codec == "libsvtav1":  # quiet encoders: their banners on stderr say nothing
            stream.codec_context.options = {"svtav1-params": "log-level=0"}
        elif codec == "libx265":
            stream.codec_context.options = {"x265-params": "log-level=error"}
        tick = 0
        for n in range(frames):
            # A window moving right and down, a pixel or two a frame, back and forth.
            x = (3 * n) % (2 * width) if (3 * n) // (2 * width) % 2 == 0 else 0
            y = n % height
            x = min(x, width)
            frame = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(source[y : y + height, x : x + width]), format="rgb24"
            )
            frame.pts, frame.time_base = tick, Fraction(1, fps)
            tick += 1 + (n % 3 if variable else 0)
            for packet in stream.encode(frame):
                muxer.mux(packet)
        for packet in stream.encode(None):
            muxer.mux(packet)
    return out.getvalue()


def decode_all(data: bytes) -> list[np.ndarray]:
    """Every frame of a video's first video stream, in presentation order, as RGB arrays:
    what the clips of a packed video must equal."""
    import av

    container: Any
    with av.open(io.BytesIO(data)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
