"""Where a Loader goes on from a saved state: its fields checked, a mix's entry taken up
(:func:`~stoker.pipeline.mixed_source.resume_mix`), then the point in the epoch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from stoker.pipeline.mixed_source import resume_mix
from stoker.pipeline.order import EpochOrder
from stoker.pipeline.plan import Partition
from stoker.pipeline.resume import ResumePoint, resume_point
from stoker.pipeline.source import Source


def resume_at(
    source: Source,
    state: Mapping[str, Any],
    partition: Partition,
    orders: Callable[[int], EpochOrder],
    replanned: Callable[[], None],
) -> ResumePoint:
    """Where a Loader reading ``source`` with ``partition`` goes on from ``state``.

    The state's fields are checked first (:func:`~stoker.pipeline.resume.resume_point`);
    then a mix takes up the state's ``"mix"`` entry, and ``replanned`` is called if that
    changed the source's orders (nothing planned ahead holds). A mix that goes on by its
    sources' places says at which batch of the epoch; otherwise the state's batches and
    segments place the loader in the epoch's order, as for any source.

    Raises:
        TypeError, ValueError: See :func:`~stoker.pipeline.resume.resume_point` and
            :func:`~stoker.pipeline.mixed_source.resume_mix`.
    """
    config = partition.order
    seed, batch_size, world_size = (
        config.seed_value,
        partition.batch_size,
        partition.world.world_size,
    )
    resume_point(state, seed=seed, batch_size=batch_size, world_size=world_size)
    moved = resume_mix(source, state, config)
    if moved is not None:
        replanned()
        if moved.position is not None:  # by each source's place, on any world size
            return ResumePoint(int(state["epoch"]), moved.position, [])
    return resume_point(
        state,
        seed=seed,
        batch_size=batch_size,
        world_size=world_size,
        orders=orders,
        drop_last=partition.drop_last,
        exact=config.exact,
    )
