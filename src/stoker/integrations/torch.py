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

Token sequences take the same adapter, with :class:`stoker.TokenLoader`'s settings:
``TorchLoader(url, seq_len=2048, batch_size=8, num_workers=2)`` gives ``input_ids``,
``labels`` (equal to ``input_ids``), ``targets`` and ``index`` as int64 tensors, each
worker making its share of the rank's sequences (docs/tokens.md).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Generator, Iterator, Mapping
from typing import Any, Unpack

import torch
from torch.utils.data import DataLoader

from stoker.core.checks import check_choice
from stoker.core.metrics import TraceEvent
from stoker.integrations.observe import RunRecord
from stoker.integrations.torch_dataset import StokerIterableDataset, detect_world
from stoker.integrations.torch_handover import Arrivals
from stoker.integrations.torch_tensors import each_tensor, to_tensors
from stoker.integrations.torch_workers import refuse_bootstrap
from stoker.integrations.worker_cache import WorkerCache
from stoker.pipeline.config import AdapterOptions, DecodeConfig
from stoker.pipeline.resume import resume_point
from stoker.pipeline.skips import SkipBudget
from stoker.pipeline.sources import SourceLike
from stoker.pipeline.stats import LoaderStats
from stoker.pipeline.world import World

__all__ = ["StokerIterableDataset", "TorchLoader", "detect_world", "to_tensors"]


def _as_delivered(item: Any) -> Any:
    """A DataLoader ``collate_fn`` that hands a worker's batch over as the worker made it
    (the default one would turn tuples and arrays in a field's objects into lists and tensors,
    unlike ``num_workers=0``)."""
    return item


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

    With ``num_workers=k`` the worker processes start with the first iteration and, by
    default, serve every epoch after it (as a DataLoader's ``persistent_workers``): the
    first batch of a later epoch pays no worker start, and each worker makes its first
    batch of the next epoch as soon as its share of this one is made. :meth:`close` (or
    leaving a ``with`` block) stops them. The workers hand batches over through shared
    memory (``/dev/shm``); a batch that does not fit comes through the worker's pipe
    instead, with a warning (once) saying how much room is needed and how to give it (see
    :mod:`stoker.integrations.torch_handover`), and a batch that never arrives is an error.
    ``DecodeConfig(max_skipped=...)`` holds over every worker of the rank: each batch
    brings its worker's skips, and the batch that takes the epoch's sum past the budget
    raises :class:`~stoker.errors.SkipBudgetError` here, listing them. Several workers
    read a bucket through one disk cache, so the node makes the requests one process
    makes: ``CacheConfig(dir=...)`` if given, else a temporary one of this loader's,
    removed when the workers stop (:mod:`stoker.integrations.worker_cache`).

    Args:
        source: What :class:`stoker.Loader` takes: a dataset URL or path, an unpacked
            folder of class folders, an opened dataset, several URLs, a
            :class:`~stoker.pipeline.config.SourceConfig`; with ``seq_len``, what
            :class:`stoker.TokenLoader` takes.
        batch_size: Samples (or sequences) per batch.
        num_workers: 0 runs stoker's threaded pipeline in this process (best for the
            built-in transforms); ``k > 0`` runs it in ``k`` DataLoader worker processes.
        persistent_workers: Keep the worker processes from one epoch to the next.
        multiprocessing_context: How worker processes start (``"spawn"``,
            ``"forkserver"`` or ``"fork"``). With spawn and forkserver each worker runs
            the training script again from the top: the script needs an
            ``if __name__ == "__main__":`` guard (without one, iterating raises an error
            saying so); ``"fork"`` (Linux) needs none.
        pin_memory: Pin the batches' tensors in page-locked memory (for fast, asynchronous
            copies); lists of strings and other objects stay as they are.
        device: Move the batches' tensors there (each tensor of a ragged field's list
            too); on CUDA the copy of batch ``i + 1`` overlaps step ``i``.
        channels_last: Images as ``(N, 3, H, W)`` views instead of ``(N, H, W, 3)``.
        **options: :class:`stoker.Loader`'s settings (``transform``, ``seed``, ``order``,
            ``drop_last``, ``decode``, ``cache``, ``storage_options``, ...), and
            :class:`stoker.TokenLoader`'s ``seq_len``, ``documents`` and ``dtype`` to read
            token sequences (``drop_last`` then defaults to true, as there); ``world``
            defaults to the rank of :func:`detect_world`.
    """

    def __init__(
        self,
        source: SourceLike,
        *,
        batch_size: int,
        num_workers: int = 0,
        persistent_workers: bool = True,
        multiprocessing_context: str = "spawn",
        pin_memory: bool = False,
        device: str | torch.device | None = None,
        channels_last: bool = False,
        **options: Unpack[AdapterOptions],
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        check_choice(
            "multiprocessing_context", multiprocessing_context, ("spawn", "forkserver", "fork")
        )
        self.dataset = StokerIterableDataset(source, batch_size=batch_size, **options)
        self.dataset.with_state = True
        self.dataset.fresh_state()  # a seed given twice, differently, raises now
        self.num_workers = num_workers
        self.persistent_workers = persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self._workers: DataLoader[Any] | None = None  # kept while its workers persist
        self._worker_cache = WorkerCache()  # what the workers share, where no cache is given
        self.pin_memory = pin_memory
        self.device = torch.device(device) if device is not None else None
        self.channels_last = channels_last
        self._state: dict[str, Any] | None = None  # the state after the last delivery
        self._record = RunRecord(in_process=num_workers == 0)
        # With workers, the failure budget of the rank is held here, over all of them.
        self._skips = SkipBudget(options.get("decode") or DecodeConfig(), source=self.dataset)
        self._arrivals = Arrivals(num_workers)  # the workers' batches, checked as they come
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

    @property
    def world(self) -> World:
        """This rank's place (its rank and world size; the workers' fields are theirs)."""
        return self.dataset.options.get("world") or World()

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "batches", "batch_size", "seed", "world_size", "segments",
        "skipped"}`` (``skipped``: the epoch's so far, over every worker)."""
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
            "skipped": int(state.get("skipped", 0)),
            **({"mix": state["mix"]} if "mix" in state else {}),  # each source's place
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

    def _finish(self) -> None:
        """Fold what the loaders (or workers) now stopping have done into the totals."""
        self._record.finish(self.dataset.live if self.num_workers == 0 else None)

    def _batches(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        if self.num_workers == 0:
            for batch, state, _ in self.dataset:
                yield batch, state
            return
        workers = self._start_workers()
        start = self.dataset.resume or self.dataset.fresh_state()  # what the workers read
        arrivals = self._expect(start)
        self._skips.restart(int(start["epoch"]), int(start.get("skipped", 0)))
        resumed = time.perf_counter()
        batches = iter(workers)
        while True:
            try:
                piece, state, report = next(batches)
            except StopIteration:
                arrivals.ended()
                break
            except RuntimeError as exc:
                if self._record.stats(None).batches or "exited unexpectedly" not in str(exc):
                    raise
                raise RuntimeError(
                    f"{exc}: a TorchLoader worker exited before its first batch (its "
                    "traceback is printed above). Under spawn or forkserver, a script "
                    'without an `if __name__ == "__main__":` guard is the usual cause'
                ) from exc
            batch = arrivals.received(piece, state)
            now = time.perf_counter()
            self._record.report(report)
            # The epoch's skips over every worker: past the budget, this batch is not given.
            self._skips.worker_reported(
                report.worker,
                state["skipped"],
                report.skips,
                epoch=state["epoch"],
                epoch_samples=report.stats.epoch_samples,
            )
            state = {**state, "skipped": self._skips.count}
            self._record.delivered(len(batch["index"]), resumed, now)
            yield batch, state
            resumed = time.perf_counter()
            self._record.stepped(now, resumed)
        if not self.persistent_workers:
            self._stop_workers()

    def _start_workers(self) -> DataLoader[Any]:
        """The DataLoader of the workers, made on first use (and after they stopped)."""
        if self._workers is None:
            refuse_bootstrap(f"TorchLoader(num_workers={self.num_workers})")
            self._worker_cache.open(
                self.dataset.options, self.dataset.source, workers=self.num_workers
            )
            self._workers = DataLoader(
                self.dataset,
                batch_size=None,
                num_workers=self.num_workers,
                persistent_workers=self.persistent_workers,
                multiprocessing_context=self.multiprocessing_context,
                collate_fn=_as_delivered,
            )
        return self._workers

    def _expect(self, start: dict[str, Any]) -> Arrivals:
        """The arrivals of this iteration's batches: from ``start`` (a state of another
        world size counts the rest of its epoch anew) to the epoch's end."""
        counted = not start["segments"] and start["world_size"] == self.world.world_size
        self._arrivals.restart(
            epoch=int(start["epoch"]),
            position=int(start["batches"]) if counted else None,
            total=len(self) if counted else None,
        )
        return self._arrivals

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
        self._stop_running()
        running = self._deliveries()
        self._running = weakref.ref(running)
        return running

    def _deliveries(self) -> Generator[dict[str, Any], None, None]:
        stream: Any = None
        if self.device is not None and self.device.type == "cuda":
            # torch.cuda.Stream's constructor carries no annotations.
            stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        upcoming: tuple[dict[str, Any], dict[str, Any]] | None = None
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
        # The epoch is over: the next iteration, and a state saved now, start the next one.
        self._state = None
        self.dataset.resume = None
        self.dataset.epoch += 1

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

    def _stop_running(self) -> None:
        running = self._running() if self._running is not None else None
        self._running = None
        if running is not None:
            running.close()

    def _stop_workers(self) -> None:
        workers, self._workers = self._workers, None
        if workers is not None:
            self._finish()
            shutdown = getattr(workers._iterator, "_shutdown_workers", None)
            if shutdown is not None:  # else the iterator stops them when collected
                shutdown()
            self._worker_cache.close(self.dataset.options)

    def close(self) -> None:
        """Stop an iteration under way, and the loader behind it: its decode threads, or
        its DataLoader's worker processes.

        Iterating again starts anew (from :meth:`state_dict`'s position), with new workers.
        """
        self._stop_running()
        if self.num_workers:
            self._stop_workers()
        elif self.dataset.live is not None:
            self._finish()
            self.dataset.close()

    def __enter__(self) -> TorchLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
