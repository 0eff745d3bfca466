"""Cutting the input into shards before anything is read: a pure function of its listing."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stoker.format.foreign.base import SampleRef

# Tar headers and padding a sample adds to its input bytes (two members on average).
SAMPLE_OVERHEAD_BYTES = 1536


@dataclass(frozen=True, slots=True)
class PackPlan:
    """Which input samples go into which shard.

    Attributes:
        shards: For each shard, indices into the reader's reference list, in write order.
        plan_id: Hash of the references and the parameters that shaped the plan; a rerun
            with the same input and arguments gets the same id, and resumes.
        settings: The parameters in the id, by name (so a refused rerun can name those
            that differ).
        listing_id: Hash of the references alone (the input's listing).
    """

    shards: list[list[int]]
    plan_id: str
    settings: dict[str, Any] = field(default_factory=dict)
    listing_id: str = ""


def plan_shards(
    refs: Sequence[SampleRef],
    *,
    max_shard_bytes: int,
    samples_per_shard: int | None = None,
    shuffle_seed: int | None = None,
    params: dict[str, Any] | None = None,
) -> PackPlan:
    """Cut ``refs`` into shards by estimated size, or by count if ``samples_per_shard``.

    Args:
        refs: The reader's references, in its order.
        max_shard_bytes: Close a shard before its estimated size passes this.
        samples_per_shard: If given, exactly this many samples per shard (the last fewer).
        shuffle_seed: If given, pack in a seeded random order instead of the input's.
        params: Other parameters that change the output (resize, quality); part of the id.

    Returns:
        The plan; every reference appears in exactly one shard.
    """
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    if samples_per_shard is not None and samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be >= 1, got {samples_per_shard}")
    order = list(range(len(refs)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    shards: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for i in order:
        size = max(refs[i].size, 0) + SAMPLE_OVERHEAD_BYTES
        full = (
            len(current) >= samples_per_shard
            if samples_per_shard is not None
            else current_bytes + size > max_shard_bytes
        )
        if current and full:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += size
    if current:
        shards.append(current)
    settings = {
        "max_shard_bytes": max_shard_bytes,
        "samples_per_shard": samples_per_shard,
        "shuffle_seed": shuffle_seed,
        **(params or {}),
    }
    lines = (f"{ref.key}\0{ref.location}\0{ref.start}\0{ref.length}" for ref in refs)
    plan_id, listing_id = plan_ids(settings, lines)
    return PackPlan(shards=shards, plan_id=plan_id, settings=settings, listing_id=listing_id)


def plan_ids(settings: dict[str, Any], listing: Iterable[str]) -> tuple[str, str]:
    """The id of a plan (its settings and its input's listing, one line per input) and the
    id of its listing alone: a rerun with the same input and arguments gets the same ids."""
    digest = hashlib.sha256()
    digest.update(json.dumps(settings, sort_keys=True).encode())
    alone = hashlib.sha256()
    for line in listing:
        data = f"{line}\n".encode()
        digest.update(data)
        alone.update(data)
    return digest.hexdigest()[:32], alone.hexdigest()[:32]
