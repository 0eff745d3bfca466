"""Clips of videos: a folder of class folders of videos packed as they are, read as clips.

A few short H.264 videos (a bright square moving across a gradient, one direction per
class) are made with PyAV in class folders, like an image folder (``left/0.mp4``,
``right/0.mp4``, ...). ``stoker.pack`` stores each video unchanged beside a seek index;
the Loader then makes every clip a unit: ``VideoConfig(frames=8, stride=2,
clips_per_video=3)`` gives each video 3 clips of 8 frames, 2 apart, spread evenly over it,
each fetched by one ranged GET of the packets from the keyframe before it to its last
frame and decoded from those alone, with one ``Resize`` for all of a clip's frames. The
same code reads a bucket (``s3://bucket/videos``, with ``storage_options``).

Runs as is on local files, in a few seconds, with no server and no network (needs
`pip install 'stoker[video]'`):

    python examples/video_clips.py
"""

from __future__ import annotations

import tempfile
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

import stoker
from stoker.transforms import Resize

WIDTH, HEIGHT, FPS = 160, 96, 25
DIRECTIONS = {"left": -1, "right": 1}


def write_video(path: Path, frames: int, direction: int) -> None:
    """``frames`` frames of a square moving ``direction`` (-1 or 1) across a gradient,
    H.264 in MP4 with a keyframe every second."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ramp = np.linspace(40, 200, WIDTH, dtype=np.uint8)
    background = np.broadcast_to(ramp[None, :, None], (HEIGHT, WIDTH, 3))
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.codec_context.gop_size = FPS
        for n in range(frames):
            pixels = background.copy()
            x = (n * 3 * direction) % (WIDTH - 16)
            pixels[40:56, x : x + 16] = 255
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = n, Fraction(1, FPS)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        videos, packed = Path(scratch, "videos"), Path(scratch, "packed")
        for name, direction in DIRECTIONS.items():
            for i in range(3):
                write_video(videos / name / f"{i}.mp4", frames=50 + 25 * i, direction=direction)

        report = stoker.pack(videos, packed)
        print(f"packed {report.samples} videos into {report.shards} shard(s)")

        source = stoker.SourceConfig(
            packed, video=stoker.VideoConfig(frames=8, stride=2, clips_per_video=3)
        )
        with stoker.Loader(source, batch_size=4, seed=0, transform=Resize((64, 64))) as loader:
            print("classes:", loader.dataset.class_names)
            for batch in loader:  # image: (clips, frames, height, width, 3) uint8
                print(
                    f"image {batch['image'].dtype}{batch['image'].shape}",
                    f"keys {list(batch['key'])} labels {batch['label'].tolist()}",
                    f"first frames {batch['first_frame'].tolist()}",
                )
            seconds = batch["timestamps"][0]  # each frame's time in its video
            print(f"the last clip's frames at {np.round(seconds, 2).tolist()} s")


if __name__ == "__main__":
    main()
