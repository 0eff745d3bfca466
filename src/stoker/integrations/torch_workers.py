"""What persistent DataLoader workers need: where each iteration starts, and a first batch
made ahead, the first worker's first.

A DataLoader with ``persistent_workers=True`` keeps its worker processes, and each
worker's copy of the dataset, from one iteration to the next: a ``set_epoch`` or a
restored state in the training process would never reach them. :class:`StartPoint` is a
small block of shared memory the training process writes before each iteration and every
worker reads when its iteration starts. :class:`NextEpoch` makes a worker's first batch
of the next epoch while the worker waits for it to be asked for. The DataLoader asks worker
0 first, so that batch comes first: the other workers wait for it (:class:`FirstBatches`)
while worker 0 decodes it on every core they leave. :func:`refuse_bootstrap`
turns multiprocessing's bootstrapping error into one that says what to change.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import get_spawning_popen
from typing import Any

#: Bytes of the shared start point: a JSON object of an epoch and a Loader state (a few
#: integers, and a pair per earlier world size of the epoch).
START_POINT_BYTES = 4096
_LENGTH_BYTES = 4
#: At exit, how long to wait for a first batch of the next epoch still being made.
EXIT_WAIT_S = 10.0
#: The longest a worker waits for worker 0's first batch of an epoch before making its own
#: (worker 0 reading cold data, or gone).
LEAD_WAIT_S = 5.0
_POLL_S = 0.002


class SharedWithWorkers:
    """A block of shared memory (``_shared``) that travels to a worker process when the
    worker is started (spawned or forked); pickled at any other time, the object becomes a
    private copy, made by ``__init__(**fields)`` from what :meth:`_copied` says."""

    _shared: Any

    def _copied(self) -> dict[str, Any]:
        """The keyword arguments that make a private copy."""
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is not None:  # starting a worker: share the memory
            return {"shared": self._shared}
        return {"fields": self._copied()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "shared" in state:
            self._shared = state["shared"]
        else:
            self.__init__(**state["fields"])  # type: ignore[misc]  # a private copy


class StartPoint(SharedWithWorkers):
    """Where the next iteration starts, shared with worker processes.

    Holds ``epoch``, ``resume`` (a :meth:`stoker.Loader.state_dict` to continue from, or
    None) and ``max_events`` (the timeline to keep, or None). The shared memory travels to
    a worker when the worker is started (spawned or forked); pickled at any other time, a
    start point becomes a private copy.
    """

    def __init__(self, **fields: Any) -> None:
        # Lock-free: written only between iterations, read when one starts (the DataLoader
        # asks its workers to start after the write).
        self._shared = multiprocessing.get_context("spawn").RawArray("B", START_POINT_BYTES)
        self._write({"epoch": 0, "resume": None, "max_events": None, **fields})

    def _copied(self) -> dict[str, Any]:
        return self.read()

    def read(self) -> dict[str, Any]:
        """The fields."""
        view = memoryview(self._shared).cast("B")
        length = int.from_bytes(view[:_LENGTH_BYTES], "little")
        fields: dict[str, Any] = json.loads(bytes(view[_LENGTH_BYTES : _LENGTH_BYTES + length]))
        return fields

    def update(self, **fields: Any) -> None:
        """Change some fields.

        Raises:
            ValueError: The fields are too large to share (a state of hundreds of
                world-size changes in one epoch).
        """
        self._write({**self.read(), **fields})

    def _write(self, fields: dict[str, Any]) -> None:
        data = json.dumps(fields).encode()
        if len(data) > START_POINT_BYTES - _LENGTH_BYTES:
            raise ValueError(
                f"a loader state of {len(data)} bytes as JSON does not fit the "
                f"{START_POINT_BYTES - _LENGTH_BYTES} bytes shared with DataLoader workers"
            )
        view = memoryview(self._shared).cast("B")
        view[_LENGTH_BYTES : _LENGTH_BYTES + len(data)] = data
        view[:_LENGTH_BYTES] = len(data).to_bytes(_LENGTH_BYTES, "little")


class FirstBatches(SharedWithWorkers):
    """Which epoch's first batch worker 0 has made last, shared with the worker processes.

    Worker 0 writes it (:meth:`made`), the other workers wait on it (:meth:`wait`).
    """

    def __init__(self, epoch: int = -1) -> None:
        self._shared = multiprocessing.get_context("spawn").RawArray("q", 1)
        self._shared[0] = epoch

    def _copied(self) -> dict[str, Any]:
        return {"epoch": self._shared[0]}

    def made(self, epoch: int) -> None:
        """Worker 0 has made (or given up on) its first batch of ``epoch``."""
        self._shared[0] = epoch

    def wait(self, epoch: int, stop: threading.Event, timeout_s: float = LEAD_WAIT_S) -> bool:
        """Wait until worker 0 has made its first batch of ``epoch`` (or a later one), for
        at most ``timeout_s`` or until ``stop`` is set; whether it has."""
        deadline = time.monotonic() + timeout_s
        while self._shared[0] < epoch:
            if stop.wait(_POLL_S) or time.monotonic() > deadline:
                return False
        return True


class NextEpoch:
    """A worker's first batch of the next epoch, made on a thread while the worker is idle.

    Args:
        start: The state the batches start from (the next epoch's beginning).
        batches: The iteration that makes them (not yet started; it moves each batch's
            tensors into shared memory itself, on this thread).
        before: Called first, on the same thread, with an event set when the batches are
            no longer wanted (to wait for another worker's first batch).
        after: Called last, on the same thread, whether a batch was made or not.
    """

    def __init__(
        self,
        start: dict[str, Any],
        batches: Iterator[Any],
        *,
        before: Callable[[threading.Event], object] | None = None,
        after: Callable[[], None] | None = None,
    ) -> None:
        self.start = start
        self._batches = batches
        self._before, self._after = before, after
        self._unwanted = threading.Event()
        self._first: list[Any] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._make, name="stoker next epoch", daemon=True)
        self._thread.start()
        # A worker told to stop exits while this batch may be half made. A daemon thread
        # still running when the interpreter finalizes is ended by pthread_exit as it takes
        # the GIL back, unwinding through torch's C++ frames, which cannot unwind: "terminate
        # called without an active exception", and the worker dies of SIGABRT. So the exit
        # waits for it while the interpreter is whole (its decode threads are stopped by then:
        # the batch ends at its next decode, with an error nobody sees).
        atexit.register(self._wait_at_exit)

    def _wait_at_exit(self) -> None:
        self._unwanted.set()
        self._thread.join(EXIT_WAIT_S)

    def _join(self) -> None:
        self._thread.join()
        atexit.unregister(self._wait_at_exit)  # and let go of this object

    def _make(self) -> None:
        try:
            if self._before is not None:
                self._before(self._unwanted)
                if self._unwanted.is_set():
                    return
            self._first = [next(self._batches)]
        except StopIteration:
            pass
        except BaseException as exc:  # re-raised where the batch is asked for
            self._error = exc
        finally:
            if self._after is not None:
                self._after()

    def take(self) -> Iterator[Any]:
        """The batches: the one made ahead, then the rest (waits for the first if needed)."""
        self._join()
        if self._error is not None:
            raise self._error
        yield from self._first
        yield from self._batches

    def drop(self) -> None:
        """Forget the batches (another start was asked for)."""
        self._unwanted.set()
        self._join()
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


def refuse_bootstrap(what: str) -> None:
    """Raise a clear error when worker processes would start from a process that is itself
    still starting (a script without a ``__main__`` guard, run again by spawn or
    forkserver in each worker).

    Raises:
        RuntimeError: Saying what to add, or how to do without.
    """
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    raise RuntimeError(
        f"{what} would start worker processes while this process is itself a worker being "
        'started: the script that makes it has no `if __name__ == "__main__":` guard, so '
        "every worker (started by spawn or forkserver) runs it again from the top. Put the "
        'training code under `if __name__ == "__main__":` (or in a function called from '
        'there), or give multiprocessing_context="fork" (Linux), or use num_workers=0 '
        "(stoker's threads)"
    )
