"""How a DataLoader worker's batch reaches the training process (issue 32, item 5): by value
where /dev/shm has no room, each tensor as it was; a batch lost on the way is an error."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

from stoker.integrations.torch_handover import Arrivals, PipedBatch, ShmRoom


def _state(epoch: int, batches: int) -> dict[str, Any]:
    return {"epoch": epoch, "batches": batches, "segments": []}


def test_a_piped_batch_carries_every_tensor_as_it_was() -> None:
    batch = {
        "image": torch.arange(2 * 4 * 4 * 3, dtype=torch.uint8).reshape(2, 4, 4, 3),
        "label": torch.tensor([3, -1]),
        "score": torch.tensor([0.5, 1.25], dtype=torch.bfloat16),
        "tokens": [torch.tensor([1, 2, 3]), torch.tensor([4])],  # ragged
        "caption": ["a cat", "a dog"],
        "image_t": torch.arange(6, dtype=torch.float32).reshape(2, 3).t(),  # not contiguous
    }
    room = ShmRoom(size=64 << 20, free=1 << 20)
    piped = pickle.loads(pickle.dumps(PipedBatch.of(batch, room)))  # noqa: S301  (its own bytes)
    assert piped.room == room
    assert piped.nbytes == 96 + 16 + 4 + 32 + 24
    got = piped.batch()
    assert got.keys() == batch.keys()
    for name in ("image", "label", "score", "image_t"):
        assert got[name].dtype == batch[name].dtype, name
        assert torch.equal(got[name], batch[name]), name
    assert [t.tolist() for t in got["tokens"]] == [[1, 2, 3], [4]]
    assert got["caption"] == ["a cat", "a dog"]


def test_a_batch_lost_on_the_way_is_an_error() -> None:
    arrivals = Arrivals(2)
    arrivals.restart(epoch=3, position=0, total=6)
    arrivals.received({"label": torch.zeros(1)}, _state(3, 1))
    arrivals.received({"label": torch.zeros(1)}, _state(3, 2))
    with pytest.raises(RuntimeError, match=r"batch 2 of epoch 3 \(counted from 0\) never arrived"):
        arrivals.received({"label": torch.zeros(1)}, _state(3, 4))


def test_an_epoch_whose_last_batches_never_came_is_an_error() -> None:
    arrivals = Arrivals(2)
    arrivals.restart(epoch=0, position=2, total=5)  # resumed after 2 batches
    arrivals.received({"label": torch.zeros(1)}, _state(0, 3))
    with pytest.raises(RuntimeError, match="batches 3 to 4 of epoch 0"):
        arrivals.ended()


def test_an_epoch_resumed_on_another_world_size_counts_from_its_first_batch() -> None:
    # Its batches are counted anew from the samples the old ranks left.
    arrivals = Arrivals(2)
    arrivals.restart(epoch=0, position=None, total=None)
    arrivals.received({"label": torch.zeros(1)}, _state(0, 1))
    arrivals.received({"label": torch.zeros(1)}, _state(0, 2))
    with pytest.raises(RuntimeError, match="batch 2 of epoch 0"):
        arrivals.received({"label": torch.zeros(1)}, _state(0, 4))
    arrivals.ended()  # no total to fall short of
