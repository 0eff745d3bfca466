"""Worker processes for Python-heavy transforms, running the per-sample function
(:mod:`stoker.pipeline.sample_decoder`).

Threads are the default (:class:`~stoker.pipeline.loader.Loader` ``method="thread"``): the
decoders release the GIL. A user transform written in Python holds the GIL, so
``method="process"`` runs :class:`SampleDecoder` in worker processes instead:

- workers start with ``spawn`` (safe with threads, CUDA and any platform), receive the
  decoder once, and take tasks (a slice of a batch: sample indices and their bytes) from a
  bounded queue;
- results travel through a shared-memory *arena* (a file in ``/dev/shm``, one slot per batch
  in flight). The parent unlinks the file as soon as every worker has mapped it, so nothing
  is left in ``/dev/shm`` whatever happens to the processes afterwards; results that do not
  fit their place in the arena, or all results when there is no room for an arena, come
  back through the result queue instead;
- before mapping, the arena's pages are reserved (``posix_fallocate``), so a small
  ``/dev/shm`` fails up front with a message, never with a ``SIGBUS`` mid-run;
- a worker's exception is re-raised in the consumer with the worker's traceback; a worker
  that dies is reported with its exit code; workers exit when their parent does.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import multiprocessing as mp
import os
import queue
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np

from stoker.pipeline.fields import MissingField
from stoker.pipeline.sample_decoder import Decoded, SampleDecoder, TransformTimer

__all__ = [
    "DEFAULT_SAMPLE_BYTES",
    "SHM_DIR",
    "Decoded",
    "ProcessDecoder",
    "SampleDecoder",
    "TransformTimer",
    "WorkerError",
    "slice_batch",
]

logger = logging.getLogger(__name__)

#: Where arenas live; a directory on a RAM file system.
SHM_DIR = Path("/dev/shm")  # noqa: S108  (a RAM file system, not a temp dir; names are unique)
#: Arena room per sample when the transform's output size is unknown.
DEFAULT_SAMPLE_BYTES = 1 << 20
_POLL_S = 1.0  # how often a waiting side checks that the other is alive


class WorkerError(RuntimeError):
    """A worker process raised an exception or died; the message has its traceback."""


@dataclass(frozen=True, slots=True)
class _Task:
    task: int
    slot: int
    epoch: int
    items: list[tuple[int, int, dict[str, Any]]]  # (position in batch, sample index, fields)


def _worker_main(
    decoder: SampleDecoder,
    arena_path: str | None,
    arena_bytes: int,
    slot_bytes: int,
    sample_bytes: int,
    tasks: Any,
    results: Any,
    parent: int,
) -> None:
    """A worker process: map the arena, say ready, then decode tasks until told to stop."""
    arena: mmap.mmap | None = None
    if arena_path is not None:
        fd = os.open(arena_path, os.O_RDWR)
        try:
            arena = mmap.mmap(fd, arena_bytes)
        finally:
            os.close(fd)
    results.put(("ready", os.getpid()))
    while True:
        try:
            task = tasks.get(timeout=_POLL_S)
        except queue.Empty:
            if os.getppid() != parent:  # the parent is gone: nobody will read our results,
                results.cancel_join_thread()  # so exit without flushing them into the pipe
                return
            continue
        if task is None:
            return
        try:
            cpu_started = time.thread_time()
            timer = TransformTimer()
            out: list[tuple[int, str, Any, dict[str, Any]]] = []
            for position, index, fields in task.items:
                place = None
                if arena is not None and (position + 1) * sample_bytes <= slot_bytes:
                    # A batch larger than its slot (the arena was sized by the first) sends
                    # the rest inline.
                    offset = task.slot * slot_bytes + position * sample_bytes
                    place = memoryview(arena)[offset : offset + sample_bytes]
                try:
                    value, others = decoder(index, task.epoch, fields, None, timer)
                except ValueError as exc:
                    out.append((position, "error", (isinstance(exc, MissingField), str(exc)), {}))
                    continue
                array = np.ascontiguousarray(value) if isinstance(value, np.ndarray) else None
                if array is not None and place is not None and array.nbytes <= sample_bytes:
                    np.frombuffer(place, dtype=np.uint8, count=array.nbytes)[:] = array.view(
                        np.uint8
                    ).reshape(-1)
                    out.append((position, "arena", (array.shape, array.dtype.str), others))
                else:
                    out.append((position, "inline", value, others))
                del place
            decode_cpu = time.thread_time() - cpu_started - timer.cpu_seconds
            results.put(("done", task.task, (out, decode_cpu, timer.seconds)))
        except BaseException as exc:  # sent to the consumer, which re-raises it
            results.put(
                ("failed", task.task, f"{type(exc).__name__}: {exc}\n" + traceback.format_exc())
            )


class ProcessDecoder:
    """Worker processes that decode batch slices, with results in shared memory.

    Args:
        decoder: What each worker runs per sample (pickled once per worker).
        processes: Number of worker processes.
        slots: Batches that may be in flight at once.
        batch_size: Samples per slot of the arena (results of a larger batch's further
            samples come back inline).
        sample_bytes: Arena room per sample (the output size, if known).
        queue_depth: Bound of the task queue.
    """

    def __init__(
        self,
        decoder: SampleDecoder,
        *,
        processes: int,
        slots: int,
        batch_size: int,
        sample_bytes: int,
        queue_depth: int,
    ) -> None:
        self.processes = processes
        self.slots = slots
        self.sample_bytes = sample_bytes
        self.slot_bytes = batch_size * sample_bytes
        arena_bytes = slots * self.slot_bytes
        context = mp.get_context("spawn")
        self._tasks: Any = context.Queue(maxsize=queue_depth)
        # A script that never calls close() must still exit: at exit multiprocessing ends
        # the (daemon) workers, then waits for this queue's feeder thread, which would write
        # tasks queued ahead (the next epoch's, read ahead) into a pipe nobody reads anymore.
        self._tasks.cancel_join_thread()
        self._results: Any = context.Queue()
        self._next_task = 0
        self._workers: list[BaseProcess] = []
        self._done: dict[int, tuple[str, Any]] = {}
        self._free = list(range(slots))
        path = _reserve_arena(arena_bytes)
        self._arena: mmap.mmap | None = None
        try:
            if path is not None:
                fd = os.open(path, os.O_RDWR)
                try:
                    self._arena = mmap.mmap(fd, arena_bytes)
                finally:
                    os.close(fd)
            self._workers = [
                context.Process(
                    target=_worker_main,
                    args=(
                        decoder,
                        None if path is None else str(path),
                        arena_bytes,
                        self.slot_bytes,
                        sample_bytes,
                        self._tasks,
                        self._results,
                        os.getpid(),
                    ),
                    daemon=True,
                    name=f"stoker-decode-{n}",
                )
                for n in range(processes)
            ]
            for worker in self._workers:
                worker.start()
            ready = 0
            while ready < processes:
                try:
                    kind, *_ = self._get_result()
                except WorkerError as exc:
                    self.close()
                    raise WorkerError(
                        f"{exc}. A worker that dies while starting usually means the main "
                        "script runs the loader at import time: process mode starts workers "
                        "with spawn, which imports the main module, so guard the script with "
                        "`if __name__ == '__main__':`"
                    ) from None
                ready += kind == "ready"
        finally:
            if path is not None:  # every worker has mapped it (or failed): drop the name
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    @property
    def uses_shared_memory(self) -> bool:
        """Whether results come back through the shared-memory arena."""
        return self._arena is not None

    def acquire_slot(self) -> int:
        """A free arena slot for one batch (call :meth:`release_slot` after collecting)."""
        if not self._free:
            raise RuntimeError("internal error: more batches in flight than arena slots")
        return self._free.pop()

    def release_slot(self, slot: int) -> None:
        """Give a batch's slot back."""
        self._free.append(slot)

    def submit(self, slot: int, epoch: int, items: list[tuple[int, int, dict[str, Any]]]) -> int:
        """Queue one slice of a batch; returns its task number for :meth:`collect`."""
        task = self._next_task
        self._next_task += 1
        payload = [(position, index, _byte_fields(fields)) for position, index, fields in items]
        self._tasks.put(_Task(task, slot, epoch, payload))
        return task

    def collect(self, task: int, slot: int) -> tuple[list[tuple[int, Any]], float, float]:
        """Wait for a task: ``(position, (image, fields) or ValueError)`` per sample, the
        CPU seconds its worker spent outside a user transform, and the seconds spent in one.
        Arena results are copied out of shared memory.

        Raises:
            WorkerError: The task raised in its worker (with the worker's traceback), or a
                worker died.
        """
        while task not in self._done:
            kind, number, value = self._get_result()
            if kind in ("done", "failed"):
                self._done[number] = (kind, value)
        kind, value = self._done.pop(task)
        if kind == "failed":
            raise WorkerError(f"a decode worker failed:\n{value}")
        items, seconds, transform_s = value
        out: list[tuple[int, Any]] = []
        for position, how, result, others in items:
            if how == "error":
                missing, message = result
                out.append((position, MissingField(message) if missing else ValueError(message)))
            elif how == "arena" and self._arena is not None:
                shape, dtype = result
                array = np.empty(shape, dtype=np.dtype(dtype))
                offset = slot * self.slot_bytes + position * self.sample_bytes
                array.view(np.uint8).reshape(-1)[:] = np.frombuffer(
                    self._arena, dtype=np.uint8, count=array.nbytes, offset=offset
                )
                out.append((position, (array, others)))
            else:
                out.append((position, (result, others)))
        return out, seconds, transform_s

    def _get_result(self) -> tuple[Any, ...]:
        while True:
            try:
                return tuple(self._results.get(timeout=_POLL_S))
            except queue.Empty:
                dead = [w for w in self._workers if not w.is_alive()]
                if dead:
                    codes = ", ".join(f"{w.name} exit code {w.exitcode}" for w in dead)
                    raise WorkerError(
                        f"decode worker process died ({codes}); a crash in a transform or "
                        "running out of memory are the usual causes"
                    ) from None

    def close(self) -> None:
        """Stop the workers and unmap the arena."""
        for _ in self._workers:
            with contextlib.suppress(Exception):
                self._tasks.put(None, timeout=_POLL_S)
        for worker in self._workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
                worker.join()
        self._tasks.close()
        self._results.close()
        self._tasks.join_thread()
        self._results.join_thread()
        if self._arena is not None:
            self._arena.close()
            self._arena = None


def _byte_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """What a worker needs of a unit: its byte fields (and its members'), its label,
    which tells whether a ``cls`` member is the label (see :func:`decode_fields`), and a
    clip's packets (:class:`~stoker.format.video_decode.ClipPackets`: arrays and names)."""
    out: dict[str, Any] = {
        k: bytes(v) for k, v in fields.items() if isinstance(v, bytes | memoryview)
    }
    if "label" in fields:
        out["label"] = fields["label"]
    if "members" in fields:
        out["members"] = [_byte_fields(m) for m in fields["members"]]
    if "clip" in fields:
        out["clip"] = fields["clip"]
    if "error" in fields:
        out["error"] = str(fields["error"])
    return out


def _reserve_arena(nbytes: int) -> Path | None:
    """Create and reserve a shared-memory file of ``nbytes``; None (with a warning) if no room."""
    if not SHM_DIR.is_dir():
        logger.warning(
            "process mode: %s does not exist; results come back through pipes (slower)", SHM_DIR
        )
        return None
    path = SHM_DIR / f"stoker-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        os.close(fd)
        path.unlink()
        free = os.statvfs(SHM_DIR)
        logger.warning(
            "process mode needs %d MB of shared memory for batches in flight, but %s has only "
            "%d MB free (%s); results come back through pipes instead (slower). Give it more "
            "room (Docker: --shm-size=2g; Kubernetes: an emptyDir with medium Memory at "
            "/dev/shm), or use a smaller batch_size or prefetch",
            nbytes >> 20,
            SHM_DIR,
            free.f_bavail * free.f_frsize >> 20,
            exc.strerror,
        )
        return None
    os.close(fd)
    return path


def slice_batch(count: int, parts: int) -> Sequence[range]:
    """Split ``range(count)`` into at most ``parts`` contiguous, nearly equal slices."""
    step = -(-count // parts) if count else 1
    return [range(first, min(first + step, count)) for first in range(0, count, step)]
