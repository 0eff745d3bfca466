"""What users do without stoker, timed: the baselines of the seed comparison.

Each returns seconds; each decodes with the same function the loader uses, so a comparison
with it measures data access and not the decoder.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from stoker.pipeline.decode import decode_planned
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.storage import Store
from stoker.storage.transfer import TransferConfig, download, safe_local_path


def timed_epoch(
    load: Callable[[int], bytes | memoryview],
    count: int,
    *,
    batch_size: int,
    transform: RandomResizedCrop,
    workers: int,
    seed: int,
) -> tuple[float, float]:
    """One epoch: ``load(i)`` then decode, for each sample, on ``workers`` threads (each does
    both, as DataLoader workers do), in order, into batches.

    Returns:
        Seconds to the first batch and to the last.
    """

    def work(i: int) -> np.ndarray:
        return decode_planned(load(i), transform, random.Random(seed * 1_000_003 + i))

    started = time.perf_counter()
    first = 0.0
    batch: list[np.ndarray] = []
    pending: deque[Future[np.ndarray]] = deque()
    submitted = 0
    with ThreadPoolExecutor(workers, thread_name_prefix="stoker-compare") as pool:
        for done in range(count):
            while submitted < count and len(pending) < 2 * workers:
                pending.append(pool.submit(work, submitted))
                submitted += 1
            batch.append(pending.popleft().result())
            if len(batch) == batch_size or done == count - 1:
                np.stack(batch)
                batch = []
                if not first:
                    first = time.perf_counter() - started
    return first, time.perf_counter() - started


def download_one_by_one(store: Store, keys: Sequence[str], target: Path) -> float:
    """GET each key in turn and write it under ``target``; return the seconds taken."""
    started = time.perf_counter()
    for key in keys:
        path = safe_local_path(target, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get(key))
    return time.perf_counter() - started


def download_parallel(
    store: Store, keys: Sequence[str], target: Path, workers: int, *, whole: bool
) -> float:
    """Download ``keys`` under ``target`` with ``workers`` in flight; return the seconds.

    With ``whole`` (the keys are the store's every object) this is ``stoker download``;
    otherwise the same parallel GETs for the keys alone, since download's include patterns
    do not scale to thousands of keys.
    """
    started = time.perf_counter()
    if whole:
        download(store, target, config=TransferConfig(workers=workers))
        return time.perf_counter() - started

    async def fetch_all() -> None:
        slots = asyncio.Semaphore(workers)

        async def one(key: str) -> None:
            async with slots:
                data = await store.get_async(key)
            path = safe_local_path(target, key)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

        await asyncio.gather(*(one(key) for key in keys))

    store.engine.run(fetch_all())
    return time.perf_counter() - started
