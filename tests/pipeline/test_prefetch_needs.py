"""FetchStream counts once per epoch what each batch needs; the counts match the plain
definitions (the leading chunks holding a batch's samples; each sample's uses)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from stoker.pipeline.plan import EpochPlan, chunks_covering
from stoker.pipeline.prefetch import _needs_and_repeats


def _plan(seed: int, scale: int) -> EpochPlan:
    rng = np.random.default_rng(seed)
    samples = rng.permutation(200)[: rng.integers(20, 200)] * scale
    # Padding repeats a few samples; batches of a random size, one of them empty.
    stream = np.concatenate([samples, rng.choice(samples, size=rng.integers(0, 6))])
    cuts = np.sort(rng.choice(np.arange(1, len(stream)), size=9, replace=False))
    batches = [np.asarray(b, dtype=np.int64) for b in np.split(stream, cuts)]
    batches.insert(3, np.zeros(0, dtype=np.int64))
    mine = list(range(int(rng.integers(0, 2)), len(batches), 2))  # worker w of 2
    wanted = np.concatenate([batches[b] for b in mine])
    # Chunks: each sample where it is first needed, cut in pieces of a random size.
    order = list(dict.fromkeys(wanted.tolist()))
    size = int(rng.integers(1, 40))
    chunks = [np.asarray(order[i : i + size]) for i in range(0, len(order), size)]
    return EpochPlan(batches=batches, mine=mine, chunks=chunks)


@pytest.mark.parametrize("scale", [1, 100_003])  # ids dense (a table) or sparse (a search)
@pytest.mark.parametrize("seed", range(20))
def test_needs_and_repeats_match_their_definitions(seed: int, scale: int) -> None:
    plan = _plan(seed, scale)
    needs, repeats = _needs_and_repeats(plan)
    for number in plan.mine:
        ids = plan.batches[number]
        expected = chunks_covering(plan.chunks, ids) if len(ids) else 0
        assert needs[number] == expected, (number, ids)
    uses = Counter(int(i) for b in plan.mine for i in plan.batches[b])
    assert repeats == {i: n for i, n in uses.items() if n > 1}


def test_a_sample_in_no_chunk_is_never_ready() -> None:
    plan = EpochPlan(
        batches=[np.array([1, 2]), np.array([3, 9])],
        mine=[0, 1],
        chunks=[np.array([1, 2]), np.array([3])],
    )
    needs, _ = _needs_and_repeats(plan)
    assert needs == {0: 1, 1: 3}  # 9 is fetched by no chunk: more than there are
