"""The start of a later epoch with TorchLoader workers: the DataLoader asks worker 0 first, so
worker 0 makes its first batch of the next epoch on a thread per worker while the other
workers wait for it (they would share the cores with it); the wait is bounded and never
outlives the batches it was for."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from stoker.integrations.torch import TorchLoader
from stoker.integrations.torch_workers import FirstBatches, NextEpoch
from stoker.pipeline.config import DecodeConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.world import World
from stoker.testing.images import write_packed_images

BATCH = 6
SAMPLE_S = 0.02


class StampDecode:
    """A transform that takes ``SAMPLE_S`` and says who ran it and when: ``(pid, thread,
    start, end)``, the times on the machine-wide monotonic clock."""

    def __call__(self, image: Any) -> np.ndarray:
        start = time.monotonic_ns()
        time.sleep(SAMPLE_S)  # lets the GIL go, as the decoders do
        return np.array(
            [os.getpid(), threading.get_ident(), start, time.monotonic_ns()], dtype=np.int64
        )


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("epoch-start")
    return str(write_packed_images(root, files=48, width=24, height=16, samples_per_shard=12))


def test_worker_0_makes_the_next_epochs_first_batch_on_every_core_while_the_others_wait(
    packed: str,
) -> None:
    order = OrderConfig(block_size=4, group_blocks=2)
    with TorchLoader(
        packed,
        batch_size=BATCH,
        num_workers=2,
        multiprocessing_context="fork",
        transform=StampDecode(),
        order=order,
    ) as loader:
        epochs = [[batch["image"].numpy() for batch in loader] for _ in range(3)]
    for epoch in epochs[1:]:
        first, second = epoch[0], epoch[1]
        assert len({int(pid) for pid in first[:, 0]}) == 1
        assert {int(pid) for pid in first[:, 0]} != {int(pid) for pid in second[:, 0]}
        # Worker 0's first batch: two threads, one per worker.
        assert len({int(thread) for thread in first[:, 1]}) == 2
        # Worker 1 decoded nothing of its first batch until worker 0's was made.
        assert second[:, 2].min() >= first[:, 3].max()
    # Epoch 0 has no batch made ahead: each worker's first batch on its one thread.
    assert len({int(thread) for thread in epochs[0][0][:, 1]}) == 1


def test_a_led_first_batch_is_decoded_alone_then_the_threads_are_as_before(packed: str) -> None:
    # Worker 0 of 2, as in a DataLoader: the next epoch decodes only when asked for.
    world = World(worker=0, num_workers=2)
    decode = DecodeConfig(threads=1)
    with Loader(
        packed, batch_size=BATCH, transform=StampDecode(), world=world, decode=decode
    ) as loader:
        list(loader)
        loader.lead_next_epoch(3)
        batches = [batch["image"] for batch in loader]
        threads_after = loader._batches.threads
    assert len({int(thread) for thread in batches[0][:, 1]}) == 3
    # The rest on the loader's one thread again, none started before the led batch was made.
    assert threads_after == 1
    assert all(len({int(thread) for thread in batch[:, 1]}) == 1 for batch in batches[1:])
    assert min(int(b[:, 2].min()) for b in batches[1:]) >= int(batches[0][:, 3].max())


def _counting(made: list[int]) -> Iterator[int]:
    made.append(1)
    yield 1


def test_a_follower_waits_for_worker_0_then_makes_its_batch() -> None:
    firsts, made = FirstBatches(), []
    ahead = NextEpoch({"epoch": 4}, _counting(made), before=lambda stop: firsts.wait(4, stop))
    time.sleep(0.1)
    assert made == []  # still waiting for worker 0's first batch of epoch 4
    firsts.made(4)
    assert list(ahead.take()) == [1]
    assert made == [1]


def test_a_dropped_follower_stops_waiting_at_once_and_makes_nothing() -> None:
    firsts, made, ended = FirstBatches(), [], []

    def wait_for_worker_0(stop: threading.Event) -> None:
        # Only being dropped ends this wait (its timeout is far off): it saw stop set.
        ended.append((firsts.wait(2, stop, timeout_s=600), stop.is_set()))

    ahead = NextEpoch({"epoch": 2}, _counting(made), before=wait_for_worker_0)
    ahead.drop()  # another start was asked for: worker 0 will never make epoch 2's batch
    assert ended == [(False, True)]
    assert made == []


def test_the_wait_for_worker_0_is_bounded() -> None:
    # No batch and no stop: the wait ends by its timeout alone, saying no batch came.
    assert not FirstBatches().wait(1, threading.Event(), timeout_s=0.2)
    assert FirstBatches(3).wait(1, threading.Event(), timeout_s=0.2)  # a later one counts


def test_worker_0_says_so_even_when_it_makes_no_batch() -> None:
    firsts = FirstBatches()
    ahead = NextEpoch({"epoch": 5}, iter(()), after=lambda: firsts.made(5))
    assert list(ahead.take()) == []
    assert firsts.wait(5, threading.Event(), timeout_s=0.0)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_first_batches_are_shared_with_worker_processes(start: str) -> None:
    firsts = FirstBatches()
    worker = multiprocessing.get_context(start).Process(target=firsts.made, args=(7,))
    worker.start()  # it writes, as worker 0 does
    worker.join(60)
    assert worker.exitcode == 0
    assert firsts.wait(7, threading.Event(), timeout_s=0.0)
