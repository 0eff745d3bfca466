"""How a DataLoader worker's batch reaches the training process: its tensors in shared
memory (``/dev/shm``), or by value through the worker's pipe where that has no room.

A DataLoader worker puts each batch on a queue whose feeder thread moves the tensors into
shared memory as it pickles them. Where ``/dev/shm`` is too small (Docker's default is
64 MiB), that fails on the feeder thread, which prints the error and drops the batch: the
training process then waits forever for it, or ends the epoch with samples missing and
no error. So a worker moves a batch's tensors into shared memory itself, before handing
the batch over (:func:`hand_over`), where a failure is an exception of the iteration.
Where there is no room, :class:`TorchLoader <stoker.integrations.torch.TorchLoader>`'s
workers send the batch as a :class:`PipedBatch` (its tensors as bytes, copied through
the pipe: slower, never lost); in any other DataLoader the error says what to change.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stoker.integrations.torch_tensors import each_tensor

logger = logging.getLogger(__name__)

#: Where torch puts the tensors it shares between processes: a RAM file system.
SHM_DIR = Path("/dev/shm")  # noqa: S108  (a RAM file system, not a temp dir)
_MB = 1 << 20
_GB = 1 << 30
#: Batches a DataLoader worker has in flight at most: its ``prefetch_factor`` (2 by
#: default), one being made, one being read by the training process.
_IN_FLIGHT_PER_WORKER = 4


@dataclass(frozen=True, slots=True)
class ShmRoom:
    """The size of ``/dev/shm`` and its free bytes, as a worker saw them."""

    size: int
    free: int

    @classmethod
    def measure(cls) -> ShmRoom:
        """Now, or zeros where there is no ``/dev/shm``."""
        try:
            found = os.statvfs(SHM_DIR)
        except OSError:
            return cls(size=0, free=0)
        return cls(size=found.f_blocks * found.f_frsize, free=found.f_bavail * found.f_frsize)


@dataclass(frozen=True, slots=True)
class _TensorBytes:
    """A tensor by value: its bytes, dtype and shape (any dtype; numpy pickles the bytes)."""

    data: np.ndarray
    dtype: torch.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> _TensorBytes:
        flat = tensor.detach().contiguous().reshape(-1)
        return cls(flat.view(torch.uint8).numpy(), tensor.dtype, tuple(tensor.shape))

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.data).view(self.dtype).reshape(self.shape)


@dataclass(frozen=True, slots=True)
class PipedBatch:
    """A batch whose tensors travel by value through a DataLoader worker's pipe, with why:
    the batch's bytes and the room ``/dev/shm`` had."""

    fields: dict[str, Any]
    nbytes: int
    room: ShmRoom

    @classmethod
    def of(cls, batch: dict[str, Any], room: ShmRoom) -> PipedBatch:
        fields = {name: _by_value(value) for name, value in batch.items()}
        return cls(fields, batch_bytes(batch), room)

    def batch(self) -> dict[str, Any]:
        """The batch, its tensors made again (without a copy of their bytes)."""
        return {name: _tensors_again(value) for name, value in self.fields.items()}


def _by_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _TensorBytes.of(value)
    if isinstance(value, list):
        return [_TensorBytes.of(v) if isinstance(v, torch.Tensor) else v for v in value]
    return value


def _tensors_again(value: Any) -> Any:
    if isinstance(value, _TensorBytes):
        return value.tensor()
    if isinstance(value, list):
        return [v.tensor() if isinstance(v, _TensorBytes) else v for v in value]
    return value


def batch_bytes(batch: dict[str, Any]) -> int:
    """Bytes of a batch's tensors."""
    return sum(t.numel() * t.element_size() for value in batch.values() for t in each_tensor(value))


def hand_over(
    batch: dict[str, Any], *, pipe: bool, workers: int = 1
) -> dict[str, Any] | PipedBatch:
    """A worker's batch ready to hand over: its tensors moved into shared memory, or, where
    ``/dev/shm`` has no room and ``pipe`` is true, a :class:`PipedBatch`. ``workers``: how
    many DataLoader workers share ``/dev/shm`` (for the size the message asks for).

    Raises:
        OSError: ``ENOSPC``: ``/dev/shm`` has no room for the batch and ``pipe`` is false;
            the message says how big it is, the batch, and what to change.
    """
    try:
        for value in batch.values():
            for tensor in each_tensor(value):
                tensor.share_memory_()  # type: ignore[no-untyped-call]  # unannotated in torch
    except (RuntimeError, OSError) as exc:
        if not _no_room(exc):
            raise
        room = ShmRoom.measure()
        if pipe:
            return PipedBatch.of(batch, room)
        message = no_room_message(batch_bytes(batch), room, workers=workers)
        raise OSError(errno.ENOSPC, message) from exc
    return batch


def _no_room(exc: BaseException) -> bool:
    """Whether ``exc`` says shared memory is full (torch raises a RuntimeError with the
    ``strerror`` in its message)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    return os.strerror(errno.ENOSPC) in str(exc)


def no_room_message(nbytes: int, room: ShmRoom, *, workers: int) -> str:
    """Why a batch of ``nbytes`` did not fit in ``/dev/shm``, and what to change (room for
    ``workers`` workers' batches in flight)."""
    need = nbytes * _IN_FLIGHT_PER_WORKER * workers
    size_gb = max(1, -(-need // _GB))
    return (
        f"{SHM_DIR} has no room for a DataLoader worker's batch of {nbytes / _MB:.1f} MiB: "
        f"it is {room.size / _MB:.0f} MiB, {room.free / _MB:.0f} MiB of it free (Docker's "
        "default is 64 MiB). Workers hand their batches to the training process through "
        f"shared memory, up to {_IN_FLIGHT_PER_WORKER} batches each at once. Give it more "
        f"room (docker run --shm-size={size_gb}g, or shm_size in Docker Compose; Kubernetes: "
        "an emptyDir volume with medium: Memory mounted at /dev/shm), or use a smaller "
        "batch_size or fewer workers, or num_workers=0 (stoker's threads need no shared "
        "memory)"
    )


def warn_piped(batch: PipedBatch, workers: int) -> None:
    """Say once, in the training process, that batches come through pipes, and why."""
    logger.warning(
        "%s. Meanwhile TorchLoader's workers send the batches that do not fit through "
        "pipes instead (a copy more: slower, and no sample is lost)",
        no_room_message(batch.nbytes, batch.room, workers=workers),
    )


class Arrivals:
    """The batches of each iteration as they reach the training process from the workers:
    each must be the epoch's next (a batch lost on the way is an error, not an epoch with
    samples missing), and those sent by value become tensors again (said once a loader).

    Args:
        workers: The DataLoader's worker processes (for messages).
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.warned = False  # the training process was told of batches sent by value
        self.epoch = 0
        self.position: int | None = None  # the epoch's batches delivered
        self.total: int | None = None

    def restart(self, *, epoch: int, position: int | None, total: int | None) -> None:
        """Expect an iteration's batches.

        Args:
            epoch: The epoch they are of.
            position: Batches of the epoch delivered before the first, or None where the
                first to arrive sets the count (an epoch resumed on another world size
                counts its batches anew, from the samples the old ranks left).
            total: Batches of the whole epoch, or None where that is not known.
        """
        self.epoch, self.position, self.total = epoch, position, total

    def received(self, batch: Any, state: dict[str, Any]) -> dict[str, Any]:
        """The batch, as tensors.

        Raises:
            RuntimeError: A batch before it never arrived.
        """
        position = int(state["batches"])
        if self.position is not None and position != self.position + 1:
            raise RuntimeError(self._lost(self.position, position - 2))
        self.position = position
        if not isinstance(batch, PipedBatch):
            return dict(batch)
        if not self.warned:
            warn_piped(batch, self.workers)
            self.warned = True
        return batch.batch()

    def ended(self) -> None:
        """The DataLoader says the epoch is over.

        Raises:
            RuntimeError: Its last batches never arrived.
        """
        done = self.position or 0
        if self.total is not None and done < self.total:
            raise RuntimeError(self._lost(done, self.total - 1))

    def _lost(self, first: int, last: int) -> str:
        """Batches ``first`` to ``last`` (of the epoch, counted from 0) never came."""
        which = f"batch {first}" if first == last else f"batches {first} to {last}"
        return (
            f"TorchLoader: {which} of epoch {self.epoch} (counted from 0) never arrived from "
            "the DataLoader workers: a worker could not hand its batch over (its error is "
            "printed above: a full /dev/shm, or a field the DataLoader cannot pickle), and the "
            "epoch would end without those samples"
        )
