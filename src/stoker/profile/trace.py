"""Chrome-trace JSON of a loader's timeline, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Each :class:`~stoker.core.metrics.TraceEvent` becomes one complete (``"X"``) event on a
track. Spans that overlap on one lane (read groups in flight at once on the I/O engine) are
spread over numbered tracks, ``io 0``, ``io 1``, ..., each taking the lowest free one, so no
two spans on a track overlap and the number of tracks shows the concurrency. Decode threads
are placed the same way, on ``decode 0``, ``decode 1``, ... (the one name for their rows in
the trace, the doctor's picture and its report), whichever thread pool ran them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.core.metrics import Stage, TraceEvent

#: Track of each stage that is not placed by the lane it ran on.
STAGE_TRACKS: dict[str, str] = {
    Stage.CONSUMER_WAIT: "consumer",
    Stage.CONSUMER_STEP: "consumer",
    Stage.WAIT_FETCH: "pipeline",
    Stage.WAIT_DECODE: "pipeline",
    Stage.COLLATE: "pipeline",
    Stage.INDEX: "pipeline",
}
#: Order of the tracks, top to bottom; other tracks follow in name order.
_TRACK_ORDER = ("consumer", "pipeline", "io", "decode")
#: Lane groups whose rows are always numbered (``io 0``, ``decode 0``, ...), even if one.
_NUMBERED = ("io", "decode")


@dataclass(frozen=True, slots=True)
class PlacedEvent:
    """A span placed on a track: times in microseconds from the origin.

    Attributes:
        event: The span.
        track: Track name (``consumer``, ``pipeline``, ``io 0``, ``decode 1``, ...).
        ts_us: Start, microseconds after the origin (to the nanosecond).
        dur_us: Duration in microseconds (to the nanosecond).
    """

    event: TraceEvent
    track: str
    ts_us: float
    dur_us: float


def _lane_group(event: TraceEvent) -> str:
    if event.stage in STAGE_TRACKS:
        return STAGE_TRACKS[event.stage]
    lane = event.lane
    if lane.startswith("stoker-decode"):
        # Every decode thread, of the first pool or one autotune made later
        # ("stoker-decode-2_0"), is on a "decode N" row: the rows are numbered by concurrency.
        return "decode"
    return lane


def _sort_key(track: str) -> tuple[int, str, int]:
    head, _, number = track.partition(" ")
    rank = _TRACK_ORDER.index(head) if head in _TRACK_ORDER else len(_TRACK_ORDER)
    return (rank, head, int(number) if number.isdigit() else -1)


def place_events(
    events: Sequence[TraceEvent], *, origin_s: float | None = None
) -> tuple[list[PlacedEvent], list[str]]:
    """Place spans on tracks where none overlaps another.

    Args:
        events: Spans from :meth:`stoker.Loader.events`.
        origin_s: Time zero on the ``perf_counter`` clock (default: the earliest start).

    Returns:
        The placed spans in start order, and the track names top to bottom.
    """
    if not events:
        return [], []
    origin = min(e.start_s for e in events) if origin_s is None else origin_s
    slots: list[tuple[TraceEvent, str, int, float, float]] = []
    # Per lane group, the end of the last span on each of its tracks.
    ends: dict[str, list[int]] = {}
    for event in sorted(events, key=lambda e: (e.start_s, -e.seconds)):
        # Whole nanoseconds, so spans that meet (one ends where the next starts) do not
        # overlap by a rounding error.
        start_ns = round((event.start_s - origin) * 1e9)
        end_ns = max(start_ns, round((event.start_s + event.seconds - origin) * 1e9))
        group = _lane_group(event)
        lanes = ends.setdefault(group, [])
        slot = next((n for n, end in enumerate(lanes) if end <= start_ns), len(lanes))
        if slot == len(lanes):
            lanes.append(end_ns)
        else:
            lanes[slot] = end_ns
        slots.append((event, group, slot, start_ns / 1000, (end_ns - start_ns) / 1000))
    placed = [
        PlacedEvent(
            event,
            f"{group} {slot}" if group in _NUMBERED or len(ends[group]) > 1 else group,
            ts,
            dur,
        )
        for event, group, slot, ts, dur in slots
    ]
    tracks = sorted({p.track for p in placed}, key=_sort_key)
    return placed, tracks


def chrome_trace(
    events: Sequence[TraceEvent],
    *,
    origin_s: float | None = None,
    process_name: str = "stoker loader",
) -> dict[str, Any]:
    """The Chrome trace-event JSON object of ``events`` (see :func:`place_events`).

    Every span is an ``"X"`` event with ``ts`` and ``dur`` in microseconds, ``pid`` 1 and
    one ``tid`` per track; ``"M"`` metadata events name the process and the tracks and keep
    them in pipeline order. ``args`` carry the span's items and bytes.
    """
    placed, tracks = place_events(events, origin_s=origin_s)
    tid = {track: n + 1 for n, track in enumerate(tracks)}
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": process_name}}
    ]
    for track, number in tid.items():
        out.append(
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": number, "args": {"name": track}}
        )
        out.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": 1,
                "tid": number,
                "args": {"sort_index": number},
            }
        )
    for p in placed:
        out.append(
            {
                "ph": "X",
                "name": p.event.stage,
                "cat": p.event.stage.split(".", 1)[0],
                "ts": p.ts_us,
                "dur": p.dur_us,
                "pid": 1,
                "tid": tid[p.track],
                "args": {"items": p.event.items, "bytes": p.event.bytes},
            }
        )
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(
    events: Sequence[TraceEvent],
    path: str | os.PathLike[str],
    *,
    origin_s: float | None = None,
) -> Path:
    """Write :func:`chrome_trace` of ``events`` to ``path`` and return it."""
    target = Path(path)
    target.write_text(json.dumps(chrome_trace(events, origin_s=origin_s)), encoding="utf-8")
    return target
