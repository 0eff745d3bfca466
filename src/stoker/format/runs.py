"""Coalesced reads: samples of one shard close together fetched by one ranged request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stoker.format.index import DatasetIndex


@dataclass(slots=True)
class Run:
    """One coalesced request: a byte range of one shard and the samples inside it."""

    shard: int
    start: int
    end: int
    samples: list[int]


def plan_runs(
    index: DatasetIndex, indices: Sequence[int], *, max_gap_bytes: int, max_run_bytes: int
) -> list[Run]:
    """Group samples into as few ranged requests as the gap and size limits allow."""
    order = sorted(indices, key=lambda i: (int(index.shard[i]), int(index.offset[i])))
    runs: list[Run] = []
    for i in order:
        shard, start = int(index.shard[i]), int(index.offset[i])
        end = start + int(index.length[i])
        if runs:
            last = runs[-1]
            if (
                last.shard == shard
                and start - last.end <= max_gap_bytes
                and end - last.start <= max_run_bytes
            ):
                last.end = max(last.end, end)
                last.samples.append(i)
                continue
        runs.append(Run(shard, start, end, [i]))
    return runs
