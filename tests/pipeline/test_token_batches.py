"""TokenLoader batches: the first one waits only for its own sequences, and the arrays
handed out are the caller's for as long as it holds them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stoker.format.token_writer import write_token_dataset
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.token_loader import TokenLoader
from stoker.pipeline.tokens import first_batch_apart
from stoker.pipeline.world import World
from stoker.storage.open import open_store

SEQ_LEN = 31
SPAN = SEQ_LEN + 1
ITEM = 2  # uint16


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    path = tmp_path_factory.mktemp("token-batches")
    rng = np.random.default_rng(5)
    docs = [rng.integers(2, 60_000, int(rng.integers(3, 120))) for _ in range(200)]
    keyed = [(f"doc{i:04d}", d) for i, d in enumerate(docs)]
    write_token_dataset(open_store(str(path)), keyed, dtype=np.dtype("uint16"), eos_id=1)
    return path, np.concatenate([np.append(d, 1) for d in docs])


def _read_bytes(ids: np.ndarray, loader: TokenLoader) -> int:
    """Bytes that reading sequences ``ids`` takes: a ranged read per run of consecutive
    ones, out to the edges of the documents it touches (each checked whole)."""
    starts = loader.source.doc_starts  # type: ignore[union-attr]
    unique = np.unique(ids)
    total = 0
    for run in np.split(unique, np.flatnonzero(np.diff(unique) != 1) + 1):
        first = np.searchsorted(starts, run[0] * SPAN, side="right") - 1
        last = np.searchsorted(starts, (run[-1] + 1) * SPAN, side="left")
        total += int(starts[last] - starts[first]) * ITEM
    return total


def _loader(path: Path, *, world: World | None = None, dtype: str = "int64") -> TokenLoader:
    # Blocks of 6 sequences, groups of 4 blocks: a group is 24 sequences, a batch 4.
    order = OrderConfig(block_size=6, group_blocks=4)
    return TokenLoader(
        path, seq_len=SEQ_LEN, batch_size=4, seed=1, order=order, world=world, dtype=dtype
    )


def _bytes_read(loader: TokenLoader) -> int:
    return int(loader.stats().requests.get("bytes.read", 0))


@pytest.mark.parametrize("resume", [0, 3])
def test_the_first_batch_reads_its_own_sequences_then_each_sequence_once(
    packed: tuple[Path, np.ndarray], resume: int
) -> None:
    path, stream = packed
    loader = _loader(path)
    loader.read_ahead = False
    if resume:
        loader.load_state_dict({**loader.state_dict(), "batches": resume})
    opened = _bytes_read(loader)
    batches = iter(loader)
    first = next(batches)
    # Its 4 sequences (out to their documents' edges), not the 24 of their read group.
    assert _bytes_read(loader) - opened == _read_bytes(first["index"], loader) < 24 * SPAN * ITEM
    rest = list(batches)
    delivered = np.concatenate([b["index"] for b in [first, *rest]])
    assert len(rest) == loader.batches_per_epoch() - resume - 1
    # Each sequence read once: what the runs of each read group's rest take, no more.
    gets = int(loader.stats().requests.get("requests.get", 0))
    assert delivered.size * SPAN * ITEM < _bytes_read(loader) - opened
    assert _bytes_read(loader) - opened < (delivered.size * SPAN + gets * 2 * 120) * ITEM
    for batch in [first, *rest]:
        for k, inputs in zip(batch["index"], batch["input_ids"], strict=True):
            assert np.array_equal(inputs, stream[k * SPAN : k * SPAN + SEQ_LEN])


def test_first_batch_apart_keeps_the_plan_and_fetches_each_sequence_once(
    packed: tuple[Path, np.ndarray],
) -> None:
    path, _ = packed
    loader = _loader(path, world=World(rank=1, world_size=2, worker=1, num_workers=2))
    plan = Loader._plan(loader, 0, 2)  # the Loader's plan, before the TokenLoader's change
    apart = first_batch_apart(plan)
    assert apart.batches is plan.batches
    assert apart.mine == plan.mine
    first = plan.batches[plan.mine[0]]
    assert sorted(apart.chunks[0].tolist()) == sorted(first.tolist())
    fetched = np.concatenate(apart.chunks)
    assert sorted(fetched.tolist()) == sorted(np.concatenate(plan.chunks).tolist())
    assert not np.isin(np.concatenate(apart.chunks[1:]), first).any()


def test_batches_held_stay_as_delivered_and_inputs_labels_and_targets_do_not_share(
    packed: tuple[Path, np.ndarray],
) -> None:
    path, stream = packed
    loader = _loader(path, dtype="int32")
    held = []
    for n, batch in enumerate(loader):
        batch["labels"][:, ::2] = -100  # the caller's to write: the others stay as they were
        if n % 2 == 0:
            held.append(batch)  # the others are let go, and their arrays written again
    for batch in held:
        assert batch["input_ids"].dtype == batch["targets"].dtype == np.int32
        assert (batch["labels"][:, ::2] == -100).all()
        assert np.array_equal(batch["labels"][:, 1::2], batch["input_ids"][:, 1::2])
        rows = zip(batch["index"], batch["input_ids"], batch["targets"], strict=True)
        for k, inputs, targets in rows:
            assert np.array_equal(inputs, stream[k * SPAN : k * SPAN + SEQ_LEN])
            assert np.array_equal(targets, stream[k * SPAN + 1 : (k + 1) * SPAN])
