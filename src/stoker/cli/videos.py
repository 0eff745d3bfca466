"""``stoker inspect`` of a dataset of videos: each video's seek index summarised (codec,
frame size, frames, frame rate, duration, keyframes, bytes), from ``videos.npz`` alone."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from stoker.core.units import format_bytes
from stoker.format.reader import ShardDataset
from stoker.pipeline.video_source import read_video_table

#: Videos listed in the table (``--json`` lists all).
SHOWN = 50


def video_summary(dataset: ShardDataset) -> list[dict[str, Any]]:
    """One row per video of ``dataset``: its key, codec, size, frames, rate, duration,
    keyframes (count and their first timestamps) and bytes."""
    table = read_video_table(dataset)
    rows = []
    for row in range(len(table)):
        index = table.index(row)
        keyframes = index.keyframe_seconds()
        rows.append(
            {
                "key": dataset.index.keys[int(table.samples[row])],
                "codec": index.codec,
                "width": index.width,
                "height": index.height,
                "frames": index.frames,
                "fps": round(index.fps, 3),
                "duration_s": round(index.duration, 3),
                "keyframes": len(keyframes),
                "keyframe_s": [round(float(t), 3) for t in keyframes[:8]],
                "bytes": table.member(row)[1],
            }
        )
    return rows


def print_videos(console: Console, rows: list[dict[str, Any]], shown: Any) -> None:
    """The videos as a table (``shown`` escapes a key for the terminal)."""
    table = Table("video", "codec", "size", "frames", "fps", "seconds", "keyframes", "bytes")
    for row in rows[:SHOWN]:
        table.add_row(
            shown(row["key"]),
            row["codec"],
            f"{row['width']}x{row['height']}",
            f"{row['frames']:,}",
            f"{row['fps']:.2f}",
            f"{row['duration_s']:.2f}",
            f"{row['keyframes']:,}",
            format_bytes(row["bytes"]),
        )
    console.print(table)
    if len(rows) > SHOWN:
        console.print(f"... and {len(rows) - SHOWN} more videos (--json lists all)")
