"""Prefetch: the samples of an epoch's batches, fetched ahead of decoding on the I/O engine.

:class:`Prefetcher` lives as long as its Loader: it owns the in-memory sample cache and
the read-ahead of the next epoch's first batch. For each epoch, :meth:`Prefetcher.open`
gives a :class:`FetchStream` over the epoch's plan, which keeps up to ``depth`` chunks in
flight, tells whether a batch's samples are in, waits for them when they are not, and
hands them over, letting go of each sample after its last use.

Until the first batch is out, a stream fetches only the chunks that batch needs: requests
in flight share the link, so fetching further ahead would only delay it.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.core.metrics import Stage, Stages
from stoker.pipeline.cache import SampleCache
from stoker.pipeline.plan import EpochPlan, chunks_covering
from stoker.pipeline.source import Source
from stoker.storage.engine import IOEngine

#: What one fetch gives: sample id -> its fields.
Fetched = dict[int, dict[str, Any]]


@dataclass(slots=True)
class _ReadAhead:
    """Fetches of an epoch's first chunks, started before that epoch was asked for."""

    epoch: int
    chunks: list[np.ndarray]
    futures: list[Future[Fetched]]
    pid: int = field(default_factory=os.getpid)  # their answers go to this process only

    def matches(self, epoch: int, chunks: list[np.ndarray]) -> bool:
        return (
            self.pid == os.getpid()  # not a parent's, before a fork
            and epoch == self.epoch
            and len(chunks) >= len(self.chunks)
            and all(np.array_equal(a, b) for a, b in zip(self.chunks, chunks, strict=False))
        )


class Prefetcher:
    """Fetches samples of a source ahead of decoding, through an optional memory cache.

    Args:
        source: What is read.
        stages: Where each fetch is timed (:attr:`Stage.FETCH`) and each wait for one
            (:attr:`Stage.WAIT_FETCH`).
        memory_bytes: Bound of the in-memory sample cache, or None for none.
        hold: Chunks' worth of samples the order itself keeps fetched but undelivered (an
            :class:`~stoker.pipeline.order.OrderConfig` window spreads a group's samples
            over ``window`` groups' batches); prefetch comes on top.
    """

    def __init__(
        self, source: Source, *, stages: Stages, memory_bytes: int | None, hold: int = 1
    ) -> None:
        self.source = source
        self.hold = hold
        self.stages = stages
        self.cache = SampleCache(memory_bytes) if memory_bytes else None
        self.engine: IOEngine = source.datasets[0].store.engine
        self._ahead: _ReadAhead | None = None

    def open(
        self, epoch: int, plan: EpochPlan, *, on_drained: Callable[[], None] | None = None
    ) -> FetchStream:
        """The fetch stream of ``plan`` (epoch ``epoch``), using a matching read-ahead.

        Args:
            epoch: The epoch planned.
            plan: Its batches and chunks for this worker.
            on_drained: Called once every chunk is submitted and there is room for more
                (the moment to :meth:`read_ahead` the next epoch).
        """
        ahead, self._ahead = self._ahead, None
        started = ahead.futures if ahead is not None and ahead.matches(epoch, plan.chunks) else []
        return FetchStream(self, plan, started, on_drained, hold=self.hold)

    @property
    def reading_ahead(self) -> bool:
        """Whether a read-ahead is pending."""
        return self._ahead is not None

    def read_ahead(self, epoch: int, plan: EpochPlan) -> None:
        """Start fetching the chunks of ``plan``'s first batch (of epoch ``epoch``) now.

        Used by the next :meth:`open` of the same epoch and chunks; otherwise dropped.
        """
        if not plan.mine or not plan.chunks:
            return
        count = chunks_covering(plan.chunks, plan.batches[plan.mine[0]])
        futures = [self.submit(chunk) for chunk in plan.chunks[:count]]
        self._ahead = _ReadAhead(epoch, plan.chunks[:count], futures)

    def drop_read_ahead(self) -> None:
        """Forget a pending read-ahead."""
        self._ahead = None

    def submit(self, ids: np.ndarray) -> Future[Fetched]:
        """Fetch the samples ``ids`` on the I/O engine."""
        return self.engine.submit(self._fetch(ids))

    async def _fetch(self, ids: np.ndarray) -> Fetched:
        started = time.perf_counter()
        nbytes = 0
        found: Fetched = {}
        unique = list(dict.fromkeys(ids.tolist()))
        if self.cache is not None:
            missing = []
            for i in unique:
                cached = self.cache.get(i)
                if cached is not None:
                    found[i] = cached
                else:
                    missing.append(i)
            unique = missing
        if unique:
            for i, sample in zip(unique, await self.source.read_async(unique), strict=True):
                found[i] = sample
                if self.cache is not None and "error" not in sample:
                    self.cache.put(i, sample)
            nbytes = self.source.nbytes(unique)
        self.stages.record(
            Stage.FETCH,
            time.perf_counter() - started,
            start_s=started,
            items=len(unique),
            nbytes=nbytes,
            lane="io",
        )
        return found


class FetchStream:
    """One epoch's fetches for one worker (see :meth:`Prefetcher.open`).

    ``depth`` (chunks fetched ahead once batches are flowing) may change between calls;
    the Loader's autotuner deepens it while the pipeline waits on the store. It bounds
    what is held, not only what is in flight: samples fetched and not yet delivered count
    against it too, so a store faster than decoding (a local disk) does not fill memory
    with the rest of the epoch.

    Chunks are collected in the order they were submitted, so whether a batch's samples
    are in is one comparison (:meth:`batch_ready`): the chunks collected against the
    chunks it needs, counted once when the stream opens.
    """

    def __init__(
        self,
        prefetcher: Prefetcher,
        plan: EpochPlan,
        started: list[Future[Fetched]],
        on_drained: Callable[[], None] | None,
        *,
        hold: int = 1,
    ) -> None:
        self._prefetcher = prefetcher
        self._chunks = plan.chunks
        self._sizes = [len(chunk) for chunk in plan.chunks]
        self._fetches: deque[Future[Fetched]] = deque(started)
        self._next = len(started)
        self._in_flight = sum(self._sizes[: self._next])  # samples submitted, not collected
        self._collected = 0  # chunks collected (in submission order: the first ones)
        self._chunk_samples = max(self._sizes, default=1)
        self._hold = max(1, hold)
        self._fetched: Fetched = {}
        self._on_drained = on_drained
        # Chunks each of this worker's batches needs; samples used more than once
        # (padding repeats some): each is kept until its last use in this stream.
        self._needs, self._repeats = _needs_and_repeats(plan)
        wanted = plan.mine
        self._first_need = self._needs.get(wanted[0], len(self._chunks)) if wanted else 0
        self.depth = 1
        self.delivering = False  # set once the first batch is out: then fetch `depth` ahead

    def top_up(self) -> None:
        """Submit chunks until ``depth`` are in flight; until the first batch is out, only
        the chunks it needs (more would share the link, and the cores that receive, with
        them and then with its decoding)."""
        if self._next == len(self._chunks) and self._on_drained is None:
            return  # every chunk submitted
        if self.delivering:
            limit, end = self.depth, len(self._chunks)
        else:
            limit = end = min(len(self._chunks), max(1, self._first_need))
        room = (limit + self._hold) * self._chunk_samples  # samples held: fetched + in flight
        while (
            self._next < end
            and len(self._fetches) < limit
            and self._in_flight + len(self._fetched) + self._sizes[self._next] <= room
        ):
            self._submit_next()
        if self._next == len(self._chunks) and len(self._fetches) < limit and self._on_drained:
            callback, self._on_drained = self._on_drained, None
            callback()

    def _submit_next(self) -> None:
        self._fetches.append(self._prefetcher.submit(self._chunks[self._next]))
        self._in_flight += self._sizes[self._next]
        self._next += 1

    def _collect(self) -> None:
        """Move the oldest fetch's samples into the fetched ones (waits if it is running)."""
        self._fetched.update(self._fetches.popleft().result())
        self._in_flight -= self._sizes[self._collected]
        self._collected += 1

    def _collect_done(self) -> None:
        while self._fetches and self._fetches[0].done():
            self._collect()

    def batch_ready(self, number: int) -> bool:
        """Whether every sample of this worker's batch ``number`` is in (collects finished
        fetches; never blocks)."""
        self._collect_done()
        return self._collected >= self._needs[number]

    def ready(self, ids: np.ndarray) -> bool:
        """Whether every sample of ``ids`` is in (collects finished fetches; never blocks)."""
        self._collect_done()
        fetched = self._fetched
        return all(i in fetched for i in ids.tolist())

    def wait(self, ids: np.ndarray) -> None:
        """Block until every sample of ``ids`` is in, timed as :attr:`Stage.WAIT_FETCH`."""
        while not self.ready(ids):
            self.top_up()
            if not self._fetches and self._next < len(self._chunks):
                self._submit_next()  # what is held is all needed first: never stall on it
            if not self._fetches:
                raise RuntimeError("internal error: batch samples were never fetched")
            with self._prefetcher.stages.time(Stage.WAIT_FETCH):
                self._collect()

    def take(self, ids: np.ndarray) -> list[dict[str, Any]]:
        """The fetched samples of ``ids``, letting go of each after its last use."""
        fetched, repeats = self._fetched, self._repeats
        keys = ids.tolist()
        raw = [fetched[key] for key in keys]
        for key in keys:
            left = repeats.get(key)
            if left is None:
                del fetched[key]
            elif left > 1:
                repeats[key] = left - 1
            else:
                del repeats[key], fetched[key]
        return raw


def _needs_and_repeats(plan: EpochPlan) -> tuple[dict[int, int], dict[int, int]]:
    """For each of the worker's batches (by number), the count of leading chunks that hold
    all its samples; and the samples its batches use more than once, with their uses.
    Numpy over the whole epoch at once, not a Python loop per sample or per batch (a token
    epoch has a million short sequences)."""
    wanted = plan.wanted()
    if not wanted:
        return {}, {}
    sizes = np.fromiter((len(batch) for batch in wanted), dtype=np.int64, count=len(wanted))
    ids = np.concatenate(wanted).astype(np.int64, copy=False)
    never = len(plan.chunks) + 1  # a sample in no chunk: `wait` says so
    need_each = np.full(len(ids), never, dtype=np.int64)
    if plan.chunks and len(ids):
        fetched = np.concatenate(plan.chunks).astype(np.int64, copy=False)
        chunk_of = np.repeat(np.arange(1, len(plan.chunks) + 1), [len(c) for c in plan.chunks])
        top = int(max(fetched.max(initial=0), ids.max())) + 1
        if top <= max(8 * len(ids), 1 << 22):  # a table of at most 16 MB or 32 B an id
            table = np.full(top, never, dtype=np.int32)
            table[fetched[::-1]] = chunk_of[::-1]  # a sample in two chunks: the first's
            need_each = table[ids].astype(np.int64)
        else:
            unique, first = np.unique(fetched, return_index=True)
            at = np.minimum(np.searchsorted(unique, ids), len(unique) - 1)
            found = unique[at] == ids
            need_each[found] = chunk_of[first][at[found]]
    needs = np.zeros(len(wanted), dtype=np.int64)
    filled = sizes > 0
    if filled.any():
        starts = np.cumsum(sizes) - sizes
        needs[filled] = np.maximum.reduceat(need_each, starts[filled])
    used, uses = np.unique(ids, return_counts=True)
    repeated = uses > 1
    return (
        dict(zip(plan.mine, needs.tolist(), strict=True)),
        dict(zip(used[repeated].tolist(), uses[repeated].tolist(), strict=True)),
    )
