"""Planning an epoch: pure functions from an order and a place in the world to batches and reads.

The Loader asks :func:`resolve_order` once for its complete order settings, then, for each
epoch, :func:`plan_epoch` for this worker's batches and the chunks in which they are
fetched. Nothing here does I/O or keeps state: same inputs, same plan.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from stoker.core.checks import check_bool, check_int
from stoker.pipeline.order import (
    DEFAULT_GROUP_BLOCKS,
    EpochOrder,
    OrderConfig,
    Segment,
    assign,
    consumed,
    exact_length,
    share_length,
)
from stoker.pipeline.world import World

logger = logging.getLogger(__name__)

#: Read groups an epoch should have at least, so that prefetch has several to overlap.
MIN_GROUPS = 16
#: Bytes one block (one ranged read) aims for when the caller leaves ``block_size`` unset.
#: A GET costs the store, and the client, about as much as a few hundred kB of data: with
#: 1 MB blocks the S3 server beside benchmarks/loader.py's set a spent twice the CPU of
#: 4 MB ones (10 against 4.4 CPU-s an epoch), and stoker streamed 1,075-1,108 images/s
#: against 1,371-1,392 where the link was not the limit (10 Gbit/s).
BLOCK_TARGET_BYTES = 4_000_000
#: Bytes of a read group (``block_size * group_blocks``) when both are derived: what a rank
#: holds of one group while its samples are delivered, and what the first batch waits for.
GROUP_TARGET_BYTES = 16_000_000
#: Most units in a block (small samples: 256 of 10 kB make 2.6 MB).
MAX_BLOCK_UNITS = 256
#: Blocks an epoch of data in unknown (maybe class-sorted) order has at least: each rank
#: reads a random share of the blocks, and fewer, larger ones leave ranks with uneven
#: shares of the classes.
MIN_BLOCKS_UNSHUFFLED = 384
#: Bytes of read groups a rank mixes together (``OrderConfig.window``) when the data's
#: order is unknown: batches then draw from about this much of the dataset at once.
WINDOW_TARGET_BYTES = 256 << 20


def block_size_for(unit_bytes: float, minimum: int = 4) -> int:
    """Units per block so that a block is about :data:`BLOCK_TARGET_BYTES`, within
    ``minimum`` and :data:`MAX_BLOCK_UNITS`: large images get short blocks, so the first
    batch needs little data and memory stays bounded; small ones long blocks, so an epoch
    makes few requests."""
    blocks = round(BLOCK_TARGET_BYTES / max(unit_bytes, 1.0))
    return int(min(MAX_BLOCK_UNITS, max(minimum, blocks)))


def group_blocks_for(block_size: int, *, units: int, unit_bytes: float) -> int:
    """Blocks per read group so that a group is about :data:`GROUP_TARGET_BYTES`, at most
    :data:`DEFAULT_GROUP_BLOCKS`, and an epoch of ``units`` has :data:`MIN_GROUPS` groups
    (at least one block a group)."""
    blocks = -(-units // block_size)
    per_group = round(GROUP_TARGET_BYTES / (block_size * max(unit_bytes, 1.0)))
    return max(1, min(DEFAULT_GROUP_BLOCKS, blocks // MIN_GROUPS, per_group))


def resolve_order(
    order: OrderConfig | None,
    *,
    seed: int | None,
    units: int,
    unit_bytes: float,
    shuffled: bool = False,
) -> OrderConfig:
    """Complete order settings: the given ones, with what they leave unset filled in.

    Unset ``block_size`` and ``group_blocks`` are derived from the data together: blocks
    of about 4 MB (:data:`BLOCK_TARGET_BYTES`) and groups of about 16 MB
    (:data:`GROUP_TARGET_BYTES`), both small enough that the epoch has :data:`MIN_GROUPS`
    groups. When
    the data was not written in random order (``shuffled`` false: a pack made with
    ``--keep-order``, an older pack, WebDataset tars indexed in place), consecutive samples
    may share a class, so blocks are also small enough that the epoch has
    :data:`MIN_BLOCKS_UNSHUFFLED`, and an unset ``window`` mixes about
    :data:`WINDOW_TARGET_BYTES` of read groups; for shuffled data it stays 1. All of it
    depends on the dataset only (never on the world size), so the order stays the same
    when a run resumes on a different number of ranks. A ``block_size`` given alone keeps
    the default ``group_blocks``.

    Args:
        order: The caller's settings, if any.
        seed: The Loader's ``seed`` argument, if given.
        units: Units (samples or windows) in an epoch.
        unit_bytes: Mean bytes of a unit.
        shuffled: Whether the units were written in random order.

    Raises:
        ValueError: ``seed`` and ``order.seed`` are both given and differ.
    """
    order = order or OrderConfig()
    block_size = order.block_size
    if block_size is None:
        block_size = block_size_for(unit_bytes)
        if not shuffled:
            block_size = max(1, min(block_size, units // MIN_BLOCKS_UNSHUFFLED))
    group_blocks = order.group_blocks
    if group_blocks is None:
        derived = group_blocks_for(block_size, units=units, unit_bytes=unit_bytes)
        group_blocks = DEFAULT_GROUP_BLOCKS if order.block_size else derived
    window = order.window
    if window is None:
        group_bytes = block_size * group_blocks * max(unit_bytes, 1.0)
        window = 1 if shuffled else max(1, int(WINDOW_TARGET_BYTES // group_bytes))
    return replace(
        order,
        seed=resolve_seed(order, seed),
        block_size=block_size,
        group_blocks=group_blocks,
        window=window,
    )


def resolve_seed(order: OrderConfig | None, seed: int | None) -> int:
    """The run's seed: ``seed`` or ``order.seed``, whichever is given, else 0.

    Raises:
        TypeError: ``seed`` is not an int.
        ValueError: ``seed`` is negative, or both are given and differ.
    """
    if seed is not None:
        check_int("seed", seed, minimum=0)
    ordered = order.seed if order is not None else None
    if seed is not None and ordered is not None and seed != ordered:
        raise ValueError(f"seed={seed} but order=OrderConfig(seed={ordered}): give the seed once")
    return ordered if ordered is not None else (seed or 0)


#: What a Loader drops: ``True`` the last incomplete batch and what evens out the ranks;
#: ``"ranks"`` only what evens out the ranks (a last, short batch is delivered); ``False``
#: nothing (ranks are evened out by repeats).
DropLast = bool | Literal["ranks"]


def drops_ranks(drop_last: DropLast) -> bool:
    """Whether ranks are evened out by dropping samples (else by repeating some)."""
    return drop_last is True or drop_last == "ranks"


def loader_drop_last(order: OrderConfig, drop_last: object) -> DropLast:
    """The ``drop_last`` a Loader plans with: as given, or False with ``order.exact``
    (nothing evens out the ranks; ``"ranks"``, which a token loader gives for
    ``drop_last=False``, is taken as False).

    Raises:
        TypeError: ``drop_last`` is neither a bool nor ``"ranks"``.
        ValueError: ``order.exact`` with ``drop_last=True``, which would drop each rank's
            last short batch.
    """
    checked: DropLast = "ranks" if drop_last == "ranks" else check_bool("drop_last", drop_last)
    if not order.exact:
        return checked
    if checked is True:
        raise ValueError(
            "OrderConfig(exact=True) delivers every unit once, and drop_last=True would drop "
            "each rank's last, short batch: give drop_last=False (a TokenLoader's and "
            "JaxLoader's default is True)"
        )
    return False


def rank_batches(
    samples: int,
    world_size: int,
    batch_size: int,
    drop_last: DropLast,
    *,
    exact: bool = False,
    rank: int = 0,
) -> int:
    """Batches one rank (with ``exact``, rank ``rank``) delivers in a full epoch of
    ``samples``."""
    units = rank_units(
        samples,
        world_size=world_size,
        batch_size=batch_size,
        drop_last=drop_last,
        exact=exact,
        rank=rank,
    )
    return -(-units // batch_size)


def rank_units(
    units: int,
    *,
    world_size: int,
    batch_size: int,
    drop_last: DropLast,
    exact: bool = False,
    rank: int = 0,
) -> int:
    """Units one rank delivers in a full epoch of ``units``: its share (padding included),
    less the last incomplete batch with ``drop_last=True``; with ``exact``, rank ``rank``'s
    share (:func:`~stoker.pipeline.order.exact_length`)."""
    if exact:
        return exact_length(units, rank=rank, world_size=world_size)
    n = share_length(units, world_size=world_size, drop_last=drops_ranks(drop_last))
    return n - n % batch_size if drop_last is True else n


def warn_if_small(units: int, *, world: World, batch_size: int, url: str) -> None:
    """Warn when an epoch split over ranks and loader workers cannot give each one full
    batch: ranks then run an epoch of almost nothing but a partial batch, and workers sit
    idle. (One rank with one worker just delivers its dataset's partial batch.)"""
    parts = world.world_size * world.num_workers
    wanted = parts * batch_size
    if parts > 1 and units < wanted and world.worker == 0:
        logger.warning(
            "%s has %d samples, fewer than world_size x num_workers x batch_size = "
            "%d x %d x %d = %d: some ranks or workers get no full batch in an epoch; use "
            "a smaller batch_size or fewer workers",
            url,
            units,
            world.world_size,
            world.num_workers,
            batch_size,
            wanted,
        )


def log_padding(plan: EpochPlan, epoch: int, world: World) -> None:
    """Say (from rank 0) how many samples the epoch repeats to even out the ranks."""
    if plan.epoch_padded and world.rank == 0 and world.worker == 0:
        logger.info(
            "epoch %d: %d sample(s) repeated to even out %d ranks",
            epoch,
            plan.epoch_padded,
            world.world_size,
        )


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """What one loader worker makes of its rank's share of an epoch.

    Attributes:
        batches: The rank's epoch cut into batches (every worker's), as sample ids.
        mine: Numbers of the batches this worker makes, in order, from the resume point.
        chunks: The samples of ``mine``'s batches in fetch order, cut into the pieces
            fetched at once: this worker's samples of one read group each, so a block is
            requested once per worker and epoch.
        padded: Samples the rank's share repeats to even out the ranks.
        epoch_padded: Samples the epoch repeats over all ranks (fewer than the ranks).
        exact: Every unit once over the ranks: each batch gets a ``real`` row mask.
    """

    batches: list[np.ndarray]
    mine: list[int]
    chunks: list[np.ndarray]
    padded: int = 0
    epoch_padded: int = 0
    exact: bool = False

    def wanted(self) -> list[np.ndarray]:
        """The sample ids of this worker's batches, in delivery order."""
        return [self.batches[b] for b in self.mine]


def plan_epoch(
    order: EpochOrder,
    *,
    world: World,
    batch_size: int,
    drop_last: DropLast,
    group_samples: int,
    position: int = 0,
    segments: Sequence[Segment] = (),
    exact: bool = False,
) -> EpochPlan:
    """This worker's batches of its rank's share of ``order``, from batch ``position`` on.

    Args:
        order: The epoch's global order.
        world: This rank and worker; worker ``w`` makes batches ``position + w``,
            ``position + w + num_workers``, ...
        batch_size: Samples per batch.
        drop_last: Drop a last, incomplete batch and even ranks out by dropping (True),
            or only even ranks out by dropping (``"ranks"``).
        group_samples: Samples per read group (the fetch unit of a single worker).
        position: Batches of the epoch already delivered.
        segments: Earlier parts of the epoch run on other world sizes; what they consumed
            is left out and the rest partitioned anew.
        exact: Every unit once over the ranks, nothing repeated or dropped (see
            :class:`~stoker.pipeline.order.OrderConfig`); ``drop_last`` must be False.
    """
    drop = drops_ranks(drop_last)
    exclude = consumed(order, segments, drop_last=drop, exact=exact) if segments else None
    share = assign(
        order,
        rank=world.rank,
        world_size=world.world_size,
        drop_last=drop,
        exclude=exclude,
        exact=exact,
    )
    samples = share.samples
    batches = [samples[b : b + batch_size] for b in range(0, len(samples), batch_size)]
    if drop_last is True and batches and len(batches[-1]) < batch_size:
        batches.pop()
    # Counted from the resume point: a DataLoader asks its workers in turn, worker 0 first,
    # so worker 0 must hold the next batch whatever the position is.
    mine = list(range(position + world.worker, len(batches), world.num_workers))
    # One chunk per read group, in the order the groups are first needed, of this worker's
    # samples only: each block (each disk-cache page) this worker needs is fetched once per
    # epoch, not once per batch that touches it (a group's samples are spread over several
    # batches, and with workers over several workers' batches).
    starts = np.arange(0, len(samples), batch_size)
    positions = [np.arange(starts[b], starts[b] + len(batches[b])) for b in mine]
    at = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)
    chunks = [
        piece[i : i + group_samples]
        for piece in _by_group(samples[at], share.groups[at])
        for i in range(0, len(piece), group_samples)
    ]
    return EpochPlan(batches, mine, chunks, share.padded, share.epoch_padded, exact)


@dataclass(frozen=True, slots=True)
class Partition:
    """How a Loader cuts each epoch: by its order settings (read group size, ``exact``),
    its place in the world, batch size and ``drop_last`` (see :func:`plan_epoch`)."""

    order: OrderConfig
    world: World
    batch_size: int
    drop_last: DropLast

    @property
    def exact(self) -> bool:
        """Every unit once over the ranks (:class:`~stoker.pipeline.order.OrderConfig`)."""
        return self.order.exact

    def plan(self, order: EpochOrder, position: int, segments: Sequence[Segment]) -> EpochPlan:
        """This worker's plan of ``order`` from batch ``position`` (see :func:`plan_epoch`)."""
        return plan_epoch(
            order,
            world=self.world,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            group_samples=self.order.group_samples,
            position=position,
            segments=segments,
            exact=self.exact,
        )

    def units(self, order: EpochOrder) -> int:
        """Units this rank delivers in a full epoch of ``order`` (see :func:`rank_units`)."""
        return rank_units(
            len(order.samples),
            world_size=self.world.world_size,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            exact=self.exact,
            rank=self.world.rank,
        )

    def batches(self, order: EpochOrder) -> int:
        """Batches this rank delivers in a full epoch of ``order``."""
        return -(-self.units(order) // self.batch_size)


def _by_group(stream: np.ndarray, groups: np.ndarray) -> list[np.ndarray]:
    """The samples of ``stream`` split by read group, in group order: ``assign`` numbers a
    share's groups in the order they are first needed."""
    if not len(stream):
        return []
    by_group = np.argsort(groups, kind="stable")
    cuts = np.flatnonzero(np.diff(groups[by_group])) + 1
    return np.split(stream[by_group], cuts)


def chunks_covering(chunks: list[np.ndarray], ids: np.ndarray) -> int:
    """How many leading chunks hold all of ``ids``."""
    wanted = {int(i) for i in ids}
    for count, chunk in enumerate(chunks, 1):
        wanted.difference_update(int(i) for i in chunk)
        if not wanted:
            return count
    return len(chunks)
