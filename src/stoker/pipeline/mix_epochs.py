"""Which order each epoch of a mix takes, and the mix's entry in a Loader's state.

A mix without stages takes :func:`~stoker.pipeline.mixing.mixed_epoch_order` every epoch,
as it always has. A mix with stages draws each epoch step by step from its sources'
streams (:mod:`.mix_positions`), from the run's beginning or from where a resumed state
put it (a positions entry: every later epoch goes on from there). Across the two kinds:

- a positions entry (saved from a mix with stages) resumed into a mix without stages: the
  rest of that epoch is drawn from each source's place at the loader's weights, then the
  loader's own epochs follow;
- a static entry (a mix without stages, saved inside an epoch) resumed into another mix:
  that epoch finishes under the mix it was saved with, rebuilt from the entry; a mix with
  stages then begins the next epoch with every source at the start of its stream (a mix
  without stages keeps no place in its sources from one epoch to the next).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.pipeline import mix_positions
from stoker.pipeline.mix_positions import Part, Plan, Rules
from stoker.pipeline.mix_resume import (
    Member,
    check_entry,
    is_static,
    positions_entry,
    read_part,
    same_static,
    static_entry,
    static_order,
)
from stoker.pipeline.mix_schedule import Schedule
from stoker.pipeline.mix_streams import OwnOrder
from stoker.pipeline.mixing import MixConfig, MixedOrder, source_counts
from stoker.pipeline.order import OrderConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Resumed:
    """What taking up a state's ``"mix"`` entry did: the mix's orders may have changed; with
    a ``position``, the epoch goes on at that batch (the rest of it drawn from where the
    state left each source, whatever the world size), else at the state's batches."""

    position: int | None = None


class MixEpochs:
    """The orders of a mix's epochs, and its place in a Loader's state.

    Args:
        members: The sources, as a state names them.
        unit_bytes: Each source's mean bytes a unit (sizes its own order's groups).
        mix: The loader's mix.
        static: The order of an epoch of ``mix`` without stages.
    """

    def __init__(
        self,
        members: Sequence[Member],
        unit_bytes: Sequence[float],
        mix: MixConfig,
        static: Callable[[OrderConfig, int], MixedOrder],
    ) -> None:
        self.members = list(members)
        self.unit_bytes = list(unit_bytes)
        self.mix = mix
        self._static = static
        if mix.scheduled:
            urls = [m.url for m in members]
            twice = sorted({u for u in urls if urls.count(u) > 1})
            if twice:
                raise ValueError(
                    f"a mix with stages knows its sources by URL: {twice} listed twice"
                )
        sizes = [m.units for m in members]
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self.world_size: int | None = None
        self.batch_size: int | None = None
        self._anchor: Part | None = None  # with stages: where epochs are drawn from
        self._rest: Part | None = None  # without: one epoch drawn by positions (resumed)
        self._earlier: tuple[int, Mapping[str, Any], MixedOrder] | None = None
        self._plans: dict[tuple[OrderConfig, int], Plan] = {}
        self._parts: dict[tuple[OrderConfig, int], Part] = {}
        self._schedules: dict[OrderConfig, Schedule] = {}
        self._orders: dict[OrderConfig, list[OwnOrder]] = {}

    def bind(self, world_size: int, batch_size: int) -> None:
        """Plan epochs for ``world_size`` ranks of ``batch_size`` batches."""
        self.world_size, self.batch_size = world_size, batch_size
        self._forget()

    def _forget(self) -> None:
        self._plans.clear()
        self._parts.clear()
        self._schedules.clear()

    def drawn(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` is drawn by positions."""
        if self._earlier is not None and self._earlier[0] == epoch:
            return False
        return self.mix.scheduled or (self._rest is not None and self._rest.epoch == epoch)

    def mixed_order(self, config: OrderConfig, epoch: int) -> MixedOrder:
        """Epoch ``epoch``'s order with each source's share."""
        if self._earlier is not None and self._earlier[0] == epoch:
            return self._earlier[2]
        if not self.drawn(epoch):
            return self._static(config, epoch)
        order, shares = mix_positions.order(
            self.plan(config, epoch), self._own(config), self.offsets, config.group_samples
        )
        return MixedOrder(order, shares, self.offsets)

    def plan(self, config: OrderConfig, epoch: int) -> Plan:
        """The steps of epoch ``epoch`` (drawn by positions)."""
        found = self._plans.get((config, epoch))
        if found is None:
            rules = self._rules(config)
            rest = self._rest
            in_rest = rest is not None and rest.epoch == epoch
            part = rest if rest is not None and in_rest else self._part(config, rules, epoch)
            found = self._plans[(config, epoch)] = mix_positions.plan(part, rules)
            if len(self._plans) > 4:
                self._plans.pop(next(iter(self._plans)))
        return found

    def _part(self, config: OrderConfig, rules: Rules, epoch: int) -> Part:
        """Where epoch ``epoch`` begins, drawn on from the anchor (or the run's start)."""
        anchor = self._anchor
        if anchor is None or anchor.epoch > epoch:
            anchor = Part.fresh(len(self.members))
        part = anchor
        for e in range(epoch, anchor.epoch, -1):
            if (config, e) in self._parts:
                part = self._parts[(config, e)]
                break
        while part.epoch < epoch:
            part = mix_positions.plan(part, rules).following()
            self._parts[(config, part.epoch)] = part
        return part

    def _rules(self, config: OrderConfig) -> Rules:
        if self.world_size is None or self.batch_size is None:
            raise ValueError(
                "a mix with stages draws its epochs batch step by batch step on each rank: "
                "its Loader tells it the world size and batch size (bind_mix)"
            )
        mix = self.mix if self.mix.scheduled else _as_weights(self.mix)
        schedule = self._schedules.get(config)
        if schedule is None:
            schedule = Schedule(
                mix.weights or (), mix.stages, batch_size=self.batch_size, seed=config.seed_value
            )
            self._schedules[config] = schedule
        sizes = tuple(m.units for m in self.members)
        names = tuple(m.url for m in self.members)
        return Rules(schedule, self.world_size, mix, sizes, names)

    def _own(self, config: OrderConfig) -> list[OwnOrder]:
        found = self._orders.get(config)
        if found is None:
            found = self._orders[config] = [
                OwnOrder(m.shard_sizes, config, url=m.url, block_size=m.block_size, unit_bytes=b)
                for m, b in zip(self.members, self.unit_bytes, strict=True)
            ]
        return found

    # -- state -----------------------------------------------------------------------------

    def state_entry(
        self, config: OrderConfig, epoch: int, batches: int, resumed_part: bool
    ) -> dict[str, Any] | None:
        """The ``"mix"`` entry of a state at batch ``batches`` of epoch ``epoch`` (with
        ``resumed_part``: earlier world sizes ran part of it); None where the state's other
        fields say it all (the start of an epoch of a mix without stages)."""
        inside = bool(batches) or resumed_part
        if self._earlier is not None and self._earlier[0] == epoch:
            return dict(self._earlier[1]) if inside else None
        if self.drawn(epoch):  # even at its start: where it begins depends on the world
            plan = self.plan(config, epoch)
            return positions_entry(plan, max(0, batches - plan.done), self.members)
        if not inside:
            return None
        total = sum(source_counts([m.units for m in self.members], self.mix))
        per_rank = -(-total // (self.world_size or 1))
        return static_entry(self.mix, self.members, -(-per_rank // (self.batch_size or 1)))

    def resume(self, state: Mapping[str, Any], config: OrderConfig) -> Resumed | None:
        """Take up the ``"mix"`` entry of ``state`` (see the module docstring): what it does
        to the loader's epoch, or None where it does nothing.

        Raises:
            TypeError, ValueError: An entry that cannot be honoured (see
                :mod:`.mix_resume`), or, for a mix with stages, a state from another world
                size without an entry.
        """
        entry, epoch = state.get("mix"), int(state["epoch"])
        if entry is None:
            moved = state["world_size"] != self.world_size or bool(state.get("segments"))
            if self.mix.scheduled and self.world_size is not None and moved:
                raise ValueError(
                    "a mix with stages resumes onto another world size from its state's "
                    "'mix' entry, and this state has none"
                )
            return None
        entry = check_entry(entry)
        # Everything is read and checked before anything changes: a refused state leaves
        # the loader as it was.
        earlier: tuple[int, Mapping[str, Any], MixedOrder] | None = None
        anchor, rest, position = self._anchor, None, None
        if not is_static(entry):
            part = read_part(entry, epoch=epoch, members=self.members)
            anchor, rest = (part, None) if self.mix.scheduled else (anchor, part)
            position = part.step - part.epoch_step
        elif self.mix.scheduled or not same_static(entry, self.mix, self.members):
            order = static_order(entry, epoch=epoch, members=self.members, config=config)
            earlier = (epoch, dict(entry), order)
            if self.mix.scheduled:
                step = (epoch + 1) * int(entry.get("epoch_steps") or 0)
                anchor = Part.fresh(len(self.members), epoch=epoch + 1, step=step)
            logger.info(
                "the state's epoch %d was saved under another mix: it finishes as it began, "
                "and this loader's mix takes over from epoch %d",
                epoch,
                epoch + 1,
            )
        self._forget()
        self._anchor, self._rest, self._earlier = anchor, rest, earlier
        return Resumed(position)


def _as_weights(mix: MixConfig) -> MixConfig:
    """A mix without stages as one drawn by positions at its weights (counts as weights,
    an epoch of their sum)."""
    if mix.weights is not None:
        return mix
    counts = tuple(float(c) for c in mix.samples_per_epoch or ())
    return MixConfig(weights=counts, epoch_size=int(sum(counts)), replacement=mix.replacement)
