"""PyTorch: batches as tensors, inside or outside ``torch.utils.data.DataLoader``.

Two ways in:

* :class:`TorchLoader` (recommended): stoker's threaded loader in the training process,
  yielding tensors, with ``pin_memory`` and an overlapped copy to ``device`` (the next
  batch is copied on a side stream while the current one trains). ``num_workers=k`` runs
  the same pipeline in ``k`` DataLoader worker processes instead, for Python-heavy
  transforms.
* :class:`StokerIterableDataset`: an ``IterableDataset`` of whole batches for your own
  ``DataLoader(dataset, batch_size=None, num_workers=k)``; it splits by rank and worker.

Ranks come from ``torch.distributed`` when it is initialised. ``state_dict`` and
``load_state_dict`` follow torchdata's ``StatefulDataLoader``: call them on the loader; the
state is a few integers and restores with any number of workers or threads.
``TorchLoader.stats()``, ``.trace()`` and ``.events()`` say what :class:`stoker.Loader`'s
do, over every epoch and every worker process.

Every field of a record reaches the batch (see :func:`to_tensors`): numeric arrays as
tensors (images ``(N, H, W, 3)`` uint8, ``npy`` fields of one shape stacked, padded ones
beside their ``<name>_lengths``), ragged arrays as a list of tensors, and captions, JSON
objects and bytes as Python lists, one item per sample.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Generator, Iterator, Mapping
from dataclasses import replace
from typing import Any, Unpack

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from stoker.core.metrics import TraceEvent
from stoker.format.reader import ShardDataset, open_dataset
from stoker.integrations.observe import (
    RunRecord,
    WorkerReport,
    batched_by_a_dataloader,
    new_events,
)
from stoker.integrations.torch_tensors import each_tensor, to_tensors
from stoker.pipeline.config import DecodeConfig, LoaderOptions
from stoker.pipeline.loader import Loader
from stoker.pipeline.plan import batches_per_epoch, resolve_order, resolve_seed, resume_point
from stoker.pipeline.sources import DatasetSource
from stoker.pipeline.stats import LoaderStats
from stoker.pipeline.world import World


def detect_world() -> tuple[int, int]:
    """``(rank, world_size)`` from an initialised ``torch.distributed``, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _as_delivered(item: Any) -> Any:
    """A DataLoader ``collate_fn`` that hands a worker's batch over as the worker made it
    (the default one would turn tuples and arrays in a field's objects into lists and tensors,
    unlike ``num_workers=0``)."""
    return item


class StokerIterableDataset(IterableDataset[dict[str, Any]]):
    """Whole batches from a packed dataset, split by rank and DataLoader worker.

    Use with ``DataLoader(dataset, batch_size=None, num_workers=k)``: the dataset makes
    the batches, so the DataLoader must not batch them again (its default ``batch_size=1``
    would add a leading dimension of 1 to every array; that is refused with an error).
    Each worker runs its own loader and makes batches ``w, w + k, ...`` of the rank's
    epoch, so the DataLoader's in-order output is the same batch sequence whatever ``k``
    is. Any start method works, whatever the parent did first: a forked worker (Linux's
    default) reads the dataset the parent opened with a client and I/O engine of its own;
    a spawned one opens it again (the open dataset is not pickled).

    Args:
        url: Dataset URL.
        batch_size: Samples per batch.
        **options: :class:`stoker.Loader`'s settings (``transform``, ``seed``, ``order``,
            ``decode``, ``cache``, ...). ``world`` defaults to the rank of
            :func:`detect_world`; its worker fields are set per DataLoader worker.
    """

    def __init__(self, url: str, *, batch_size: int, **options: Unpack[LoaderOptions]) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.url = url
        self.batch_size = batch_size
        if options.get("world") is None:
            rank, world_size = detect_world()
            options["world"] = World(rank=rank, world_size=world_size)
        self.options = options
        self.epoch = 0
        self.resume: dict[str, Any] | None = None  # a Loader state to continue from
        # Yield (batch, the loader's state after it, WorkerReport or None) triples.
        self.with_state = False
        self.max_events: int | None = None  # keep a timeline of this many events
        self.live: Loader | None = None  # the loader iterating in this process, if any
        self._opened: ShardDataset | None = None  # this process's open dataset

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes open the dataset themselves; open stores do not travel.
        state = dict(self.__dict__)
        state["_opened"] = None
        state["live"] = None
        return state

    def opened(self) -> ShardDataset:
        """The dataset, opened once per process (its index read once, not every epoch)."""
        if self._opened is None:
            self._opened = open_dataset(
                self.url, storage_options=self.options.get("storage_options")
            )
        return self._opened

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.resume = None

    def batches_per_epoch(self) -> int:
        """Batches of this rank's epoch (computed from the index; no loader is made)."""
        source = DatasetSource(self.opened())
        options = self.options
        order = resolve_order(
            options.get("order"),
            seed=options.get("seed"),
            units=source.units(),
            unit_bytes=source.unit_bytes(),
        )
        world = options.get("world") or World()
        return batches_per_epoch(
            source.epoch_order(order, self.epoch),
            world=world,
            batch_size=self.batch_size,
            drop_last=bool(options.get("drop_last", False)),
        )

    def fresh_state(self) -> dict[str, Any]:
        """The state of this epoch's start (see :meth:`stoker.Loader.state_dict`)."""
        options = self.options
        world = options.get("world") or World()
        return {
            "epoch": self.epoch,
            "batches": 0,
            "batch_size": self.batch_size,
            "seed": resolve_seed(options.get("order"), options.get("seed")),
            "world_size": world.world_size,
            "segments": [],
        }

    def __iter__(self) -> Iterator[Any]:
        if batched_by_a_dataloader(self):
            raise TypeError(
                f"{self.url}: StokerIterableDataset yields whole batches of "
                f"{self.batch_size}; give the DataLoader batch_size=None "
                "(DataLoader(dataset, batch_size=None, num_workers=k)): with its default "
                "batch_size=1 every array would gain a leading dimension of 1"
            )
        info = get_worker_info()
        options: LoaderOptions = dict(self.options)  # type: ignore[assignment]  # a copy
        world = options.get("world") or World()
        if info is not None:
            options["world"] = replace(world, worker=info.id, num_workers=info.num_workers)
            decode = options.get("decode")
            if decode is None or decode.threads in ("cpus", "auto"):
                # A worker process is one of several: one decode thread each by default.
                options["decode"] = replace(decode or DecodeConfig(), threads=1)
        with Loader(self.opened(), batch_size=self.batch_size, **options) as loader:
            loader.set_epoch(self.epoch)
            if self.resume is not None:
                loader.load_state_dict(self.resume)
            if self.max_events is not None:
                loader.trace(max_events=self.max_events)
            self.live = loader
            last: TraceEvent | None = None
            for batch in loader:
                tensors = to_tensors(batch)
                if not self.with_state:
                    yield tensors
                    continue
                report = None
                if info is not None:  # the training process cannot see this loader
                    events = new_events(loader.events(), last) if self.max_events else []
                    last = events[-1] if events else last
                    report = WorkerReport(info.id, loader.stats(), tuple(events))
                yield tensors, loader.state_dict(), report


class TorchLoader:
    """Batches of tensors for a training loop, optionally pinned and on ``device``.

    ``state_dict()`` is the state after the last batch this loader handed out (each batch
    travels with its loader's state, so it holds with DataLoader workers too), not after
    the one already on its way to the device.

    ``stats()`` covers every epoch this loader has run. With ``num_workers=0`` it is what
    the :class:`stoker.Loader` inside says. With workers, each batch brings its worker's
    counters: samples, batches, requests, bytes and stage times add up over the workers
    (stage times include batches a worker has made ahead and not yet handed over, up to
    the DataLoader's ``prefetch_factor`` each), and the ``consumer.wait`` and
    ``consumer.step`` stages are measured here, in the training process.

    Args:
        url: Dataset URL.
        batch_size: Samples per batch.
        num_workers: 0 runs stoker's threaded pipeline in this process (best for the
            built-in transforms); ``k > 0`` runs it in ``k`` DataLoader worker processes.
        pin_memory: Pin the batches' tensors in page-locked memory (for fast, asynchronous
            copies); lists of strings and other objects stay as they are.
        device: Move the batches' tensors there (each tensor of a ragged field's list
            too); on CUDA the copy of batch ``i + 1`` overlaps step ``i``.
        channels_last: Images as ``(N, 3, H, W)`` views instead of ``(N, H, W, 3)``.
        **options: :class:`stoker.Loader`'s settings (``transform``, ``seed``, ``order``,
            ``drop_last``, ``decode``, ``cache``, ``storage_options``, ...); ``world``
            defaults to the rank of :func:`detect_world`.
    """

    def __init__(
        self,
        url: str,
        *,
        batch_size: int,
        num_workers: int = 0,
        pin_memory: bool = False,
        device: str | torch.device | None = None,
        channels_last: bool = False,
        **options: Unpack[LoaderOptions],
    ) -> None:
        self.dataset = StokerIterableDataset(url, batch_size=batch_size, **options)
        self.dataset.with_state = True
        self.dataset.fresh_state()  # a seed given twice, differently, raises now
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.device = torch.device(device) if device is not None else None
        self.channels_last = channels_last
        self._state: dict[str, Any] | None = None  # the state after the last delivery
        self._record = RunRecord(in_process=num_workers == 0)
        # Weak: the iteration refers to this loader, and a cycle would leave an abandoned
        # one to the garbage collector, which may close it on any thread at any time.
        self._running: weakref.ref[Generator[dict[str, Any], None, None]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``."""
        if epoch != self.dataset.epoch:
            self._state = None
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return self.dataset.batches_per_epoch()

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "batches", "batch_size", "seed", "world_size", "segments"}``."""
        if self._state is not None:
            return dict(self._state)
        if self.dataset.resume is not None:
            return dict(self.dataset.resume)
        return self.dataset.fresh_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the last batch ``state`` counted, with any number of workers, and
        on any world size (see :meth:`stoker.Loader.load_state_dict`)."""
        fresh = self.dataset.fresh_state()
        point = resume_point(  # raises on another seed or batch size
            state,
            seed=fresh["seed"],
            batch_size=self.dataset.batch_size,
            world_size=fresh["world_size"],
        )
        self.dataset.epoch = point.epoch
        self.dataset.resume = dict(state)
        self._state = {
            **fresh,
            "epoch": point.epoch,
            "batches": point.position,
            "segments": [[s.world_size, s.consumed] for s in point.segments],
        }

    # -- observe -------------------------------------------------------------------------

    def trace(self, *, max_events: int = 200_000) -> None:
        """Keep a timeline of the last ``max_events`` stage runs from the next iteration on,
        in this process and in every worker (see :meth:`stoker.Loader.trace`)."""
        self.dataset.max_events = max_events
        self._record.trace(max_events)

    def events(self) -> list[TraceEvent]:
        """The timeline kept since :meth:`trace`, oldest first: the loader's stages, from
        every worker (their decode threads share the ``decode N`` rows of a trace)."""
        return self._record.events(self.dataset.live)

    def stats(self) -> LoaderStats:
        """The counters of every epoch run so far (see the class docstring for workers)."""
        return self._record.stats(self.dataset.live)

    def _finish_epoch(self) -> None:
        self._record.finish(self.dataset.live)
        self.dataset.live = None

    def _batches(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        if self.num_workers == 0:
            for batch, state, _ in self.dataset:
                yield batch, state
            return
        loader = DataLoader(
            self.dataset,
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=False,
            multiprocessing_context="spawn",
            collate_fn=_as_delivered,
        )
        resumed = time.perf_counter()
        for batch, state, report in loader:
            now = time.perf_counter()
            self._record.report(report)
            self._record.delivered(len(batch["label"]), resumed, now)
            yield batch, state
            resumed = time.perf_counter()
            self._record.stepped(now, resumed)

    def _prepare(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Pin and move the batch's tensors (those in a list too); the rest stays as it is."""
        out: dict[str, Any] = {}
        for name, value in batch.items():
            if isinstance(value, torch.Tensor):
                if name == "image" and self.channels_last and value.ndim == 4:
                    value = value.permute(0, 3, 1, 2)
                value = self._placed(value)
            elif isinstance(value, list):
                value = [self._placed(v) if isinstance(v, torch.Tensor) else v for v in value]
            out[name] = value
        return out

    def _placed(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.pin_memory:
            tensor = tensor.pin_memory()
        if self.device is not None:
            tensor = tensor.to(self.device, non_blocking=self.pin_memory)
        return tensor

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.close()
        running = self._deliveries()
        self._running = weakref.ref(running)
        return running

    def _deliveries(self) -> Generator[dict[str, Any], None, None]:
        stream: Any = None
        if self.device is not None and self.device.type == "cuda":
            # torch.cuda.Stream's constructor carries no annotations.
            stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        upcoming: tuple[dict[str, Any], dict[str, Any]] | None = None
        try:
            for batch, state in self._batches():
                if stream is None:
                    self._state = state
                    yield self._prepare(batch)
                    continue
                with torch.cuda.stream(stream):
                    ready = (self._prepare(batch), state)
                if upcoming is not None:
                    yield self._deliver(upcoming, stream)
                upcoming = ready
            if upcoming is not None and stream is not None:
                yield self._deliver(upcoming, stream)
        except GeneratorExit:
            self._finish_epoch()  # stopped early: its work still counts
            raise
        # The epoch is over: the next iteration, and a state saved now, start the next one.
        self._state = None
        self.dataset.resume = None
        self.dataset.epoch += 1
        self._finish_epoch()

    def _deliver(
        self, upcoming: tuple[dict[str, Any], dict[str, Any]], stream: Any
    ) -> dict[str, Any]:
        batch, state = upcoming
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for value in batch.values():
            for tensor in each_tensor(value):
                tensor.record_stream(torch.cuda.current_stream(self.device))
        self._state = state
        return batch

    def close(self) -> None:
        """Stop an iteration under way: its decode threads, or its DataLoader's workers.

        Iterating again starts anew (from :meth:`state_dict`'s position).
        """
        running = self._running() if self._running is not None else None
        self._running = None
        if running is not None:
            running.close()

    def __enter__(self) -> TorchLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
