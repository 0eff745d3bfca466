"""The epochs of a scheduled mix: drawn step by step from each source's stream.

An epoch of a mix with ``stages`` (:class:`~stoker.pipeline.mixing.MixConfig`) is laid
out for the world it runs on: each of the ``world_size`` ranks gets a piece of whole
batches, and batch ``t`` of every piece draws what step ``epoch_step + t`` of the
:class:`~stoker.pipeline.mix_schedule.Schedule` says. Source ``k`` gives the epoch
``world_size * N_k`` units, the next ones of its stream (:mod:`.mix_streams`): rank ``r``
takes the ``r``-th run of ``N_k`` of them, in order. So after ``b`` batches every rank has
consumed the first ``c_k(b)`` units of its run of each source, the same count on every rank,
and where the whole mix stands is a few integers per source (:class:`Cut`).

When an epoch ends (``MixConfig`` rules, as for a mix without stages):

- ``replacement=False``: at the last step at which every source still gives units of its
  own current epoch (the *budget*): the epoch ends when the first source runs out. A source
  that begins the epoch with less than half of its own epoch left (or less than its first
  step takes on every rank) counts its next own epoch in its budget, its last units first:
  so an epoch holds about one own epoch of the source that runs out first, never a sliver.
  With ``epoch_size``, it also ends after ``ceil(epoch_size / (world_size * batch_size))``
  steps.
- ``replacement=True``: after ``ceil(epoch_size / (world_size * batch_size))`` steps
  (``epoch_size`` defaults to the sources' total); a source that runs out goes on with its
  next own epoch.

Sources go on from where they are at the next epoch: nothing is skipped. Ids are mixed ids
as in :mod:`.mixing`: ``offsets[k] + unit + j * total``, ``j`` counting the source's own
epochs from the one the epoch began in.

A resumed epoch (a state loaded into another mix or world, :mod:`.mix_resume`) is a
:class:`Part`: from the saved step on, each source gives first what its ranks had not
delivered (:meth:`~.mix_streams.Stream.cut`), then the rest of its stream. Its order begins
each rank's piece with the batches run before (:attr:`Plan.done`), which the Loader never
fetches, so that batch numbers and ``len()`` count the whole epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from stoker.pipeline.mix_schedule import Schedule, arrange
from stoker.pipeline.mix_streams import OwnOrder, Stream
from stoker.pipeline.mixing import MixConfig, SourceShare
from stoker.pipeline.order import EpochOrder

#: Steps asked of a schedule at once while looking for where an epoch ends: first, and at
#: most (doubling from one to the other).
_FIRST_STEPS = 64
_CHUNK_STEPS = 4096


@dataclass(frozen=True, slots=True)
class Cut:
    """A stretch of an epoch run on ``world_size`` ranks: each rank's run of a source held
    ``per_rank`` units, of which it delivered the first ``taken``."""

    world_size: int
    per_rank: int
    taken: int


@dataclass(frozen=True, slots=True)
class Part:
    """Where (the rest of) an epoch of a scheduled mix begins, source by source in the
    loader's order.

    Attributes:
        epoch: The epoch.
        epoch_step: The batch step the epoch began at.
        step: The batch step this part begins at.
        starts: Each source's stream as the epoch began.
        cuts: Each source's stretches of the epoch run before this part, in order.
        budgets: Each source's own epoch whose end ends the mixed epoch (None: not fixed
            yet; see the module docstring).
    """

    epoch: int
    epoch_step: int
    step: int
    starts: tuple[Stream, ...]
    cuts: tuple[tuple[Cut, ...], ...]
    budgets: tuple[int | None, ...]

    @classmethod
    def fresh(cls, sources: int, *, epoch: int = 0, step: int = 0) -> Part:
        """Every source at the beginning of its stream."""
        return cls(epoch, step, step, (Stream(),) * sources, ((),) * sources, (None,) * sources)

    def streams(self) -> list[Stream]:
        """Each source's stream as this part begins."""
        out = []
        for start, cuts in zip(self.starts, self.cuts, strict=True):
            for cut in cuts:
                start = start.cut(cut.world_size, cut.per_rank, cut.taken)
            out.append(start)
        return out


@dataclass(frozen=True, slots=True)
class Plan:
    """An epoch part's steps: ``counts[t, k]`` units of source ``k`` in each rank's batch
    ``t``, on ``world_size`` ranks of ``batch_size``."""

    part: Part
    counts: np.ndarray
    world_size: int
    batch_size: int
    cumulative: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Units of each source in each rank's first t batches, for t = 0 ... steps: a
        # state is asked for after every batch.
        first = np.zeros((1, self.counts.shape[1]), dtype=np.int64)
        object.__setattr__(self, "cumulative", np.concatenate([first, np.cumsum(self.counts, 0)]))

    @property
    def done(self) -> int:
        """Steps of the epoch run before this part (on whichever worlds)."""
        return self.part.step - self.part.epoch_step

    @property
    def per_rank(self) -> np.ndarray:
        """Units of each source in each rank's run."""
        return np.asarray(self.cumulative[-1], dtype=np.int64)

    def taken(self, batches: int) -> np.ndarray:
        """Units of each source each rank has delivered after ``batches`` batches."""
        return np.asarray(self.cumulative[min(batches, len(self.counts))], dtype=np.int64)

    def following(self) -> Part:
        """Where the next epoch begins."""
        part, drawn = self.part, self.world_size * self.per_rank
        starts = tuple(s.after(int(n)) for s, n in zip(part.streams(), drawn, strict=True))
        sources = len(starts)
        step = part.step + len(self.counts)
        return Part(part.epoch + 1, step, step, starts, ((),) * sources, (None,) * sources)


@dataclass(frozen=True, slots=True)
class Rules:
    """What a scheduled epoch is drawn by: the schedule, the world, the mix's end rules,
    and the sources' sizes and names (for messages)."""

    schedule: Schedule
    world_size: int
    mix: MixConfig
    sizes: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def step_units(self) -> int:
        """Units a step draws over all ranks."""
        return self.world_size * self.schedule.batch_size

    def epoch_steps(self) -> int | None:
        """Steps an epoch holds by ``epoch_size`` (None: no such bound)."""
        size = self.mix.epoch_size
        if size is None and self.mix.replacement:
            size = sum(self.sizes)
        return None if size is None else -(-size // self.step_units)


def budgets(part: Part, rules: Rules) -> tuple[int, ...]:
    """Each source's budget epoch (see the module docstring), fixed where the part leaves
    it open, from where the source stood and what the epoch's first step takes."""
    first = rules.schedule.counts(part.epoch_step, 1)[0] * rules.world_size
    out = []
    for k, (start, budget) in enumerate(zip(part.starts, part.budgets, strict=True)):
        size = rules.sizes[k]
        if budget is None and size:
            # The first own epoch that, with what is owed before it, holds enough; at most
            # the one after the epoch the stream goes on in.
            enough, budget = max(int(first[k]), -(-size // 2), 1), start.first // size
            while start.count_below((budget + 1) * size) < enough and budget <= start.next // size:
                budget += 1
        out.append(budget or 0)
    return tuple(out)


def plan(part: Part, rules: Rules) -> Plan:
    """The steps of the epoch part that begins at ``part``.

    Raises:
        ValueError: Without replacement, a source's budget cannot give the epoch's first
            step (an empty source with weight, or one smaller than what a step takes of it
            on every rank): named, with the way on.
    """
    done = part.step - part.epoch_step
    bound = rules.epoch_steps()
    left = None if bound is None else max(0, bound - done)
    if rules.mix.replacement:
        counts = rules.schedule.counts(part.step, left or 0)
        for k, drawn in enumerate(counts.sum(axis=0).tolist()):
            if drawn and not rules.sizes[k]:
                raise ValueError(f"source {k} ({rules.names[k]}) is empty but has weight")
        return Plan(part, counts, rules.world_size, rules.schedule.batch_size)
    streams = part.streams()
    ends = budgets(part, rules)
    sizes = np.asarray(rules.sizes, dtype=np.int64)
    available = np.asarray(
        [
            s.count_below((int(e) + 1) * int(n))
            for s, e, n in zip(streams, ends, sizes, strict=True)
        ],
        dtype=np.int64,
    )
    pieces: list[np.ndarray] = []
    used = np.zeros(len(sizes), dtype=np.int64)
    steps = 0
    ask = _FIRST_STEPS
    while left is None or steps < left:
        chunk = rules.schedule.counts(part.step + steps, ask)
        ask = min(2 * ask, _CHUNK_STEPS)
        running = used + np.cumsum(chunk, axis=0) * rules.world_size
        fits = (running <= available).all(axis=1)
        stop = int(np.argmin(fits)) if not fits.all() else len(chunk)
        if left is not None:
            stop = min(stop, left - steps)
        pieces.append(chunk[:stop])
        steps += stop
        if stop < len(chunk):
            if steps == 0 and not any(part.cuts):
                _refuse(chunk[0], available, rules)
            break
        used = running[-1]
    counts = np.concatenate(pieces) if pieces else np.zeros((0, len(sizes)), np.int64)
    return Plan(replace(part, budgets=ends), counts, rules.world_size, rules.schedule.batch_size)


def _refuse(first: np.ndarray, available: np.ndarray, rules: Rules) -> None:
    """Raise for the first source whose budget cannot give what the first step takes."""
    for k, (want, have) in enumerate(zip(first * rules.world_size, available, strict=True)):
        if want > have:
            raise ValueError(
                f"source {k} ({rules.names[k]}) holds {rules.sizes[k]} units, but one step "
                f"takes {int(want)} of it ({int(first[k])} a batch on {rules.world_size} "
                "ranks): use replacement=True, or fewer ranks or a smaller batch"
            )


def order(
    plan: Plan, orders: Sequence[OwnOrder], offsets: np.ndarray, group_units: int
) -> tuple[EpochOrder, tuple[SourceShare, ...]]:
    """The epoch part's order over mixed ids, and what each source gives it.

    Each rank's piece begins with the batches the epoch ran before this part
    (:attr:`Plan.done`), which a Loader that goes on from batch ``done`` never fetches: they
    hold copies of the piece's first unit, so that batch numbers, ``len()`` and states count
    the whole epoch.

    Args:
        plan: The part's steps.
        orders: Each source's own epochs.
        offsets: First mixed id of each source, then the total.
        group_units: Units a read group aims for: a group is whole batches of one rank.
    """
    counts, world, batch = plan.counts, plan.world_size, plan.batch_size
    steps, per_rank = len(counts), plan.per_rank
    ids, shares = _drawn(plan, orders, offsets)
    source, unit = arrange(counts)
    firsts = np.concatenate([[0], np.cumsum([len(i) for i in ids])[:-1]]).astype(np.int64)
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    pieces = [flat[firsts[source] + r * per_rank[source] + unit] for r in range(world)]
    filler = next((int(p[0]) for p in pieces if len(p)), 0)
    head = plan.done * batch
    samples = np.concatenate(
        [np.concatenate([np.full(head, p[0] if len(p) else filler), p]) for p in pieces]
    ).astype(np.int64)
    group_steps = max(1, group_units // max(batch, 1))
    length = head + steps * batch
    starts = {r * length for r in range(world)} | {len(samples)}
    starts |= {
        r * length + head + t * batch for r in range(world) for t in range(0, steps, group_steps)
    }
    bounds = np.asarray(sorted(starts), dtype=np.int64)
    largest = _largest_group(counts, group_steps)
    shares = [replace(s, group_samples=int(g)) for s, g in zip(shares, largest, strict=True)]
    return EpochOrder(samples, bounds), tuple(shares)


def _drawn(
    plan: Plan, orders: Sequence[OwnOrder], offsets: np.ndarray
) -> tuple[list[np.ndarray], list[SourceShare]]:
    """Each source's units of the part, as mixed ids in the order the ranks' runs take
    them, and its share."""
    world, per_rank = plan.world_size, plan.per_rank
    grand = max(int(offsets[-1]), 1)
    total = world * int(per_rank.sum())
    ids, shares = [], []
    for k, (stream, own) in enumerate(zip(plan.part.streams(), orders, strict=True)):
        positions = stream.take(world * int(per_rank[k]))
        first = plan.part.starts[k].first // own.size if own.size else 0
        repeat = positions // own.size - first if own.size else positions
        ids.append(offsets[k] + own.units(positions) + repeat * grand)
        share = len(positions) / total if total else 0.0
        shares.append(SourceShare(k, len(positions), own.size, share, len(np.unique(repeat)), 0))
    return ids, shares


def _largest_group(counts: np.ndarray, group_steps: int) -> np.ndarray:
    if not len(counts):
        return np.zeros(counts.shape[1], dtype=np.int64)
    sums = np.add.reduceat(counts, np.arange(0, len(counts), group_steps), axis=0)
    return np.asarray(sums.max(axis=0), dtype=np.int64)
