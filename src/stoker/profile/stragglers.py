"""Which rank holds a multi-rank run back, and why: the straggler check.

Under data-parallel training every step waits for the slowest rank, so one rank whose
input stalls slows them all while the others' loaders look idle. Gather each rank's
:meth:`stoker.Loader.stats` (a picklable dataclass:
``torch.distributed.all_gather_object`` gathers it) and ask::

    stats = [None] * world_size
    torch.distributed.all_gather_object(stats, loader.stats())
    if rank == 0:
        print(stoker.profile.stragglers.find_straggler(stats).summary())

The straggler is the rank that waited longest for its batches, named when it waited
clearly longer than the others' median; the report says where its wait went (fetching or
decoding) and what its store did that the others' did not (retries, throttles, errors).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stoker.core.metrics import Stage
from stoker.pipeline.stats import LoaderStats

#: A rank is named when its wait passes the others' median by this factor ...
STRAGGLER_FACTOR = 1.2
#: ... and by this share of its iteration time (a few milliseconds of jitter is no
#: straggler).
STRAGGLER_SHARE = 0.02


@dataclass(frozen=True, slots=True)
class RankInput:
    """One rank's input, as its stats say.

    Attributes:
        rank: The rank (its place in the list given).
        wait_s: Seconds its training loop waited for batches.
        step_s: Seconds its training loop spent in steps.
        wait_fetch_s: Seconds its loader waited for fetches.
        wait_decode_s: Seconds its loader waited for decoding.
        retries: Requests its store retried.
        throttles: Requests its store was throttled on.
        errors: Requests that failed.
    """

    rank: int
    wait_s: float
    step_s: float
    wait_fetch_s: float
    wait_decode_s: float
    retries: int
    throttles: int
    errors: int

    @classmethod
    def of(cls, rank: int, stats: LoaderStats) -> RankInput:
        """The input of ``rank`` from its stats."""

        def seconds(stage: str) -> float:
            found = stats.stages.get(stage)
            return found.seconds if found is not None else 0.0

        requests = stats.requests
        return cls(
            rank=rank,
            wait_s=stats.wait_s,
            step_s=stats.step_s,
            wait_fetch_s=seconds(Stage.WAIT_FETCH),
            wait_decode_s=seconds(Stage.WAIT_DECODE),
            retries=requests.get("retries", 0),
            throttles=requests.get("throttles", 0),
            errors=sum(v for k, v in requests.items() if k.startswith("errors.")),
        )


@dataclass(frozen=True, slots=True)
class Stragglers:
    """What the straggler check found.

    Attributes:
        ranks: Each rank's input, by rank.
        straggler: The rank holding the run back, or None where no rank stands out.
        median_wait_s: The other ranks' median wait (all ranks' with one rank).
        reasons: Why the straggler waited, for a reader (empty without one).
    """

    ranks: list[RankInput]
    straggler: int | None
    median_wait_s: float
    reasons: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One paragraph for a reader."""
        if self.straggler is None:
            waits = ", ".join(f"{r.wait_s:.2f}" for r in self.ranks)
            return f"no straggler: the ranks waited {waits} s for data, none clearly longest."
        slow = self.ranks[self.straggler]
        return (
            f"rank {slow.rank} is the straggler: it waited {slow.wait_s:.2f} s for data "
            f"against a median of {self.median_wait_s:.2f} s on the other ranks, and every "
            f"step waits for it; {'; '.join(self.reasons)}."
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "straggler": self.straggler,
            "median_wait_s": self.median_wait_s,
            "reasons": self.reasons,
            "ranks": [{name: getattr(r, name) for name in RankInput.__slots__} for r in self.ranks],
        }


def find_straggler(stats: Sequence[LoaderStats]) -> Stragglers:
    """Name the rank whose input holds the run back, if one does (see the module).

    Args:
        stats: Each rank's :meth:`~stoker.Loader.stats`, in rank order, over the same span
            of training (say, since the epoch began: ``stats.since(before)``).

    Raises:
        ValueError: No stats.
    """
    if not stats:
        raise ValueError("no stats: give each rank's loader.stats(), in rank order")
    ranks = [RankInput.of(rank, s) for rank, s in enumerate(stats)]
    slowest = max(ranks, key=lambda r: r.wait_s)
    others = [r for r in ranks if r.rank != slowest.rank] or ranks
    median = statistics.median(r.wait_s for r in others)
    iteration = slowest.wait_s + slowest.step_s
    stands_out = (
        slowest.wait_s > STRAGGLER_FACTOR * median
        and slowest.wait_s - median > STRAGGLER_SHARE * iteration
        and len(ranks) > 1
    )
    if not stands_out:
        return Stragglers(ranks, None, median)
    return Stragglers(ranks, slowest.rank, median, _reasons(slowest, others))


def _reasons(slow: RankInput, others: Sequence[RankInput]) -> list[str]:
    """Where the straggler's wait went, and what its store did that the others' did not."""
    reasons = []
    if slow.wait_fetch_s >= slow.wait_decode_s:
        reasons.append(f"its loader waited {slow.wait_fetch_s:.2f} s for reads (fetch-bound)")
    else:
        reasons.append(
            f"its loader waited {slow.wait_decode_s:.2f} s for decoding (decode-bound: its "
            "node's cores are busier, or its samples larger)"
        )
    for name in ("retries", "throttles", "errors"):
        mine = getattr(slow, name)
        usual = statistics.median(getattr(r, name) for r in others)
        if mine > max(2 * usual, usual + 2):
            reasons.append(f"its store had {mine} {name} against a median of {usual:g}")
    return reasons
