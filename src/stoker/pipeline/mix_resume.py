"""A mix's place in a Loader's state (its ``"mix"`` entry), and resuming it into a Loader
with other weights, stages or sources.

Sources are known by their URL (and checked by their number of units), so a Loader with
sources added, removed or listed in another order finds each one's place. Two kinds of
entry:

- **Positions** (a mix with ``stages``, or the rest of an epoch resumed into one): where each
  source's stream stood when the epoch began (``next``, ``owed``), the stretches of the
  epoch run since (``cuts``: ranks, units of the source each rank's run held, units each
  delivered), the epoch's budget and the batch steps (:mod:`.mix_positions`). A few
  integers per source, whatever the world size.
- **Static** (a mix without stages, saved inside an epoch): the mix itself (its weights or
  counts and each source's URL, size and block size), from which a Loader with another mix
  rebuilds that epoch's order, finishes it as it was, and goes on with its own mix from the
  next epoch.

A source of the state that the Loader no longer has is dropped (logged: its place is gone);
a source the state does not have starts at the beginning of its stream. Refused, naming
the source: one whose number of units changed, and, for a static entry, one that the
interrupted epoch draws from but the Loader no longer has (the others' places in that
epoch follow from its order).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from stoker.core.checks import check_int, shown
from stoker.pipeline.mix_positions import Cut, Part, Plan
from stoker.pipeline.mix_streams import Stream
from stoker.pipeline.mixing import (
    MixConfig,
    MixedOrder,
    SourceShare,
    locate,
    mixed_epoch_order,
    source_counts,
)
from stoker.pipeline.order import OrderConfig

logger = logging.getLogger(__name__)

_ENTRY = "state['mix']"


@dataclass(frozen=True, slots=True)
class Member:
    """A source of a Loader's mix, as a state names it."""

    url: str
    units: int
    shard_sizes: tuple[int, ...]
    block_size: int


def static_entry(mix: MixConfig, members: Sequence[Member], epoch_steps: int) -> dict[str, Any]:
    """The entry of a mix without stages: the mix, its sources and its batches an epoch."""
    return {
        "static": {
            "weights": None if mix.weights is None else list(mix.weights),
            "samples_per_epoch": None
            if mix.samples_per_epoch is None
            else list(mix.samples_per_epoch),
            "epoch_size": mix.epoch_size,
            "replacement": mix.replacement,
        },
        "sources": [{"url": m.url, "units": m.units, "block_size": m.block_size} for m in members],
        "epoch_steps": epoch_steps,
    }


def positions_entry(plan: Plan, batches: int, members: Sequence[Member]) -> dict[str, Any]:
    """The entry of a scheduled epoch part after each rank delivered ``batches`` batches."""
    part, per_rank, taken = plan.part, plan.per_rank, plan.taken(batches)
    inside = bool(batches) or any(part.cuts)  # at an epoch's start its budgets are open
    sources = []
    for k, member in enumerate(members):
        cuts = [[c.world_size, c.per_rank, c.taken] for c in part.cuts[k]]
        if batches:
            cuts.append([plan.world_size, int(per_rank[k]), int(taken[k])])
        start = part.starts[k]
        sources.append(
            {
                "url": member.url,
                "units": member.units,
                "next": start.next,
                "owed": [list(s) for s in start.owed],
                "budget": part.budgets[k] if inside else None,
                "cuts": cuts,
            }
        )
    return {"step": part.step + batches, "epoch_step": part.epoch_step, "sources": sources}


def is_static(entry: Mapping[str, Any]) -> bool:
    """Whether ``entry`` is a static one (else positions)."""
    return "static" in entry


def check_entry(entry: object) -> Mapping[str, Any]:
    """``entry`` if it is a mapping with a list of ``sources``.

    Raises:
        TypeError: It is not.
    """
    if not isinstance(entry, Mapping) or not isinstance(entry.get("sources"), list | tuple):
        raise TypeError(f"{_ENTRY} must be a mapping with a list of sources, got {shown(entry)}")
    return entry


def same_static(entry: Mapping[str, Any], mix: MixConfig, members: Sequence[Member]) -> bool:
    """Whether a static ``entry`` is the mix the loader has (same sources, same order)."""
    mine = static_entry(mix, members, 0)
    return dict(entry) == {**mine, "epoch_steps": entry.get("epoch_steps")}


def read_part(entry: Mapping[str, Any], *, epoch: int, members: Sequence[Member]) -> Part:
    """The epoch part a positions ``entry`` resumes, for the loader's ``members``.

    Raises:
        TypeError, ValueError: A field of the wrong type or out of range, a source listed
            twice, or one whose number of units changed (named).
    """
    step = check_int(f"{_ENTRY}['step']", entry.get("step"), minimum=0)
    epoch_step = check_int(f"{_ENTRY}['epoch_step']", entry.get("epoch_step"), minimum=0)
    if epoch_step > step:
        raise ValueError(f"{_ENTRY}: epoch_step {epoch_step} is past step {step}")
    saved = _by_url(entry["sources"], members)
    starts: list[Stream] = []
    cuts: list[tuple[Cut, ...]] = []
    budgets: list[int | None] = []
    for member in members:
        found = saved.get(member.url)
        if found is None:
            logger.info(
                "mix source %s is new: it starts at the beginning of its stream", member.url
            )
            starts.append(Stream())
            cuts.append(())
            budgets.append(None)
            continue
        name, fields = found
        starts.append(_stream(name, fields))
        cuts.append(_cuts(name, fields.get("cuts", [])))
        budget = fields.get("budget")
        budgets.append(
            None if budget is None else check_int(f"{name}['budget']", budget, minimum=0)
        )
    return Part(epoch, epoch_step, step, tuple(starts), tuple(cuts), tuple(budgets))


def _by_url(
    sources: Sequence[object], members: Sequence[Member]
) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """The state's sources by URL, each checked against the loader's; the ones the loader
    no longer has logged and left out."""
    units = {m.url: m.units for m in members}
    found: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for i, fields in enumerate(sources):
        name = f"{_ENTRY}['sources'][{i}]"
        if not isinstance(fields, Mapping) or not isinstance(fields.get("url"), str):
            raise TypeError(f"{name} must be a mapping with a url, got {shown(fields)}")
        url = fields["url"]
        if url in found:
            raise ValueError(f"{name}: {url} is listed twice")
        saved = check_int(f"{name}['units']", fields.get("units"), minimum=0)
        if url not in units:
            logger.warning(
                "mix source %s is no longer in the mix: its place in its stream is dropped "
                "(were it added back, it would start again from the beginning)",
                url,
            )
            continue
        if saved != units[url]:
            raise ValueError(
                f"mix source {url} held {saved} units when the state was saved and holds "
                f"{units[url]} now: its place no longer names the same units (a new dataset "
                "at the same URL needs a new URL, or a fresh start)"
            )
        found[url] = (name, fields)
    return found


def _stream(name: str, fields: Mapping[str, Any]) -> Stream:
    start = check_int(f"{name}['next']", fields.get("next"), minimum=0)
    owed = fields.get("owed", [])
    if not isinstance(owed, list | tuple):
        raise TypeError(f"{name}['owed'] must be a list of [start, stop] pairs, got {shown(owed)}")
    pairs = []
    for j, pair in enumerate(owed):
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise TypeError(f"{name}['owed'][{j}] must be a [start, stop] pair, got {shown(pair)}")
        a = check_int(f"{name}['owed'][{j}][0]", pair[0], minimum=0)
        pairs.append((a, check_int(f"{name}['owed'][{j}][1]", pair[1], minimum=a + 1)))
    return Stream(tuple(pairs), start)


def _cuts(name: str, cuts: object) -> tuple[Cut, ...]:
    if not isinstance(cuts, list | tuple):
        raise TypeError(
            f"{name}['cuts'] must be a list of [ranks, units, taken], got {shown(cuts)}"
        )
    out = []
    for j, cut in enumerate(cuts):
        where = f"{name}['cuts'][{j}]"
        if not isinstance(cut, list | tuple) or len(cut) != 3:
            raise TypeError(f"{where} must be [ranks, units, taken], got {shown(cut)}")
        ranks = check_int(f"{where}[0]", cut[0], minimum=1)
        per_rank = check_int(f"{where}[1]", cut[1], minimum=0)
        taken = check_int(f"{where}[2]", cut[2], minimum=0)
        if taken > per_rank:
            raise ValueError(f"{where}: taken {taken} is more than the {per_rank} units a rank had")
        out.append(Cut(ranks, per_rank, taken))
    return tuple(out)


def static_order(
    entry: Mapping[str, Any],
    *,
    epoch: int,
    members: Sequence[Member],
    config: OrderConfig,
) -> MixedOrder:
    """Epoch ``epoch`` of the mix without stages a static ``entry`` was saved with, over the
    loader's sources (their mixed ids and indices).

    Raises:
        ValueError: A source that epoch draws from is not in the loader, or its number of
            units changed (named); the entry's mix is not a valid one.
    """
    fields = entry["static"]
    if not isinstance(fields, Mapping):
        raise TypeError(f"{_ENTRY}['static'] must be a mapping, got {shown(fields)}")
    mix = MixConfig(
        **{k: fields.get(k) for k in ("weights", "samples_per_epoch", "epoch_size")},
        replacement=bool(fields.get("replacement", False)),
    )
    saved = [_static_source(j, s) for j, s in enumerate(entry["sources"])]
    index = {m.url: k for k, m in enumerate(members)}
    for urls in ([m.url for m in members], [url for url, _, _ in saved]):
        twice = sorted({u for u in urls if urls.count(u) > 1})
        if twice:
            raise ValueError(f"mix sources {twice} are listed twice: their places are ambiguous")
    counts = source_counts([units for _, units, _ in saved], mix)
    layouts, orders, where = [], [], []
    for j, (url, units, block_size) in enumerate(saved):
        k = index.get(url)
        if k is not None and members[k].units != units:
            raise ValueError(
                f"mix source {url} held {units} units when the state was saved and holds "
                f"{members[k].units} now: its place no longer names the same units"
            )
        if k is None and counts[j]:
            raise ValueError(
                f"mix source {url} gives {counts[j]} units to epoch {epoch}, in the middle of "
                "which the state was saved, and is no longer in the mix: the other sources' "
                "places in that epoch follow from its order. List it again (the new mix "
                "takes over from the next epoch), or resume from a state saved at an "
                "epoch's start"
            )
        layouts.append(list(members[k].shard_sizes) if k is not None else [units])
        orders.append(replace(config, block_size=block_size))
        where.append(-1 if k is None else k)
    old = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=epoch)
    return _remapped(old, np.asarray(where, dtype=np.int64), members)


def _static_source(j: int, fields: object) -> tuple[str, int, int]:
    """A static entry's source ``j``: its URL, units and block size, checked."""
    name = f"{_ENTRY}['sources'][{j}]"
    if not isinstance(fields, Mapping) or not isinstance(fields.get("url"), str):
        raise TypeError(f"{name} must be a mapping with a url, got {shown(fields)}")
    units = check_int(f"{name}['units']", fields.get("units"), minimum=0)
    return (
        fields["url"],
        units,
        check_int(f"{name}['block_size']", fields.get("block_size"), minimum=1),
    )


def _remapped(old: MixedOrder, where: np.ndarray, members: Sequence[Member]) -> MixedOrder:
    """``old``'s order with its ids made the loader's (source ``j`` is ``where[j]``)."""
    sizes = [m.units for m in members]
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
    samples = old.order.samples
    grand, new_grand = max(int(old.offsets[-1]), 1), max(int(offsets[-1]), 1)
    sources, local = locate(samples, old.offsets)
    repeat = samples // grand
    ids = offsets[where[sources]] + local + repeat * new_grand
    shares = [SourceShare(k, 0, size, 0.0, 0, 0) for k, size in enumerate(sizes)]
    for j, share in enumerate(old.shares):
        if where[j] >= 0:
            shares[int(where[j])] = replace(share, source=int(where[j]))
    order = replace(old.order, samples=ids.astype(np.int64))
    return MixedOrder(order, tuple(shares), offsets)
