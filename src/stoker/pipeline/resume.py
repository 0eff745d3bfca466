"""Resuming a Loader: where a run saved by :meth:`stoker.Loader.state_dict` goes on, the
state's fields each checked and named in errors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.core.checks import check_int, shown
from stoker.pipeline.order import EpochOrder, Segment, consumed
from stoker.pipeline.plan import DropLast, drops_ranks, rank_batches

#: The keys of a Loader's state (:meth:`stoker.Loader.state_dict`); older states may lack
#: ``segments`` and ``skipped`` (the epoch's samples skipped so far, see ``DecodeConfig``),
#: and only a mix's has ``mix`` (each source's place, :mod:`stoker.pipeline.mix_resume`).
STATE_KEYS = ("epoch", "batches", "batch_size", "seed", "world_size", "segments", "skipped", "mix")
#: The keys every state has.
_REQUIRED_KEYS = STATE_KEYS[:-3]


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a restored run goes on: its epoch, the batches of it already delivered on this
    world size, and the parts of it run on earlier world sizes (with the fields of the
    state each came from, to name them in errors)."""

    epoch: int
    position: int
    segments: list[Segment]
    origins: tuple[tuple[str, str], ...] = ()


def resume_point(
    state: Mapping[str, Any],
    *,
    seed: int,
    batch_size: int,
    world_size: int,
    orders: Callable[[int], EpochOrder] | None = None,
    drop_last: DropLast = False,
    exact: bool = False,
) -> ResumePoint:
    """Where to continue a run saved as ``state`` (see :meth:`stoker.Loader.state_dict`).

    With the same world size, the next batch is the one after the last delivered. With a
    different one, what the old ranks consumed becomes a segment: it is left out of the
    epoch and the rest is partitioned over the new ranks.

    Args:
        state: The saved state.
        seed: The loader's seed.
        batch_size: The loader's batch size.
        world_size: The loader's ranks.
        orders: The order of an epoch, by number: given, the state must also fit in the
            epoch it resumes (no more batches than it has, no segment consuming more than
            was left of it, no segment of more ranks than its samples).
        drop_last: The loader's, for that check.
        exact: The loader's ``OrderConfig.exact``, for that check: ranks' shares differ by
            at most one, and ``batches`` counts those of the rank with the most (a rank whose
            share is shorter has delivered all of it by then).

    Raises:
        TypeError: ``state`` is not a mapping, or a field is not an int (or, for
            ``segments``, a list of ``[world_size, samples]`` pairs).
        ValueError: A key missing or unknown, a number out of range or not fitting the
            epoch, or another seed or batch size; the message names the field.
    """
    fields, segments = _read_state(state)
    for name, mine in (("seed", seed), ("batch_size", batch_size)):
        if fields[name] != mine:
            raise ValueError(
                f"state[{name!r}] is {shown(fields[name])}, but this loader's is {mine}"
            )
    epoch, batches, saved_world = fields["epoch"], fields["batches"], fields["world_size"]
    if saved_world == world_size and not segments:
        point = ResumePoint(epoch, batches, [])
    else:
        done = Segment(saved_world, batches * batch_size)
        origins = [
            (f"state['segments'][{i}][0]", f"state['segments'][{i}][1]")
            for i in range(len(segments))
        ]
        origins.append(("state['world_size']", f"state['batches'] ({batches} of {batch_size})"))
        point = ResumePoint(epoch, 0, [*segments, done], tuple(origins))
    if orders is not None:
        _check_fits(point, orders(epoch), world_size, batch_size, drop_last, exact)
    return point


def _read_state(state: object) -> tuple[dict[str, int], list[Segment]]:
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping from Loader.state_dict(), got {shown(state)}")
    unknown = [key for key in state if key not in STATE_KEYS]
    missing = [key for key in _REQUIRED_KEYS if key not in state]
    if unknown or missing:
        wrong = f"unknown keys {shown(unknown)}" if unknown else f"no {shown(missing)}"
        raise ValueError(f"state has {wrong}: a Loader's state has the keys {list(STATE_KEYS)}")
    fields = {
        key: check_int(f"state[{key!r}]", state[key], minimum=int(key in _AT_LEAST_ONE))
        for key in _REQUIRED_KEYS
    }
    if "skipped" in state:
        check_int("state['skipped']", state["skipped"], minimum=0)
    if state.get("mix") is not None and not isinstance(state["mix"], Mapping):
        raise TypeError(f"state['mix'] must be a mapping, got {shown(state['mix'])}")
    raw = state.get("segments", [])
    if not isinstance(raw, list | tuple):
        raise TypeError(f"state['segments'] must be a list of pairs, got {shown(raw)}")
    segments = []
    for i, pair in enumerate(raw):
        name = f"state['segments'][{i}]"
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise TypeError(f"{name} must be a [world_size, samples] pair, got {shown(pair)}")
        segments.append(
            Segment(
                check_int(f"{name}[0]", pair[0], minimum=1),
                check_int(f"{name}[1]", pair[1], minimum=0),
            )
        )
    return fields, segments


_AT_LEAST_ONE = ("batch_size", "world_size")


def _check_fits(
    point: ResumePoint,
    order: EpochOrder,
    world_size: int,
    batch_size: int,
    drop_last: DropLast,
    exact: bool,
) -> None:
    """Refuse a resume point that consumed more of ``order`` than it holds (rank 0 has the
    longest share, ``exact`` or not)."""
    total = len(order.samples)
    where = f"epoch {point.epoch} has {total} samples"
    if not point.segments:
        most = rank_batches(total, world_size, batch_size, drop_last, exact=exact)
        if point.position > most:
            raise ValueError(
                f"state['batches'] is {point.position}, but {where}: {most} batches of "
                f"{batch_size} per rank on world_size {world_size}"
            )
        return
    seen = np.zeros(0, dtype=np.int64)
    for segment, (ranks_field, samples_field) in zip(point.segments, point.origins, strict=True):
        if segment.world_size > max(total, world_size) and not exact:  # exact: ranks get 0
            raise ValueError(
                f"{ranks_field} is {shown(segment.world_size)}: more ranks than {where}"
            )
        left = total - len(seen)
        most = rank_batches(left, segment.world_size, batch_size, drop_last, exact=exact)
        most *= batch_size
        if segment.consumed > most:
            raise ValueError(
                f"{samples_field} says each of {segment.world_size} ranks consumed "
                f"{segment.consumed} samples, but {where} and {left} were left: at most {most}"
            )
        if segment.consumed:
            drop = drops_ranks(drop_last)
            seen = consumed(order, [segment], drop_last=drop, seen=seen, exact=exact)
