"""The order of an epoch and each rank's share of it: pure functions of a few integers.

Samples live in shards; reading is cheap when it takes long contiguous byte ranges and
expensive when it takes one sample per request. The default shuffle therefore works on
*blocks*: runs of ``block_size`` consecutive samples of one shard, whose boundaries never
move (so a cache of blocks stays valid across epochs). For each epoch:

1. the blocks of all shards are shuffled with a seeded generator;
2. consecutive shuffled blocks form *groups* of ``group_blocks`` blocks;
3. the samples inside each group are shuffled together.

A group is read with one ranged request per block, and a batch mixes samples of up to
``group_blocks`` different places in the dataset. That is enough when the shards were
written in random order (``stoker pack`` shuffles by default), not when they are sorted by
class: then each rank also mixes its piece of the stream through a sliding *window* of
``window`` read groups. Each group's samples are spread at random over a stretch of the
rank's stream ``window`` groups long, so a batch draws from about ``window`` groups at once
while each block is still read once, whole, and held only while its samples are being
delivered. Like a shuffle buffer that starts delivering early, the window starts small
(the first batch draws from ``max(WINDOW_START_GROUPS, window / WINDOW_START_DIVISOR)``
groups, so it waits for those only: the groups after them start once they are delivered)
and widens by half a group with each group until it holds ``window``.
``mode="random"`` is a full permutation (one request per sample); ``mode="none"`` keeps the
packed order.

Ranks take contiguous pieces of the epoch's stream, cut by samples, so every rank runs the
same number of steps and never hangs; at most ``world_size - 1`` samples are repeated (or,
with ``drop_last``, dropped) to even them out, and only a block at the boundary of two
pieces is read (in part) by two ranks. With ``exact`` (evaluation) nothing is repeated or
dropped: the pieces differ in length by at most one sample (:func:`exact_length`).

Resume after a change of world size: the samples that earlier segments of the epoch
consumed are removed from the epoch's order, and the rest is partitioned anew.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from stoker.core.checks import check_bool, check_choice, check_int
from stoker.pipeline.rank_layout import mix_window, split_groups_by_position

ShuffleMode = Literal["blocks", "random", "none"]


#: Samples per block and blocks per group when an OrderConfig leaves them unset and no
#: Loader derives them from the data.
DEFAULT_BLOCK_SIZE = 64
DEFAULT_GROUP_BLOCKS = 16
#: A window of read groups starts this many times narrower (the first batch waits for
#: ``window / WINDOW_START_DIVISOR`` groups, not a whole 256 MB window) ...
WINDOW_START_DIVISOR = 32
#: ... but at least this many (~16 MB each; 256 photos of 110 kB, 28 MB, waited for three
#: groups, 45 MB, when the window started at one and widened under the first batch).
WINDOW_START_GROUPS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderConfig:
    """Shuffle settings: the one owner of shuffling and its seed.

    A field left ``None`` is filled in by whoever uses the config: a
    :class:`~stoker.Loader` takes ``seed`` from its own ``seed`` argument (0 by default)
    and sizes blocks to about 4 MB of its data; the pure functions here use 0,
    :data:`DEFAULT_BLOCK_SIZE` and :data:`DEFAULT_GROUP_BLOCKS`.

    Attributes:
        mode: ``"blocks"`` (mix groups of contiguous blocks), ``"random"`` (full random
            permutation, one ranged read per sample) or ``"none"`` (no shuffle: the packed
            order).
        seed: Run-wide seed; the order of epoch ``e`` depends on ``(seed, e)`` only.
        block_size: Samples per block (one ranged read).
        group_blocks: Blocks read together (one read group).
        window: Read groups whose samples each rank mixes together (``"blocks"`` mode): 1
            mixes within a group only; more mixes better and holds about ``window`` groups
            in memory (the window starts narrower: ``window_start``). A Loader leaves it at 1 for a
            pack written in shuffled order and otherwise sizes it to about
            :data:`~stoker.pipeline.plan.WINDOW_TARGET_BYTES`.
        window_start: Read groups the window starts with: the first batch waits for these
            to be read and draws from them; the window then widens to ``window``. Unset:
            :func:`default_window_start`, a first batch soon; ``window_start = window``
            reads the whole window first and mixes the first batches as well as the rest.
        exact: Exact evaluation: every unit of the epoch delivered once over all ranks and
            workers, none repeated or dropped to even out the ranks; a rank's share is
            ``N // world_size`` or one more, so ranks' step counts may differ by one, and
            each rank's last batch may be short (docs/evaluation.md).
    """

    mode: ShuffleMode = "blocks"
    seed: int | None = None
    block_size: int | None = None
    group_blocks: int | None = None
    window: int | None = None
    window_start: int | None = None
    exact: bool = False

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, ("blocks", "random", "none"))
        check_bool("OrderConfig exact", self.exact)
        if self.seed is not None:
            check_int("OrderConfig seed", self.seed, minimum=0)
        for name in ("block_size", "group_blocks", "window", "window_start"):
            value = getattr(self, name)
            if value is not None:
                check_int(f"OrderConfig {name}", value, minimum=1)

    @property
    def shuffle(self) -> bool:
        """Whether epochs are shuffled (any mode but ``"none"``)."""
        return self.mode != "none"

    @property
    def blocks(self) -> int:
        """Samples per block: ``block_size``, or the default when unset."""
        return DEFAULT_BLOCK_SIZE if self.block_size is None else self.block_size

    @property
    def groups(self) -> int:
        """Blocks per group: ``group_blocks``, or the default when unset."""
        return DEFAULT_GROUP_BLOCKS if self.group_blocks is None else self.group_blocks

    @property
    def windows(self) -> int:
        """Read groups mixed together: ``window``, or 1 when unset."""
        return 1 if self.window is None else self.window

    @property
    def window_starts(self) -> int:
        """Read groups the window starts with: ``window_start`` (at most the window), or
        :func:`default_window_start` when unset."""
        windows = self.windows
        if self.window_start is None:
            return default_window_start(windows)
        return min(self.window_start, windows)

    @property
    def group_samples(self) -> int:
        """Samples per read group."""
        return self.blocks * self.groups

    @property
    def seed_value(self) -> int:
        """``seed``, or 0 when unset."""
        return 0 if self.seed is None else self.seed


def default_window_start(window: int) -> int:
    """Read groups a window of ``window`` starts with when ``window_start`` is unset:
    ``ceil(window / WINDOW_START_DIVISOR)``, at least :data:`WINDOW_START_GROUPS`, at most
    the window."""
    return min(window, max(WINDOW_START_GROUPS, -(-window // WINDOW_START_DIVISOR)))


@dataclass(frozen=True, slots=True)
class EpochOrder:
    """The global order of one epoch, cut into read groups.

    Attributes:
        samples: Global sample ids in stream order (a permutation of ``range(N)``).
        group_starts: Offsets into ``samples`` where each group starts (plus ``len``).
        window: Read groups each rank mixes together (see :class:`OrderConfig`).
        seed: What seeds the window's mixing: the run's seed and the epoch.
        window_start: Read groups the window starts with (0: the default for ``window``).
    """

    samples: np.ndarray
    group_starts: np.ndarray
    window: int = 1
    seed: tuple[int, ...] = ()
    window_start: int = 0

    @property
    def groups(self) -> int:
        """Number of read groups."""
        return len(self.group_starts) - 1


def _rng(seed: int, epoch: int, salt: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, salt])))


def epoch_order(shard_sizes: Sequence[int], *, config: OrderConfig, epoch: int) -> EpochOrder:
    """Return the global sample order for one epoch.

    Args:
        shard_sizes: Number of samples in each shard, in index order.
        config: Shuffle settings (with the seed).
        epoch: Zero-based epoch number.

    Returns:
        Every sample exactly once, cut into read groups.
    """
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    total = int(sizes.sum())
    if config.mode == "none" or total == 0:
        step = config.group_samples
        starts = np.arange(0, total + step, step, dtype=np.int64)
        starts[-1] = total
        return EpochOrder(np.arange(total, dtype=np.int64), np.unique(starts))
    if config.mode == "random":
        rng = _rng(config.seed_value, epoch, 1)
        step = config.group_samples
        starts = np.unique(np.minimum(np.arange(0, total + step, step, dtype=np.int64), total))
        return EpochOrder(rng.permutation(total), starts)
    # Blocks: (first sample, count) for fixed runs of block_size inside every shard.
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    block_first: list[np.ndarray] = []
    block_count: list[np.ndarray] = []
    for shard, size in enumerate(sizes.tolist()):
        firsts = np.arange(0, size, config.blocks, dtype=np.int64)
        block_first.append(firsts + offsets[shard])
        block_count.append(np.minimum(config.blocks, size - firsts))
    firsts_all = np.concatenate(block_first)
    counts_all = np.concatenate(block_count)
    rng = _rng(config.seed_value, epoch, 2)
    permuted = rng.permutation(len(firsts_all))
    firsts_all, counts_all = firsts_all[permuted], counts_all[permuted]
    pieces: list[np.ndarray] = []
    bounds = [0]
    for g in range(0, len(firsts_all), config.groups):
        members = [
            np.arange(f, f + c, dtype=np.int64)
            for f, c in zip(
                firsts_all[g : g + config.groups].tolist(),
                counts_all[g : g + config.groups].tolist(),
                strict=True,
            )
        ]
        group = np.concatenate(members)
        rng.shuffle(group)
        pieces.append(group)
        bounds.append(bounds[-1] + len(group))
    return EpochOrder(
        np.concatenate(pieces),
        np.asarray(bounds, dtype=np.int64),
        window=config.windows,
        seed=(config.seed_value, epoch),
        window_start=config.window_starts,
    )


@dataclass(frozen=True, slots=True)
class Share:
    """One rank's samples for an epoch (or for the rest of an interrupted one).

    Attributes:
        samples: Sample ids in this rank's stream order, padding included (at the end).
        padded: How many of them repeat samples of the epoch to even out ranks.
        dropped: How many samples of the epoch no rank gets (``drop_last``).
        epoch_padded: Repeats over all ranks (at most ``world_size - 1``).
        groups: The read group of each sample in ``samples`` (0, 1, ... in the order the
            groups are first needed; the padding is a group of its own): fetching a
            group's samples together reads each of its blocks once.
    """

    samples: np.ndarray
    padded: int
    dropped: int
    epoch_padded: int = 0
    groups: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def share_length(total: int, *, world_size: int, drop_last: bool = False) -> int:
    """Samples in each rank's share of an epoch of ``total``: ``len(assign(...).samples)``
    without computing the share (padding included; ``drop_last`` drops instead)."""
    return total // world_size if drop_last else -(-total // world_size)


def exact_length(total: int, *, rank: int, world_size: int) -> int:
    """Samples in rank ``rank``'s share of an epoch of ``total`` with ``exact``: the first
    ``total % world_size`` ranks take one more than ``total // world_size``."""
    return total // world_size + (rank < total % world_size)


def _exact_start(total: int, rank: int, world_size: int) -> int:
    return rank * (total // world_size) + min(rank, total % world_size)


def assign(
    order: EpochOrder,
    *,
    rank: int,
    world_size: int,
    drop_last: bool = False,
    exclude: np.ndarray | None = None,
    exact: bool = False,
) -> Share:
    """This rank's share of ``order``: one contiguous piece of the epoch's stream.

    The stream is cut by samples into ``world_size`` pieces of equal length, so every rank
    runs the same number of steps; reads stay long (a rank reads whole blocks, except at
    most one at each end of its piece, which it shares with its neighbour). Evening out
    repeats or drops fewer than ``world_size`` samples in all, as PyTorch's
    ``DistributedSampler`` does: the stream is extended with its own first samples (or,
    with ``drop_last``, cut short) to a multiple of ``world_size``.

    Args:
        order: The epoch's order.
        rank: This rank.
        world_size: Number of ranks.
        drop_last: Drop the last ``len % world_size`` samples of the stream instead of
            repeating its first ones.
        exclude: Sample ids already consumed earlier in this epoch (see :func:`consumed`);
            they are removed before partitioning.
        exact: Neither repeat nor drop (``drop_last`` unused): the pieces' lengths differ
            by at most one (:func:`exact_length`).

    Returns:
        The rank's samples; every rank gets the same count (with ``exact``, within one).
    """
    samples, starts = order.samples, order.group_starts
    if exclude is not None and len(exclude):
        keep = ~np.isin(samples, exclude)
        # Group boundaries survive the removal: count kept samples before each start.
        starts = np.unique(np.concatenate([[0], np.cumsum(keep)])[starts])
        samples = samples[keep]
    total = len(samples)
    if exact:
        each = exact_length(total, rank=rank, world_size=world_size)
        cuts = [_exact_start(total, r, world_size) for r in range(1, world_size)]
        first = _exact_start(total, rank, world_size)
    else:
        each = share_length(total, world_size=world_size, drop_last=drop_last)
        # Where ranks' pieces meet (and where drop_last cuts the tail off).
        cuts = [r * each for r in range(1, world_size + drop_last)]
        first = rank * each
    # Only the groups at this rank's two ends change its samples (its repeats, if any, are
    # samples of the epoch whichever way the stream's start is laid out).
    samples = split_groups_by_position(samples, starts, cuts, {first, first + each})
    real = max(0, min(each, total - first))  # the rest of the piece is padding
    mine = samples[first : first + real]
    groups = np.searchsorted(starts, np.arange(first, first + real), side="right") - 1
    groups -= groups[0] if real else 0
    if order.window > 1 and real:
        seed = [*order.seed, first, real, world_size, total]
        start = order.window_start or default_window_start(order.window)
        rng = np.random.default_rng(seed)
        mine, groups = mix_window(mine, groups, order.window, rng, start=min(start, order.window))
    if exact:
        return Share(mine, 0, 0, 0, groups)
    if drop_last:
        return Share(mine, 0, total - each * world_size, 0, groups)
    repeats = each * world_size - total
    padding = np.resize(samples, repeats)[max(0, first - total) : max(0, first + each - total)]
    if len(padding):  # the repeats are fetched apart, after the rank's own samples
        mine = np.concatenate([mine, padding])
        next_group = int(groups.max()) + 1 if len(groups) else 0
        groups = np.concatenate([groups, np.full(len(padding), next_group, dtype=np.int64)])
    return Share(mine, len(padding), 0, repeats, groups)


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of an epoch run at one world size: how many samples each rank consumed."""

    world_size: int
    consumed: int


def consumed(
    order: EpochOrder,
    segments: Sequence[Segment],
    *,
    drop_last: bool = False,
    seen: np.ndarray | None = None,
    exact: bool = False,
) -> np.ndarray:
    """Sample ids consumed so far in this epoch by all ranks, over earlier segments (those
    after the segments that consumed ``seen``, if given).

    Padding repeats are not new samples, so they are simply part of a rank's share; the
    union over ranks is what the epoch has delivered. With ``exact`` a rank whose share is
    shorter than ``consumed`` has delivered all of it.
    """
    seen = np.zeros(0, dtype=np.int64) if seen is None else seen
    for segment in segments:
        taken = [
            assign(
                order,
                rank=r,
                world_size=segment.world_size,
                drop_last=drop_last,
                exclude=seen,
                exact=exact,
            ).samples[: segment.consumed]
            for r in range(segment.world_size)
        ]
        seen = np.union1d(seen, np.concatenate(taken)) if taken else seen
    return seen
