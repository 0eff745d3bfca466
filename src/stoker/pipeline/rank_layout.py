"""How a rank lays out its piece of an epoch's stream (:func:`stoker.pipeline.order.assign`):
a read group cut by the boundary of two ranks' pieces in shard order on each side, and the
piece mixed through a sliding window of read groups. Pure functions of arrays and a seed."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

#: After the start, groups join at most this many per group delivered (all at once would
#: hold the second batch back for them).
WINDOW_JOINS_PER_GROUP = 4
#: Groups it takes the window to widen by one (each new group widens it by the inverse):
#: while it widens, the store delivers ``1 + 1 / WINDOW_GROWTH_GROUPS`` groups per group
#: consumed.
WINDOW_GROWTH_GROUPS = 2


def mix_window(
    samples: np.ndarray, groups: np.ndarray, window: int, rng: np.random.Generator, *, start: int
) -> tuple[np.ndarray, np.ndarray]:
    """Mix a rank's piece through a sliding window of up to ``window`` read groups.

    Group ``g`` (numbered along the piece) spreads its samples uniformly over a stretch of a
    time line that ends at ``g + 1`` and is up to ``width(g)`` long, and the piece is
    sorted by time. The first ``start`` groups
    (:attr:`~stoker.pipeline.order.OrderConfig.window_starts`) all spread over
    ``[0, start)`` (a small shuffle buffer filling); later stretches widen by
    ``1 / WINDOW_GROWTH_GROUPS`` per group up to ``window``, but none starts before
    ``start``, and they join from there at most ``WINDOW_JOINS_PER_GROUP`` per group of
    time. At any point about ``width`` groups are being delivered, so a batch draws
    from that many; a group is first needed at its stretch's start and done at its end, so
    a first batch of at most ``start`` groups' samples waits for those ``start`` groups,
    not ``window`` (nor the groups widening the window after them).
    """
    count = int(groups[-1]) + 1
    jitter = rng.random(len(samples))
    if count <= start:  # the whole piece fits in the first window: a plain permutation
        time = jitter
    else:
        g = groups.astype(np.float64)
        width = np.minimum(window, start + np.maximum(0.0, g + 1 - start) / WINDOW_GROWTH_GROUPS)
        end = np.maximum(g + 1, start)
        joins = start + (g - start) / WINDOW_JOINS_PER_GROUP
        begin = np.where(g < start, 0.0, np.maximum(joins, end - width))
        time = begin + jitter * (end - begin)
    by_time = np.argsort(time, kind="stable")
    mixed, groups = samples[by_time], groups[by_time]
    # Renumber the groups in the order they are first needed.
    _, first_use = np.unique(groups, return_index=True)
    rank_of = np.empty(count, dtype=np.int64)
    rank_of[np.argsort(first_use, kind="stable")] = np.arange(count)
    return mixed, rank_of[groups]


def split_groups_by_position(
    samples: np.ndarray, starts: np.ndarray, cuts: Sequence[int], needed: set[int]
) -> np.ndarray:
    """``samples`` with each read group that a cut falls inside laid out in shard order
    between the cuts (and shuffled within each side), so that a block at the boundary of two
    ranks' pieces is one contiguous range on each side: two partial ranged reads, not many.
    Only the groups holding a position of ``needed`` are laid out (the others are unchanged
    for a caller that reads only there).
    """
    inside = sorted({c for c in cuts if 0 < c < len(samples)} - set(starts.tolist()))
    wanted = [c for c in inside if c in needed]
    if not wanted:
        return samples
    samples = samples.copy()
    for group in np.unique(np.searchsorted(starts, wanted, side="right") - 1).tolist():
        begin, end = int(starts[group]), int(starts[group + 1])
        ordered = np.sort(samples[begin:end])
        bounds = [begin, *(c for c in inside if begin < c < end), end]
        for lo, hi in itertools.pairwise(bounds):
            part = ordered[lo - begin : hi - begin]
            # Seeded by the part itself: the same on every rank, for any world size.
            rng = np.random.default_rng([int(part[0]), len(part), lo - begin])
            samples[lo:hi] = rng.permutation(part)
    return samples
