"""Exact evaluation for every kind of unit (issue 35, item 4): with
``OrderConfig(exact=True)`` ranks (and TorchLoader's worker processes) deliver every unit of
the epoch once, none repeated or dropped, their step counts within one, each batch's rows
marked ``real``; a resume mid-epoch, onto the same or another world size, stays exact.

The kinds are test_unit_kinds.py's (``KINDS``): packed images, a folder, records, windows,
a mix, Parquet, tokens and documents.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from conformance.test_unit_kinds import BATCH, KINDS, Kind, Unit, epoch, flat, units
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.world import World

EXACT = OrderConfig(exact=True)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Kind]:
    return {name: make(tmp_path_factory.mktemp(name)) for name, make in KINDS.items()}


def _settings(kind: Kind) -> dict[str, Any]:
    return {"batch_size": BATCH, "seed": 1, "drop_last": False, "order": EXACT, **kind.options}


def _rank(kind: Kind, rank: int, world_size: int, state: dict[str, Any] | None = None) -> Any:
    world = World(rank=rank, world_size=world_size)
    with Loader(kind.source, world=world, **_settings(kind)) as loader:
        loader.read_ahead = False
        if state is not None:
            loader.load_state_dict(state)
        batches = list(loader)
        if state is None:
            assert len(batches) == len(loader)
    for batch in batches:
        assert batch["real"].all()
        assert len(batch["real"]) == len(batch["index"])
    return [units(b, kind.ids) for b in batches]


def _everything(kind: Kind) -> Counter[Unit]:
    settings = {**_settings(kind), "order": OrderConfig()}
    with Loader(kind.source, **settings) as loader:
        loader.read_ahead = False
        every = Counter(flat(epoch(loader, kind.ids)))
        assert loader.stats().padded == 0
    return every


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("name", KINDS)
def test_ranks_deliver_every_unit_once(kinds: dict[str, Kind], name: str, world_size: int) -> None:
    kind = kinds[name]
    shares = [_rank(kind, rank, world_size) for rank in range(world_size)]
    steps = [len(share) for share in shares]
    assert max(steps) - min(steps) <= 1
    assert Counter(unit for share in shares for unit in flat(share)) == _everything(kind)


@pytest.mark.parametrize("name", KINDS)
def test_a_resume_mid_epoch_stays_exact(kinds: dict[str, Kind], name: str) -> None:
    kind = kinds[name]
    seen: list[Unit] = []
    state: dict[str, Any] = {}
    for rank in range(2):
        with Loader(kind.source, world=World(rank=rank, world_size=2), **_settings(kind)) as ld:
            it = iter(ld)
            seen += [u for _ in range(2) for u in units(next(it), kind.ids)]
            state = ld.state_dict()
            it.close()  # type: ignore[attr-defined]
    for world_size in (2, 3):
        rest = [u for r in range(world_size) for u in flat(_rank(kind, r, world_size, state))]
        assert Counter(seen + rest) == _everything(kind), world_size


@pytest.mark.parametrize("name", KINDS)
def test_torch_workers_give_the_exact_share_of_the_loader(
    kinds: dict[str, Kind], name: str
) -> None:
    """The shorter rank's share through two worker processes: the Loader's batches (which
    the tests above show exact), their count what ``len`` says, their rows all real."""
    from stoker.integrations.torch import TorchLoader

    kind = kinds[name]
    world = World(rank=1, world_size=2)
    with TorchLoader(kind.source, num_workers=2, world=world, **_settings(kind)) as loader:
        batches = list(loader)
        assert len(batches) == len(loader)
    assert [units(b, kind.ids) for b in batches] == _rank(kind, 1, 2)
    assert all(bool(batch["real"].all()) for batch in batches)


@pytest.mark.parametrize("name", ["packed", "tokens"])
def test_torch_workers_resume_exactly(kinds: dict[str, Kind], name: str) -> None:
    from stoker.integrations.torch import TorchLoader

    kind = kinds[name]
    world = World(rank=1, world_size=3)
    whole = _rank(kind, 1, 3)
    with TorchLoader(kind.source, num_workers=2, world=world, **_settings(kind)) as loader:
        it = iter(loader)
        head = [units(next(it), kind.ids) for _ in range(2)]
        state = loader.state_dict()
        it.close()  # type: ignore[attr-defined]
    with TorchLoader(kind.source, num_workers=2, world=world, **_settings(kind)) as resumed:
        resumed.load_state_dict(state)
        tail = [units(b, kind.ids) for b in resumed]
    assert head + tail == whole
    assert np.sum([len(b) for b in whole]) > 0
