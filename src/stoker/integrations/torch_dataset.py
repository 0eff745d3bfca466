"""PyTorch: :class:`StokerIterableDataset`, an ``IterableDataset`` of whole batches (see
:mod:`stoker.integrations.torch`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Unpack

import torch
from torch.utils.data import IterableDataset, get_worker_info

from stoker.core.metrics import TraceEvent
from stoker.integrations.observe import WorkerReport, batched_by_a_dataloader, new_events
from stoker.integrations.torch_handover import hand_over
from stoker.integrations.torch_tensors import to_tensors
from stoker.integrations.torch_workers import FirstBatches, NextEpoch, StartPoint
from stoker.pipeline.autotune import default_threads
from stoker.pipeline.config import (
    BLOCK_PAGE_BYTES,
    AdapterOptions,
    DecodeConfig,
    LoaderOptions,
    SourceConfig,
)
from stoker.pipeline.dataset_source import packed_dataset
from stoker.pipeline.loader import Loader
from stoker.pipeline.mixed_source import bind_mix
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.plan import Partition, loader_drop_last, resolve_order, resolve_seed
from stoker.pipeline.source import Source
from stoker.pipeline.sources import SourceLike, open_source
from stoker.pipeline.token_loader import loader_arguments
from stoker.pipeline.world import World


def detect_world() -> tuple[int, int]:
    """``(rank, world_size)`` from an initialised ``torch.distributed``, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class StokerIterableDataset(IterableDataset[dict[str, Any]]):
    """Whole batches from what :class:`stoker.Loader` reads, split by rank and DataLoader
    worker.

    Use with ``DataLoader(dataset, batch_size=None, num_workers=k)``: the dataset makes
    the batches, so the DataLoader must not batch them again (its default ``batch_size=1``
    would add a leading dimension of 1 to every array; that is refused with an error).
    Each worker runs its own loader and makes batches ``w, w + k, ...`` of the rank's
    epoch, so the DataLoader's in-order output is the same batch sequence whatever ``k``
    is. Any start method works, whatever the parent did first: a forked worker (Linux's
    default) reads the dataset the parent opened with a client and I/O engine of its own;
    a spawned one opens it again (the open dataset is not pickled).

    Each process keeps one loader for as long as it lives, so with
    ``persistent_workers=True`` a worker's loader, its open dataset and its decode
    threads serve every epoch, and after its share of an epoch a worker makes its first
    batch of the next one while it waits. The DataLoader asks worker 0 first, so worker 0
    makes its batch first, on a thread per worker, and the others wait for it (at most
    :data:`~stoker.integrations.torch_workers.LEAD_WAIT_S`) rather than share the cores.
    :meth:`set_epoch` (and a state to resume from) reaches workers that persist: it is
    kept in memory shared with them. A worker moves each batch's tensors into shared
    memory itself before handing it over: where ``/dev/shm`` has no room, the iteration
    raises ``OSError`` (``ENOSPC``) saying how big it is and what to change, rather than
    the DataLoader dropping the batch. In a DataLoader of your own, each worker holds
    ``DecodeConfig(max_skipped=...)`` to its own skips (a share of the rank's epoch for
    each); :class:`~stoker.integrations.torch.TorchLoader` holds it over all of them.

    Args:
        source: What :class:`stoker.Loader` takes: a dataset URL or path, an unpacked
            folder of class folders, an opened dataset, several URLs, a
            :class:`~stoker.pipeline.config.SourceConfig`.
        batch_size: Samples (or sequences) per batch.
        **options: :class:`stoker.Loader`'s settings (``transform``, ``seed``, ``order``,
            ``decode``, ``cache``, ...), or with ``seq_len`` (and ``documents``,
            ``dtype``) :class:`stoker.TokenLoader`'s: the source's token sequences. ``world``
            defaults to the rank of :func:`detect_world`; its worker fields are set per
            DataLoader worker.
    """

    def __init__(
        self, source: SourceLike, *, batch_size: int, **options: Unpack[AdapterOptions]
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        source, loader_options = loader_arguments(source, options)
        self.source = source
        self.url = _described(source)
        self.batch_size = batch_size
        if loader_options.get("world") is None:
            rank, world_size = detect_world()
            loader_options["world"] = World(rank=rank, world_size=world_size)
        self.options = loader_options
        self._start = StartPoint()  # epoch, resume state and tracing, seen by workers too
        self._firsts = FirstBatches()  # the epoch whose first batch worker 0 has made
        # Yield (batch, the loader's state after it, WorkerReport or None) triples.
        self.with_state = False
        self.live: Loader | None = None  # the loader of this process, once made
        self._opened: Source | None = None  # this process's open source (for len, names)
        self._loader_pid = 0  # the process that made `live` (a forked child makes its own)
        self._tracing: int | None = None  # what `live` was told to trace
        self._reported: TraceEvent | None = None  # the last event sent with a batch
        self._ahead: NextEpoch | None = None  # a worker's first batch of the next epoch

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes open the dataset and make a loader themselves; open stores,
        # threads and loaders do not travel.
        state = dict(self.__dict__)
        state.update(
            _opened=None, live=None, _loader_pid=0, _tracing=None, _ahead=None, _reported=None
        )
        return state

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return int(self._start.read()["epoch"])

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._start.update(epoch=epoch)

    @property
    def resume(self) -> dict[str, Any] | None:
        """A Loader state the next iteration continues from, or None (the epoch's start)."""
        resume: dict[str, Any] | None = self._start.read()["resume"]
        return resume

    @resume.setter
    def resume(self, state: Mapping[str, Any] | None) -> None:
        self._start.update(resume=None if state is None else dict(state))

    @property
    def max_events(self) -> int | None:
        """Keep a timeline of this many events (None: no timeline)."""
        max_events: int | None = self._start.read()["max_events"]
        return max_events

    @max_events.setter
    def max_events(self, max_events: int | None) -> None:
        self._start.update(max_events=max_events)

    def opened(self) -> Source:
        """The source, opened once per process (its index read once, not every epoch)."""
        if self._opened is None:
            self._opened = open_source(
                self.source,
                storage_options=self.options.get("storage_options"),
                cache=None,
                page_bytes=BLOCK_PAGE_BYTES,
            )
        return self._opened

    @property
    def class_names(self) -> list[str]:
        """Names of the labels, indexed by label (of the first dataset of a mix)."""
        return list(self.opened().datasets[0].class_names)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on."""
        if epoch != self.epoch:
            self._start.update(epoch=epoch, resume=None)

    def batches_per_epoch(self) -> int:
        """Batches of this rank's epoch (computed from the index; no loader is made)."""
        source = self.opened()
        options = self.options
        units, unit_bytes = source.units(), source.unit_bytes()
        order = resolve_order(
            source.order_defaults(
                options.get("order") or OrderConfig(), units=units, unit_bytes=unit_bytes
            ),
            seed=options.get("seed"),
            units=units,
            unit_bytes=unit_bytes,
            shuffled=source.shuffled(),
        )
        world = options.get("world") or World()
        drop_last = loader_drop_last(order, options.get("drop_last", False))
        partition = Partition(order, world, self.batch_size, drop_last)
        bind_mix(source, world.world_size, self.batch_size)  # a schedule counts its steps
        return partition.batches(source.epoch_order(order, self.epoch))

    def fresh_state(self, epoch: int | None = None) -> dict[str, Any]:
        """The state of the start of epoch ``epoch`` (default: this one; see
        :meth:`stoker.Loader.state_dict`)."""
        options = self.options
        world = options.get("world") or World()
        return {
            "epoch": self.epoch if epoch is None else epoch,
            "batches": 0,
            "batch_size": self.batch_size,
            "seed": resolve_seed(options.get("order"), options.get("seed")),
            "world_size": world.world_size,
            "segments": [],
            "skipped": 0,
        }

    def __iter__(self) -> Iterator[Any]:
        if batched_by_a_dataloader(self):
            raise TypeError(
                f"{self.url}: StokerIterableDataset yields whole batches of "
                f"{self.batch_size}; give the DataLoader batch_size=None "
                "(DataLoader(dataset, batch_size=None, num_workers=k)): with its default "
                "batch_size=1 every array would gain a leading dimension of 1"
            )
        return self._iterate()

    def _iterate(self) -> Iterator[Any]:
        info = get_worker_info()
        start = self.resume or self.fresh_state()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.start == start:
            yield from ahead.take()
        else:
            if ahead is not None:
                ahead.drop()
            yield from self._epoch(start, info)
        if info is not None and self.live is not None:
            # The share of this epoch is made: make the next epoch's first batch while the
            # DataLoader has not asked for it yet (a worker is idle until then).
            self._ahead = self._next_epoch(self.live, info)

    def _next_epoch(self, loader: Loader, info: Any) -> NextEpoch:
        """This worker's first batch of the epoch after ``loader``'s, under way. With several
        workers, worker 0's comes first, on a thread per worker (as many as the cores
        allow), while the others wait for it: the DataLoader asks for it first."""
        after = loader.state_dict()
        epoch, firsts = int(after["epoch"]), self._firsts
        before: Callable[[threading.Event], object] | None = None
        made: Callable[[], None] | None = None
        if info.num_workers > 1 and info.id == 0:
            loader.lead_next_epoch(min(info.num_workers * loader.num_threads, default_threads()))
            made = partial(firsts.made, epoch)  # even if it makes none
        elif info.num_workers > 1:
            before = partial(firsts.wait, epoch)  # then the event that ends the wait
        batches = self._epoch(after, info)
        return NextEpoch(after, batches, before=before, after=made)

    def _loader(self, info: Any) -> Loader:
        """This process's loader, made on first use."""
        if self.live is not None and self._loader_pid == os.getpid():
            return self.live
        options: LoaderOptions = dict(self.options)  # type: ignore[assignment]  # a copy
        world = options.get("world") or World()
        if info is not None:
            options["world"] = replace(world, worker=info.id, num_workers=info.num_workers)
            decode = options.get("decode")
            if decode is None or decode.threads in ("cpus", "auto"):
                # A worker process is one of several: one decode thread each by default.
                decode = options["decode"] = replace(decode or DecodeConfig(), threads=1)
            if self.with_state:
                # TorchLoader holds the budget over every worker and writes the skipped file,
                # in the training process, as it hands their batches out.
                options["decode"] = replace(decode, max_skipped=None, skipped_file=None)
        self.live = Loader(self._loader_source(), batch_size=self.batch_size, **options)
        self._loader_pid, self._tracing, self._reported = os.getpid(), None, None
        return self.live

    def _loader_source(self) -> SourceLike:
        """What this process's loader reads: a packed dataset named by its URL as opened
        here (its index read once per process; in a forked worker, the parent's, with a
        client of its own); anything else as given."""
        if isinstance(self.source, str | os.PathLike):
            dataset = packed_dataset(self.opened())
            if dataset is not None:
                return dataset
        return self.source

    def _epoch(self, start: dict[str, Any], info: Any) -> Iterator[Any]:
        """Batches (or triples, see ``with_state``) from the state ``start`` to the end of
        its epoch, made by this process's loader."""
        loader = self._loader(info)
        if loader.state_dict() != start:
            loader.load_state_dict(start)
        max_events = self.max_events
        if max_events is not None and max_events != self._tracing:
            loader.trace(max_events=max_events)
            self._tracing = max_events
        skipped = int(start.get("skipped", 0))  # the epoch's count at the last batch
        for batch in loader:
            tensors: Any = to_tensors(batch)
            if info is not None:  # in shared memory now, or by value where it has no room
                tensors = hand_over(tensors, pipe=self.with_state, workers=info.num_workers)
            if not self.with_state:
                yield tensors
                continue
            report, state = None, loader.state_dict()
            if info is not None:  # the training process cannot see this loader
                # Each event once: after the last one sent, whichever epoch sent it.
                events = new_events(loader.events(), self._reported) if max_events else []
                self._reported = events[-1] if events else self._reported
                new, skipped = state["skipped"] - skipped, state["skipped"]
                skips = loader.skips.records[len(loader.skips.records) - new :] if new else []
                report = WorkerReport(info.id, loader.stats(), tuple(events), tuple(skips))
            yield tensors, state, report

    def close(self) -> None:
        """Stop this process's loader (its decode threads; a next iteration makes a new
        one)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.drop()
        live, self.live = self.live, None
        if live is not None and self._loader_pid == os.getpid():
            live.close()


def _described(source: SourceLike) -> str:
    """What ``source`` is called in messages."""
    if isinstance(source, str | os.PathLike):
        return str(source)
    if isinstance(source, SourceConfig):
        return _described(source.location)  # type: ignore[arg-type]  # one or several
    if isinstance(source, Sequence):
        return " + ".join(str(item) for item in source)
    return str(source.url)
