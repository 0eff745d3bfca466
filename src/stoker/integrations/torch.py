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
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from stoker.format.reader import ShardDataset, open_dataset
from stoker.pipeline.loader import Loader


def detect_world() -> tuple[int, int]:
    """``(rank, world_size)`` from an initialised ``torch.distributed``, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def to_tensors(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Numpy arrays of a batch as tensors (no copy); images stay ``(N, H, W, 3)`` uint8."""
    return {
        name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        for name, value in batch.items()
    }


class StokerIterableDataset(IterableDataset[dict[str, Any]]):
    """Whole batches from a packed dataset, split by rank and DataLoader worker.

    Use with ``DataLoader(dataset, batch_size=None, num_workers=k)``. Each worker opens its
    own loader (stores are opened lazily, so nothing unpicklable crosses processes) and
    makes batches ``w, w + k, ...`` of the rank's epoch, so the DataLoader's in-order output
    is the same batch sequence whatever ``k`` is.

    Args:
        url: Dataset URL.
        batch_size: Samples per batch.
        **loader_options: Passed to :class:`stoker.Loader` (transform, seed, shuffle, ...).
    """

    def __init__(self, url: str, *, batch_size: int, **loader_options: Any) -> None:
        super().__init__()
        self.url = url
        self.batch_size = batch_size
        self.options = dict(loader_options)
        rank, world = detect_world()
        self.options.setdefault("rank", rank)
        self.options.setdefault("world_size", world)
        self.epoch = 0
        self.resume: dict[str, Any] | None = None  # a Loader state to continue from
        self._opened: ShardDataset | None = None  # this process's open dataset

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes open the dataset themselves; open stores do not travel.
        state = dict(self.__dict__)
        state["_opened"] = None
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

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        options = {**self.options, "worker": worker, "num_workers": workers}
        if info is not None:
            options["num_threads"] = options.get("num_threads") or 1
        with Loader(self.opened(), batch_size=self.batch_size, **options) as loader:
            loader.set_epoch(self.epoch)
            if self.resume is not None:
                loader.load_state_dict(self.resume)
            for batch in loader:
                yield to_tensors(batch)


class TorchLoader:
    """Batches of tensors for a training loop, optionally pinned and on ``device``.

    Args:
        url: Dataset URL.
        batch_size: Samples per batch.
        num_workers: 0 runs stoker's threaded pipeline in this process (best for the
            built-in transforms); ``k > 0`` runs it in ``k`` DataLoader worker processes.
        pin_memory: Pin batches in page-locked memory (for fast, asynchronous copies).
        device: Move batches there; on CUDA the copy of batch ``i + 1`` overlaps step ``i``.
        channels_last: Images as ``(N, 3, H, W)`` views instead of ``(N, H, W, 3)``.
        **loader_options: Passed to :class:`stoker.Loader` (transform, seed, shuffle,
            drop_last, cache_dir, storage_options, ...).
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
        **loader_options: Any,
    ) -> None:
        self.dataset = StokerIterableDataset(url, batch_size=batch_size, **loader_options)
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.device = torch.device(device) if device is not None else None
        self.channels_last = channels_last
        self._delivered = 0
        self._epoch = 0
        self._segments: list[list[int]] = []  # earlier world sizes in this epoch
        self._probe = Loader(self.dataset.opened(), batch_size=batch_size, **self.dataset.options)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``."""
        if epoch != self._epoch:
            self._epoch = epoch
            self._delivered = 0
            self._segments = []
        self.dataset.set_epoch(epoch)
        self._probe.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._probe)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "batches", "batch_size", "seed", "world_size", "segments"}``."""
        state = self._probe.state_dict()
        state.update(epoch=self._epoch, batches=self._delivered, segments=self._segments)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the last batch ``state`` counted, with any number of workers, and
        on any world size (see :meth:`stoker.Loader.load_state_dict`)."""
        self._probe.load_state_dict(state)
        resumed = self._probe.state_dict()
        self._epoch = resumed["epoch"]
        self._delivered = resumed["batches"]
        self._segments = resumed["segments"]
        self.dataset.epoch = self._epoch
        self.dataset.resume = dict(state)

    def _batches(self) -> Iterator[dict[str, Any]]:
        if self.num_workers == 0:
            yield from self.dataset
            return
        loader = DataLoader(
            self.dataset,
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=False,
            multiprocessing_context="spawn",
        )
        yield from loader

    def _prepare(self, batch: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in batch.items():
            if isinstance(value, torch.Tensor):
                if name == "image" and self.channels_last and value.ndim == 4:
                    value = value.permute(0, 3, 1, 2)
                if self.pin_memory:
                    value = value.pin_memory()
                if self.device is not None:
                    value = value.to(self.device, non_blocking=self.pin_memory)
            out[name] = value
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        stream: Any = None
        if self.device is not None and self.device.type == "cuda":
            # torch.cuda.Stream's constructor carries no annotations.
            stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        upcoming: dict[str, Any] | None = None
        for batch in self._batches():
            if stream is not None:
                with torch.cuda.stream(stream):
                    ready = self._prepare(batch)
                if upcoming is not None:
                    yield self._deliver(upcoming, stream)
                upcoming = ready
            else:
                self._delivered += 1
                yield self._prepare(batch)
        if upcoming is not None and stream is not None:
            yield self._deliver(upcoming, stream)
        self._delivered = 0
        self._segments = []
        self.dataset.resume = None

    def _deliver(self, batch: dict[str, Any], stream: Any) -> dict[str, Any]:
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for value in batch.values():
            if isinstance(value, torch.Tensor):
                value.record_stream(torch.cuda.current_stream(self.device))
        self._delivered += 1
        return batch
