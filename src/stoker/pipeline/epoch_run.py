"""EpochRun: one epoch under way for one worker, from its plan to batches decoding.

A :class:`~stoker.pipeline.loader.Loader` keeps the epoch it delivers in one and, while that
epoch ends, starts the next epoch's in another: its first read groups fetched and its first
batches decoding, so the pipeline does not drain at the boundary. :meth:`EpochRun.prepare`
makes a run's first batch on a thread of its own before it is asked for
(:meth:`stoker.Loader.start`: while a training script loads its model).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.errors import StokerError
from stoker.pipeline.batcher import Batcher, DecodeWorkers
from stoker.pipeline.pending import PendingBatch
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.prefetch import FetchStream
from stoker.pipeline.skips import SkipBudget


@dataclass(slots=True)
class EpochRun:
    """One epoch under way for this worker.

    Attributes:
        epoch: The epoch.
        plan: Its batches and chunks for this worker.
        stream: Its fetches.
        pending: Numbers of the batches not yet started, in order.
        decodes: Batches decoding, with their numbers, in order.
        pid: The process that started it (a forked child starts its own).
        lead: Threads to decode the first batch on, alone (0: as every other batch); see
            :meth:`stoker.Loader.lead_next_epoch`.
        fresh: The epoch is run from its beginning: its skips are counted from 0.
        made: The next batch, with its number, made ahead by :meth:`prepare`.
    """

    epoch: int
    plan: EpochPlan
    stream: FetchStream
    pending: deque[int]
    decodes: deque[tuple[int, PendingBatch]] = field(default_factory=deque)
    pid: int = field(default_factory=os.getpid)
    lead: int = 0
    fresh: bool = True
    made: tuple[int, dict[str, Any]] | None = None
    _threads: int = 0  # the decode threads to go back to after a led first batch
    _preparing: threading.Thread | None = None  # prepare's thread, until it is joined
    _prepared: threading.Event = field(default_factory=threading.Event)
    _error: BaseException | None = None  # what prepare's thread raised, for the consumer

    @classmethod
    def start(
        cls, epoch: int, plan: EpochPlan, stream: FetchStream, *, fresh: bool = True
    ) -> EpochRun:
        """The run of ``plan`` (epoch ``epoch``, from its beginning if ``fresh``) fetched
        through ``stream``."""
        return cls(epoch, plan, stream, deque(plan.mine), fresh=fresh)

    @property
    def here(self) -> bool:
        """Whether this process started it."""
        return self.pid == os.getpid()

    def check_here(self) -> None:
        """Raise unless this process started the run: a forked child cannot go on with one.

        Raises:
            RuntimeError: This process was forked from the one that started the run.
        """
        if not self.here:
            raise RuntimeError(
                f"this iteration of the Loader (epoch {self.epoch}) was started in process "
                f"{self.pid}, and this process ({os.getpid()}) was forked from it: its reads "
                "and decodes stayed there, so it cannot go on here. Start a new one in this "
                "process (for batch in loader: ...), or fork before iterating"
            )

    def fill(self, batches: Batcher, depth: int) -> None:
        """Start decoding the next batches, up to ``depth`` decoding; wait for a batch's
        samples only when nothing is decoding (else that is delivered first)."""
        self.stream.top_up()  # reads go on while the decodes are full
        workers = _resizable(batches)
        if self.lead and not self.decodes and workers is not None:
            # The first batch alone on more threads: nothing else is submitted with it.
            self._threads = workers.threads
            workers.resize(max(self.lead, self._threads))
            self.lead, depth = 0, 1
        while self.pending and len(self.decodes) < depth:
            number = self.pending[0]
            ids = self.plan.batches[number]
            if not self.stream.batch_ready(number):
                if self.decodes:
                    break  # a batch is decoding: deliver it rather than wait here
                self.stream.wait(ids)
            started = batches.start(ids, self.stream.take(ids), self.epoch)
            self.decodes.append((self.pending.popleft(), started))
            self.stream.top_up()  # taking them made room

    @property
    def left(self) -> bool:
        """Whether a batch is left to deliver."""
        return bool(self.pending or self.decodes) or self.made is not None

    def prepare(
        self, batches: Batcher, depth: int, skipped: list[tuple[str, str]], budget: SkipBudget
    ) -> None:
        """Make the first batch on a thread of its own, now (see :meth:`next_batch`); then
        fetch the stream's ``depth`` read groups ahead and start decoding (up to ``depth``
        batches here) the batches whose samples are in by then."""
        if self.pending or self.decodes:
            self._preparing = threading.Thread(
                target=self._prepare,
                args=(batches, depth, skipped, budget),
                name="stoker first batch",
                daemon=True,
            )
            self._preparing.start()
        else:
            self._prepared.set()

    def _prepare(
        self, batches: Batcher, depth: int, skipped: list[tuple[str, str]], budget: SkipBudget
    ) -> None:
        try:
            self.fill(batches, depth)
            self.made = self.finish_next(batches, skipped, budget)
            self.stream.delivering = True
            self.start_ready(batches, depth)
        except BaseException as exc:  # re-raised where the batch is asked for
            self._error = exc
        finally:
            self._prepared.set()

    def prepared(self, timeout_s: float | None) -> bool:
        """Whether :meth:`prepare`'s first batch is made (or failed), waiting for it at most
        ``timeout_s`` seconds (None: until it is)."""
        return self._prepared.wait(timeout_s)

    def _joined(self) -> None:
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None

    def next_batch(
        self,
        batches: Batcher,
        depth: int,
        skipped: list[tuple[str, str]],
        budget: SkipBudget,
    ) -> tuple[int, dict[str, Any]]:
        """The next batch with its number: the one :meth:`prepare` made, else started (up to
        ``depth`` decoding) and finished now (see :meth:`finish_next`).

        Raises:
            SkipBudgetError: Its skips take the epoch past the budget.
        """
        self._joined()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self.made is not None:
            made, self.made = self.made, None
            return made
        self.fill(batches, depth)
        return self.finish_next(batches, skipped, budget)

    def finish_next(
        self, batches: Batcher, skipped: list[tuple[str, str]], budget: SkipBudget
    ) -> tuple[int, dict[str, Any]]:
        """The next batch, assembled, with its number; its skips appended to ``skipped``
        and held to ``budget`` (waits for its decoding).

        Raises:
            SkipBudgetError: Its skips take the epoch past the budget.
        """
        number, pending = self.decodes.popleft()
        if self.fresh:  # an epoch run again from its start counts its skips anew
            budget.restart(self.epoch)
            self.fresh = False
        before = len(skipped)
        batch = batches.finish(pending, skipped)
        budget.took(skipped[before:], pending.ids, batch, self.epoch)
        if self.plan.exact:  # every row a unit of the epoch, delivered once
            batch["real"] = np.ones(len(batch["index"]), dtype=bool)
        return number, batch

    def start_ready(self, batches: Batcher, room: int) -> None:
        """Start decoding the next batches whose samples are in, at most ``room`` in all
        decoding here; never waits (nor starts a run of another process)."""
        if not self.here:
            return
        workers = _resizable(batches)
        if self._threads and workers is not None:  # the led first batch is out: back
            workers.resize(self._threads)
            self._threads = 0
        self.stream.top_up()
        while self.pending and len(self.decodes) < room:
            number = self.pending[0]
            if not self.stream.batch_ready(number):
                return
            ids = self.plan.batches[number]
            started = batches.start(ids, self.stream.take(ids), self.epoch)
            self.decodes.append((self.pending.popleft(), started))
            self.stream.top_up()

    def drop(self, batches: Batcher) -> None:
        """Let go of a run nobody will deliver: its decodes finish unseen (a worker
        process's shared-memory slot is freed when its batch is collected)."""
        if not self.here:
            return  # a parent's: its threads and processes are not here
        self._joined()
        self.made, self._error = None, None
        workers = _resizable(batches)
        if self._threads and workers is not None:  # a led first batch never delivered
            workers.resize(self._threads)
        for _, pending_batch in self.decodes:
            if pending_batch.slot is None:
                continue  # a thread's result is simply dropped
            # A batch nobody will see: its errors are nobody's.
            with contextlib.suppress(ValueError, StokerError, CancelledError):
                batches.finish(pending_batch, [])
        self.decodes.clear()


def _resizable(batches: Batcher) -> DecodeWorkers | None:
    """The threads ``batches`` decodes on, if it can resize them."""
    workers = batches.workers
    return workers if workers is not None and workers.resizable else None


def taken_over(
    run: EpochRun | None, *, epoch: int, fresh: bool, batches: Batcher
) -> EpochRun | None:
    """``run``, if it is epoch ``epoch`` asked for from its start (``fresh``) in the process
    that started it; else None, and ``run`` (if any) is dropped."""
    if run is None:
        return None
    if run.here and run.epoch == epoch and fresh:
        return run
    run.drop(batches)
    return None
