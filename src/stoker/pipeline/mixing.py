"""Several datasets in one epoch, in set proportions: pure functions of a few integers.

A mixed epoch is built from each source's own :func:`~stoker.pipeline.order.epoch_order`,
so every source keeps its block shuffle and its contiguous reads:

1. **Counts.** :func:`source_counts` says how many samples each source gives the epoch:
   exact ``samples_per_epoch``, or ``weights`` apportioned over an epoch total (see
   :class:`MixConfig` for the rule). A count below the source's size takes the first
   samples of the source's shuffled order (a fresh subset every epoch); a count above it
   (``replacement=True``) takes whole passes, each reshuffled, the last one cut short.
2. **Groups.** Each source's read groups are made about equally numerous: a source's
   ``group_blocks`` is lowered (never raised) so that its groups hold about its share of
   a round. A batch then draws each source's samples from about as many blocks per sample.
3. **Rounds.** Groups of all sources are merged in the order they fall due (the midpoint
   of a group, as a fraction of its source's count) and cut into *rounds* holding at most
   one group of each source. Inside a round, the sources' samples are interleaved evenly.

Rounds are the read groups of the mixed order (``EpochOrder.group_starts``), so
:func:`~stoker.pipeline.order.assign` and :func:`~stoker.pipeline.order.consumed` partition
and resume a mixed epoch unchanged, and no source's read group is split between ranks.
In any stretch of the stream, source ``k``'s count differs from its share by at most about
one of its groups plus its share of one group of every source (the tests check this bound);
over the whole epoch the counts are exact.

Ids: sources are concatenated (source ``k``'s sample ``i`` is ``offsets[k] + i``), and the
``j``-th repeat of a sample within one epoch adds ``j * total`` (``total``: all sources'
samples), so every id in an epoch is distinct and resume never confuses two repeats.
:meth:`MixedOrder.locate` turns ids back into (source, sample).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from stoker.pipeline.mix_schedule import Stages, check_stages, check_weights
from stoker.pipeline.order import EpochOrder, OrderConfig, epoch_order

#: Folded into each source's seed, so sources with equal seeds still get unrelated orders.
_SOURCE_SALT = 0x6D6978


@dataclass(frozen=True, slots=True, kw_only=True)
class MixConfig:
    """How much of each source an epoch holds.

    Give exactly one of ``weights`` and ``samples_per_epoch`` (``stages`` alone, as a
    callable, gives the weights too).

    With ``weights``, the epoch holds ``epoch_size`` samples if given; otherwise, without
    replacement, as many as possible until the first source runs out (the largest total
    whose share of every source fits in it); with replacement, the sum of the sources'
    sizes. The total is apportioned by largest remainders, so counts sum to it exactly.

    Attributes:
        weights: Relative share of each source (non-negative, any scale).
        samples_per_epoch: Exact samples of each source per epoch.
        epoch_size: Total samples per epoch (with ``weights`` only).
        replacement: Let a source give more samples than it holds, by repeating it
            (whole passes, each in a new order). Without it, a count above a source's
            size is an error and every sample appears at most once per epoch.
        stages: A mixture schedule: ``((step, weights), ...)`` in increasing step order
            (from batch step ``step`` on, the mix follows ``weights``; before the first,
            ``weights``), or a callable ``step -> weights`` (then ``weights`` may be
            left out: the callable's weights for step 0 are taken). Steps are a rank's
            batches since the run began, over epochs. A mix with stages is drawn batch by
            batch from each source's own stream, which goes on from epoch to epoch
            (:mod:`stoker.pipeline.mix_positions`); ``stages=()`` draws so at constant
            weights. A callable must be picklable to reach worker processes.
    """

    weights: tuple[float, ...] | None = None
    samples_per_epoch: tuple[int, ...] | None = None
    epoch_size: int | None = None
    replacement: bool = False
    stages: Stages | None = None

    def __post_init__(self) -> None:
        if self.stages is not None:
            _check_schedule(self)
        if (self.weights is None) == (self.samples_per_epoch is None):
            raise ValueError("give exactly one of weights and samples_per_epoch")
        if self.weights is not None:
            weights = tuple(float(w) for w in self.weights)
            if not weights or any(not math.isfinite(w) or w < 0 for w in weights):
                raise ValueError(f"weights must be finite and >= 0, got {self.weights}")
            if sum(weights) <= 0:
                raise ValueError(f"at least one weight must be > 0, got {self.weights}")
            object.__setattr__(self, "weights", weights)
        if self.samples_per_epoch is not None:
            counts = tuple(int(c) for c in self.samples_per_epoch)
            if not counts or any(c < 0 for c in counts):
                raise ValueError(f"samples_per_epoch must be >= 0, got {self.samples_per_epoch}")
            object.__setattr__(self, "samples_per_epoch", counts)
            if self.epoch_size is not None:
                raise ValueError("epoch_size goes with weights; samples_per_epoch sets it")
        if self.epoch_size is not None and self.epoch_size < 0:
            raise ValueError(f"epoch_size must be >= 0, got {self.epoch_size}")

    @property
    def sources(self) -> int:
        """Number of sources the config is for."""
        given = self.weights if self.weights is not None else self.samples_per_epoch
        return len(given or ())

    @property
    def scheduled(self) -> bool:
        """Whether the mix is drawn step by step from the sources' streams (``stages``)."""
        return self.stages is not None


def _check_schedule(mix: MixConfig) -> None:
    """Check ``stages`` (and the weights they go with) and freeze them."""
    if mix.samples_per_epoch is not None:
        raise ValueError("stages change weights: give weights=..., not samples_per_epoch")
    if mix.weights is None and callable(mix.stages):
        object.__setattr__(mix, "weights", check_weights("stages(0)", mix.stages(0)))
    if mix.weights is None:
        raise ValueError("stages=((step, weights), ...) go with weights=... (before the first)")
    object.__setattr__(mix, "stages", check_stages(mix.stages, len(tuple(mix.weights))))


@dataclass(frozen=True, slots=True)
class SourceShare:
    """What one source gives a mixed epoch.

    Attributes:
        source: The source's index.
        samples: Samples it gives the epoch (repeats included).
        size: Samples it holds.
        fraction: ``samples`` over the epoch's total.
        passes: Passes over its own order this epoch (more than 1 when upsampled).
        group_samples: Samples in its largest read group in the mix.
    """

    source: int
    samples: int
    size: int
    fraction: float
    passes: int
    group_samples: int

    @property
    def repeated(self) -> int:
        """Samples that repeat an earlier one of the same epoch."""
        return max(0, self.samples - self.size)


@dataclass(frozen=True, slots=True)
class MixedOrder:
    """One mixed epoch: its order over mixed ids and each source's share.

    Attributes:
        order: The epoch's order; its groups are rounds (see the module docstring).
        shares: One entry per source.
        offsets: First id of each source in the concatenation, then the total.
    """

    order: EpochOrder
    shares: tuple[SourceShare, ...]
    offsets: np.ndarray

    def locate(self, ids: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Source index and sample index within that source of each mixed id."""
        return locate(ids, self.offsets)

    def count(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """How many of ``ids`` come from each source."""
        sources, _ = self.locate(ids)
        return np.bincount(sources, minlength=len(self.shares)).astype(np.int64)


def locate(ids: np.ndarray | Sequence[int], offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split mixed ids into (source index, sample index within the source).

    Args:
        ids: Mixed ids, as in :attr:`MixedOrder.order`.
        offsets: First id of each source, then the total (:attr:`MixedOrder.offsets`).

    Returns:
        Two int64 arrays shaped like ``ids``.
    """
    values = np.asarray(ids, dtype=np.int64)
    total = int(offsets[-1])
    flat = values % total if total else values
    sources = np.searchsorted(offsets[1:], flat, side="right").astype(np.int64)
    return sources, flat - offsets[sources]


def source_counts(source_sizes: Sequence[int], mix: MixConfig) -> list[int]:
    """Samples each source gives one epoch (the same every epoch).

    Args:
        source_sizes: Samples in each source.
        mix: Proportions or counts (see :class:`MixConfig` for the rule).

    Returns:
        One count per source.

    Raises:
        ValueError: The config is for another number of sources, a source is asked for
            more samples than it holds without ``replacement``, or an empty source is
            asked for samples.
    """
    totals = [int(s) for s in source_sizes]
    if any(t < 0 for t in totals):
        raise ValueError(f"source sizes must be >= 0, got {totals}")
    if mix.sources != len(totals):
        raise ValueError(f"mix is for {mix.sources} sources, got {len(totals)}")
    if mix.samples_per_epoch is not None:
        counts = list(mix.samples_per_epoch)
    else:
        # Weights as written (0.1 is 1/10, not the binary float nearest to it).
        weights = [Fraction(repr(w)) for w in mix.weights or ()]
        weight_sum = sum(weights, Fraction(0))
        for k, (w, t) in enumerate(zip(weights, totals, strict=True)):
            if w > 0 and t == 0:
                raise ValueError(f"source {k} is empty but has weight {float(w)}")
        if mix.epoch_size is not None:
            total = mix.epoch_size
        elif mix.replacement:
            total = sum(totals)
        else:
            # The largest total whose exact share of every source fits in that source.
            total = min(
                math.floor(t * weight_sum / w) for w, t in zip(weights, totals, strict=True) if w
            )
        counts = _apportion(total, [w / weight_sum for w in weights])
    for k, (count, size) in enumerate(zip(counts, totals, strict=True)):
        if count > size and size == 0:
            raise ValueError(f"source {k} is empty but is asked for {count} samples")
        if count > size and not mix.replacement:
            raise ValueError(
                f"source {k} holds {size} samples but is asked for {count} per epoch; "
                "use replacement=True to repeat it"
            )
    return counts


def _apportion(total: int, shares: Sequence[Fraction]) -> list[int]:
    """Largest-remainder rounding of ``total * share`` (ties to the lower index)."""
    quotas = [total * s for s in shares]
    counts = [math.floor(q) for q in quotas]
    left = total - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in by_remainder[:left]:
        counts[k] += 1
    return counts


def _source_seed(seed: int, source: int) -> int:
    state = np.random.SeedSequence([seed, _SOURCE_SALT, source]).generate_state(2, np.uint32)
    return int(state[0]) | int(state[1]) << 32


def mixed_epoch_order(
    source_sizes: Sequence[Sequence[int]],
    *,
    orders: Sequence[OrderConfig],
    mix: MixConfig,
    epoch: int,
) -> MixedOrder:
    """Return the order of one mixed epoch.

    Args:
        source_sizes: For each source, the number of samples in each of its shards.
        orders: Each source's shuffle settings. Its seed is combined with the source's
            index, so sources with equal settings still get unrelated orders; its
            ``group_blocks`` may be lowered to balance the rounds.
        mix: How much of each source the epoch holds.
        epoch: Zero-based epoch number.

    Returns:
        The epoch's order over mixed ids, and each source's share. A pure function of its
        arguments.

    Raises:
        ValueError: See :func:`source_counts`; or ``orders`` has the wrong length.
    """
    if len(orders) != len(source_sizes):
        raise ValueError(f"{len(source_sizes)} sources but {len(orders)} order configs")
    totals = [int(sum(sizes)) for sizes in source_sizes]
    counts = source_counts(totals, mix)
    offsets = np.concatenate([[0], np.cumsum(totals, dtype=np.int64)]).astype(np.int64)
    grand = int(offsets[-1])
    epoch_total = sum(counts)
    # Rounds: as many as the source with the most full-size groups needs.
    full_groups = [o.group_samples for o in orders]
    rounds = max((-(-c // g) for c, g in zip(counts, full_groups, strict=True) if c), default=0)
    ids: list[np.ndarray] = []
    group_source: list[int] = []
    group_first: list[int] = []  # position of the group's first sample in its source's run
    group_size: list[int] = []
    shares: list[SourceShare] = []
    for k, (sizes, config) in enumerate(zip(source_sizes, orders, strict=True)):
        count, size = counts[k], totals[k]
        blocks = max(1, round(count / (rounds * config.blocks))) if rounds else 1
        local = replace(
            config,
            seed=_source_seed(config.seed_value, k),
            group_blocks=min(config.groups, blocks),
        )
        passes = -(-count // size) if count else 0
        taken = 0
        largest = 0
        for j in range(passes):
            order = epoch_order(sizes, config=local, epoch=epoch * passes + j)
            take = min(size, count - taken)
            ids.append(order.samples[:take] + offsets[k] + j * grand)
            starts = np.unique(np.minimum(order.group_starts, take))
            lengths = np.diff(starts)
            group_first.extend((starts[:-1] + taken).tolist())
            group_size.extend(lengths.tolist())
            group_source.extend([k] * len(lengths))
            largest = max(largest, int(lengths.max(initial=0)))
            taken += take
        shares.append(
            SourceShare(
                source=k,
                samples=count,
                size=size,
                fraction=count / epoch_total if epoch_total else 0.0,
                passes=passes,
                group_samples=largest,
            )
        )
    samples, bounds = _interleave(
        np.concatenate(ids) if ids else np.zeros(0, np.int64),
        np.asarray(group_source, dtype=np.int64),
        np.asarray(group_first, dtype=np.int64),
        np.asarray(group_size, dtype=np.int64),
        np.asarray(counts, dtype=np.int64),
    )
    return MixedOrder(EpochOrder(samples, bounds), tuple(shares), offsets)


def _interleave(
    ids: np.ndarray,
    source: np.ndarray,
    first: np.ndarray,
    size: np.ndarray,
    counts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Merge groups by when they fall due, cut rounds, interleave each round's samples.

    ``ids`` holds the groups in input order (source by source); the other arrays describe
    the groups. Returns the stream and the round boundaries.
    """
    if not len(size):
        return ids, np.zeros(1, dtype=np.int64)
    due = (2 * first + size) / (2 * counts[source])
    merged = np.lexsort((np.arange(len(size)), source, due))
    # A round closes before a group whose source it already holds.
    round_of = np.empty(len(size), dtype=np.int64)
    current = 0
    seen: set[int] = set()
    for position, g in enumerate(merged.tolist()):
        k = int(source[g])
        if k in seen:
            current += 1
            seen.clear()
        seen.add(k)
        round_of[position] = current
    # Per sample: its round, its even spot inside its group, its source.
    input_start = np.concatenate([[0], np.cumsum(size)[:-1]])
    sample_group = np.repeat(merged, size[merged])
    within = np.arange(len(ids)) - np.repeat(
        np.concatenate([[0], np.cumsum(size[merged])[:-1]]), size[merged]
    )
    spot = (within + 0.5) / size[sample_group]
    sample_round = np.repeat(round_of, size[merged])
    sample_source = source[sample_group]
    gathered = ids[input_start[sample_group] + within]
    stream = np.lexsort((sample_source, spot, sample_round))
    round_sizes = np.bincount(sample_round, minlength=int(round_of[-1]) + 1)
    bounds = np.concatenate([[0], np.cumsum(round_sizes)]).astype(np.int64)
    return gathered[stream].astype(np.int64), bounds
