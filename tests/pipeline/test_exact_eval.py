"""Exact evaluation (issue 35, item 4): ``OrderConfig(exact=True)`` delivers every unit of an
epoch once over all ranks and workers, none repeated and none dropped; ranks' step counts
differ by at most one; resume, onto the same or another world size, stays exact.

The properties run on the pure plan (:func:`~stoker.pipeline.plan.plan_epoch`) over random
world sizes, dataset sizes, batch sizes, workers and shuffle modes; the Loader tests check
the same on real data, with the ``real`` mask each batch carries. Every kind of unit, and
TorchLoader's workers, are in tests/conformance/test_exact_kinds.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import Loader, TokenLoader, World
from stoker.format.token_writer import write_token_dataset
from stoker.pipeline.order import OrderConfig, assign, epoch_order, exact_length
from stoker.pipeline.plan import Partition, plan_epoch, resolve_order
from stoker.pipeline.resume import resume_point
from stoker.pipeline.transforms import CenterCrop
from stoker.storage.open import open_store
from stoker.testing.images import write_packed_images

EXACT = OrderConfig(exact=True)


@st.composite
def epochs(draw: st.DrawFn) -> dict[str, Any]:
    """A dataset (shard sizes), an order, a world size, a batch size and workers."""
    shards = draw(st.lists(st.integers(0, 40), min_size=1, max_size=6))
    mode = draw(st.sampled_from(["blocks", "random", "none"]))
    order = OrderConfig(
        mode=mode,
        seed=draw(st.integers(0, 3)),
        block_size=draw(st.integers(1, 8)),
        group_blocks=draw(st.integers(1, 4)),
        window=draw(st.integers(1, 3)),
        exact=True,
    )
    return {
        "shards": shards,
        "order": order,
        "world_size": draw(st.integers(1, 8)),
        "batch_size": draw(st.integers(1, 9)),
        "workers": draw(st.integers(1, 4)),
        "epoch": draw(st.integers(0, 2)),
    }


def _batches(case: dict[str, Any], rank: int, worker: int, **plan: Any) -> list[np.ndarray]:
    order = epoch_order(case["shards"], config=case["order"], epoch=case["epoch"])
    world = World(
        rank=rank, world_size=case["world_size"], worker=worker, num_workers=case["workers"]
    )
    made = plan_epoch(
        order,
        world=world,
        batch_size=case["batch_size"],
        drop_last=False,
        group_samples=case["order"].group_samples,
        exact=True,
        **plan,
    )
    # Every batch a worker makes is fetched in its chunks, each sample once.
    fetched = np.concatenate(made.chunks) if made.chunks else np.zeros(0, dtype=np.int64)
    wanted = made.wanted()
    assert Counter(fetched.tolist()) == Counter(np.concatenate(wanted).tolist() if wanted else [])
    return wanted


@settings(max_examples=300, deadline=None)
@given(epochs())
def test_every_unit_once_over_ranks_and_workers(case: dict[str, Any]) -> None:
    total, size = sum(case["shards"]), case["batch_size"]
    delivered: list[int] = []
    steps = []
    for rank in range(case["world_size"]):
        rank_batches = [
            batch for worker in range(case["workers"]) for batch in _batches(case, rank, worker)
        ]
        steps.append(len(rank_batches))
        # Whole batches but the rank's last, which may be short (never empty).
        lengths = sorted((len(b) for b in rank_batches), reverse=True)
        assert all(n == size for n in lengths[:-1])
        assert all(0 < n <= size for n in lengths)
        assert sum(lengths) == exact_length(total, rank=rank, world_size=case["world_size"])
        order = epoch_order(case["shards"], config=case["order"], epoch=case["epoch"])
        world = World(rank=rank, world_size=case["world_size"])
        assert len(rank_batches) == Partition(case["order"], world, size, False).batches(order)
        delivered += [int(i) for batch in rank_batches for i in batch]
    assert sorted(delivered) == list(range(total))  # each once: no repeat, no drop
    assert max(steps) - min(steps) <= 1


@settings(max_examples=200, deadline=None)
@given(epochs(), st.integers(1, 8), st.data())
def test_a_resume_onto_any_world_size_stays_exact(
    case: dict[str, Any], resumed_world: int, data: st.DataObject
) -> None:
    """Ranks stop after the same batch; the state resumes on ``resumed_world`` ranks (or the
    same world size, by position): the union of both parts is the epoch, each unit once."""
    total, size, world_size = sum(case["shards"]), case["batch_size"], case["world_size"]
    most = -(-exact_length(total, rank=0, world_size=world_size) // size)
    stop = data.draw(st.integers(0, most))
    case = {**case, "workers": 1}
    before = [
        int(i)
        for rank in range(world_size)
        for batch in _batches(case, rank, 0)[:stop]
        for i in batch
    ]
    state = {
        "epoch": case["epoch"],
        "batches": stop,
        "batch_size": size,
        "seed": case["order"].seed_value,
        "world_size": world_size,
        "segments": [],
    }
    order = epoch_order(case["shards"], config=case["order"], epoch=case["epoch"])
    point = resume_point(
        state,
        seed=case["order"].seed_value,
        batch_size=size,
        world_size=resumed_world,
        orders=lambda _: order,
        exact=True,
    )
    after = [
        int(i)
        for rank in range(resumed_world)
        for batch in _batches(
            {**case, "world_size": resumed_world},
            rank,
            0,
            position=point.position,
            segments=point.segments,
        )
        for i in batch
    ]
    assert sorted(before + after) == list(range(total))


def test_shares_differ_by_at_most_one_and_cut_the_stream_in_order() -> None:
    order = epoch_order([10, 7], config=OrderConfig(block_size=4, group_blocks=1), epoch=0)
    shares = [assign(order, rank=r, world_size=5, exact=True) for r in range(5)]
    assert [len(s.samples) for s in shares] == [4, 4, 3, 3, 3]
    assert all(s.padded == s.dropped == 0 for s in shares)
    assert sorted(np.concatenate([s.samples for s in shares]).tolist()) == list(range(17))
    # More ranks than units: the last ranks get none, and nothing is repeated for them.
    few = [assign(order, rank=r, world_size=20, exact=True) for r in range(20)]
    assert [len(s.samples) for s in few] == [1] * 17 + [0] * 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("exact"),
        files=41,
        classes=4,
        width=24,
        height=20,
        samples_per_shard=10,
    )


def _epoch(url: str, rank: int, world_size: int, **options: Any) -> list[dict[str, Any]]:
    settings = {"batch_size": 4, "transform": CenterCrop(8), "order": EXACT, **options}
    with Loader(url, world=World(rank=rank, world_size=world_size), **settings) as loader:
        loader.read_ahead = False
        batches = list(loader)
        assert len(batches) == len(loader) == loader.batches_per_epoch()
        assert loader.stats().padded == 0
        assert loader.stats().epoch_samples == sum(len(b["index"]) for b in batches)
    return batches


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_the_loader_delivers_the_set_once_with_a_real_mask(packed: str, world_size: int) -> None:
    indices, labels, steps, real = [], 0, [], 0
    for rank in range(world_size):
        batches = _epoch(packed, rank, world_size)
        steps.append(len(batches))
        for batch in batches:
            assert batch["real"].dtype == np.bool_
            assert batch["real"].shape == (len(batch["index"]),)
            real += int(batch["real"].sum())
            labels += int(batch["label"][batch["real"]].sum())
            indices += batch["index"].tolist()
    assert sorted(indices) == list(range(41))
    assert real == 41
    with Loader(packed, batch_size=41, order=OrderConfig(mode="none")) as everything:
        assert labels == int(next(iter(everything))["label"].sum())
    assert max(steps) - min(steps) <= 1


def test_exact_is_the_loaders_order_and_batches_on_one_rank(packed: str) -> None:
    plain = [b["index"].tolist() for b in _epoch(packed, 0, 1, order=OrderConfig())]
    assert [b["index"].tolist() for b in _epoch(packed, 0, 1)] == plain


def test_a_resume_mid_epoch_onto_other_world_sizes_stays_exact(packed: str) -> None:
    settings: dict[str, Any] = {"batch_size": 4, "transform": CenterCrop(8), "order": EXACT}
    seen: list[int] = []
    state: dict[str, Any] = {}
    for rank in range(3):
        with Loader(packed, world=World(rank=rank, world_size=3), **settings) as loader:
            it = iter(loader)
            seen += [i for _ in range(2) for i in next(it)["index"].tolist()]
            state = loader.state_dict()
    for world_size in (1, 2, 3, 4):
        rest = [
            i
            for rank in range(world_size)
            for batch in _resumed(packed, state, rank, world_size, settings)
            for i in batch["index"].tolist()
        ]
        assert sorted(seen + rest) == list(range(41)), world_size


def _resumed(
    url: str, state: dict[str, Any], rank: int, world_size: int, settings: dict[str, Any]
) -> list[dict[str, Any]]:
    with Loader(url, world=World(rank=rank, world_size=world_size), **settings) as loader:
        loader.read_ahead = False
        loader.load_state_dict(state)
        return list(loader)


def test_drop_last_true_is_refused(packed: str) -> None:
    with pytest.raises(ValueError, match="drop_last=False"):
        Loader(packed, batch_size=4, order=EXACT, drop_last=True)
    with pytest.raises(TypeError, match="exact"):
        OrderConfig(exact="yes")  # type: ignore[arg-type]


def test_token_sequences_once_over_ranks(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    docs = [(f"d{i}", rng.integers(2, 500, int(rng.integers(3, 30)))) for i in range(40)]
    write_token_dataset(open_store(str(tmp_path)), docs, dtype=np.dtype("uint16"), eos_id=1)
    got: list[int] = []
    for rank in range(3):
        world = World(rank=rank, world_size=3)
        with TokenLoader(
            str(tmp_path), seq_len=7, batch_size=4, order=EXACT, drop_last=False, world=world
        ) as loader:
            for batch in loader:
                assert batch["real"].all()
                assert len(batch["real"]) == len(batch["input_ids"])
                got += batch["index"].tolist()
            sequences = loader.source.units()
    assert sorted(got) == list(range(sequences))


def test_resolve_order_keeps_exact() -> None:
    assert resolve_order(EXACT, seed=None, units=100, unit_bytes=1000.0).exact
