"""A first batch during the checkpoint load (issue 35, item 5): ``Loader.start()`` makes the
restored position's first batch in the background; iteration takes it without fetching or
decoding it again, and the batches, their order and the state are those without it.

No test measures time: "ready" is what the loader reports (:meth:`Loader.ready`), and "no
waiting" is counted: no store request and no wait for a fetch in the first ``next()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import Loader, TokenLoader
from stoker.core.metrics import Stage
from stoker.format.token_writer import write_token_dataset
from stoker.pipeline.config import DecodeConfig
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import CenterCrop
from stoker.storage.open import open_store
from stoker.testing.images import write_packed_images

ORDER = OrderConfig(block_size=4, group_blocks=2, seed=3)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("start"),
        files=60,
        classes=4,
        width=24,
        height=20,
        samples_per_shard=12,
    )


def _keys(loader: Any, epochs: int = 1) -> list[list[int]]:
    out = []
    for _ in range(epochs):
        out += [batch["index"].tolist() for batch in loader]
    return out


def _loader(url: str, **options: Any) -> Loader:
    settings = {"batch_size": 5, "transform": CenterCrop(8), "order": ORDER, **options}
    return Loader(url, **settings)


@pytest.mark.parametrize(
    "options",
    [{}, {"decode": DecodeConfig(method="process", threads=2)}, {"order": OrderConfig(exact=True)}],
    ids=["threads", "processes", "exact"],
)
def test_the_batches_are_those_without_start(packed: str, options: dict[str, Any]) -> None:
    with _loader(packed, **options) as plain:
        expected = _keys(plain, epochs=2)
    with _loader(packed, **options) as started:
        started.start()
        started.start()  # a no-op
        assert _keys(started, epochs=2) == expected
    # After a restored state: from its position on, and the state as without start().
    with _loader(packed, **options) as first:
        it = iter(first)
        head = [next(it)["index"].tolist() for _ in range(3)]
        state = first.state_dict()
        it.close()  # type: ignore[attr-defined]
    with _loader(packed, **options) as resumed:
        resumed.load_state_dict(state)
        resumed.start()
        assert resumed.state_dict() == state
        assert head + _keys(resumed) == expected[: len(expected) // 2]


def test_a_position_changed_after_start_is_the_one_delivered(packed: str) -> None:
    with _loader(packed) as plain:
        plain.set_epoch(1)
        expected = _keys(plain)
    with _loader(packed) as loader:
        loader.start()
        assert loader.ready(timeout_s=None)
        loader.set_epoch(1)  # start()'s batches (epoch 0) are let go
        assert not loader.ready()
        assert _keys(loader) == expected


def test_after_ready_the_first_next_makes_no_request_and_never_waits(packed: str) -> None:
    # One read group (five blocks, one per shard): the first batch's reads are the epoch's.
    # (No read-ahead of the next epoch: its requests would be counted.)
    one_group = OrderConfig(block_size=12, group_blocks=5, seed=3)
    with _loader(packed, order=one_group) as loader:
        loader.read_ahead = False
        assert not loader.ready()
        loader.start()
        assert loader.ready(timeout_s=None)
        before = loader.stats()
        first = next(iter(loader))
        after = loader.stats()
    assert after.requests == before.requests
    waited = Stage.WAIT_FETCH
    assert after.stages.get(waited, None) == before.stages.get(waited, None)
    assert after.batches == before.batches + 1
    assert len(first["index"]) == 5


def test_the_first_batch_waits_for_nothing_in_a_longer_epoch(packed: str) -> None:
    # Prefetch shallower than the epoch: the first next() may start more reads, but it
    # waits for none (the first batch is made) and decodes nothing for it.
    with _loader(packed, prefetch=1) as loader:
        loader.read_ahead = False
        loader.start()
        assert loader.ready(timeout_s=None)
        before = loader.stats()
        next(iter(loader))
        after = loader.stats()
    assert after.stages.get(Stage.WAIT_FETCH) == before.stages.get(Stage.WAIT_FETCH)
    assert after.stages.get(Stage.WAIT_DECODE) == before.stages.get(Stage.WAIT_DECODE)


def test_an_error_of_the_first_batch_is_raised_by_the_iteration(tmp_path: Path) -> None:
    url = write_packed_images(tmp_path, files=8, classes=2, width=24, height=20)
    with Loader(url, batch_size=4, transform=lambda image: 1 / 0) as loader:
        loader.start()
        assert loader.ready(timeout_s=None)  # made or failed
        with pytest.raises(ZeroDivisionError):
            next(iter(loader))


def test_token_sequences(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    docs = [(f"d{i}", rng.integers(2, 500, int(rng.integers(3, 30)))) for i in range(60)]
    write_token_dataset(open_store(str(tmp_path)), docs, dtype=np.dtype("uint16"), eos_id=1)
    with TokenLoader(str(tmp_path), seq_len=7, batch_size=4) as plain:
        expected = _keys(plain)
    with TokenLoader(str(tmp_path), seq_len=7, batch_size=4) as started:
        started.start()
        assert started.ready(timeout_s=None)
        assert _keys(started) == expected
