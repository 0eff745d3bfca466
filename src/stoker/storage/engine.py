"""The process's async I/O engine: one event loop in a background thread.

Every object-store request runs on this loop, so many requests are in flight at once while
the callers stay synchronous. The number of requests in flight is bounded by
``max_in_flight``; each request takes a slot with :meth:`IOEngine.slot`.

Shutting down safely matters: obstore completes its futures from Rust threads, and closing the
loop while one is still pending makes the interpreter abort (exit 134) or crash at exit.
:meth:`IOEngine.close` therefore waits for every pending request first and leaves the loop
unclosed if one is still running at the deadline. Every engine still open is closed at exit.

Ctrl-C must not wait for that: :meth:`IOEngine.abort` (and :func:`abort_all`, which the CLI
calls from its SIGINT handler) cancels every request in flight, native ones included, so the
callers blocked on them wake at once and the engine closes without waiting for the network.

An engine belongs to one process at a time (see :mod:`stoker.core.perprocess`): in a process
forked from its own, its loop, thread, request slots and rate shapers are made anew on first
use, so a child starts with every slot free and no request of its parent's pending. Objects
that hold an engine (stores, prefetchers) therefore keep working in a forked child. A future
the parent was handed is the parent's: nothing completes it in the child, so what holds one
across a fork drops it (a Loader's read-ahead does).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from stoker.core.perprocess import PerProcess
from stoker.storage.shaping import Shapers

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_IN_FLIGHT = 128
_NATIVE_GRACE_S = 0.25


class _Running:
    """An engine's loop, thread and requests in one process."""

    def __init__(self, max_in_flight: int, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.slots = asyncio.Semaphore(max_in_flight)
        self.shapers = Shapers()
        self.pending: set[asyncio.Future[Any]] = set()
        self.draining = False
        self.aborted = False
        self.tracked = 0
        self.last_done = 0.0  # time.monotonic() when a tracked request last completed
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def request_done(self, future: asyncio.Future[Any]) -> None:
        self.pending.discard(future)
        self.last_done = time.monotonic()

    def cancel_everything(self) -> None:
        for future in list(self.pending):
            future.cancel()
        for task in asyncio.all_tasks(self.loop):
            task.cancel()


class IOEngine:
    """An asyncio event loop on a daemon thread that runs coroutines for sync callers.

    Args:
        max_in_flight: Most requests that may be in flight at once across all stores that
            share this engine.
        name: Thread name, for debuggers and ``py-spy``.
    """

    def __init__(
        self, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, name: str = "stoker-io"
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._closed = False
        start = functools.partial(_Running, max_in_flight, name)
        self._process = PerProcess(start, initial=start())
        _live.add(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The engine's event loop in this process (runs on the engine thread)."""
        return self._process.get().loop

    @property
    def shapers(self) -> Shapers:
        """The request-rate shapers of every prefix the engine's stores send to."""
        return self._process.get().shapers

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the engine and return a concurrent future for its result."""
        if self._closed:
            coro.close()
            raise RuntimeError("the I/O engine is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._process.get().loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine and block until it returns (or raises)."""
        if not self._closed and threading.current_thread() is self._process.get().thread:
            coro.close()
            raise RuntimeError("IOEngine.run() called from the engine thread; await instead")
        future = self.submit(coro)
        try:
            return future.result()
        except KeyboardInterrupt:
            # Ctrl-C while waiting: stop the requests in flight rather than leave them
            # running (and an exit waiting for them); the engine stays usable (a notebook).
            self.cancel_in_flight()
            raise

    def slot(self) -> asyncio.Semaphore:
        """The semaphore that bounds requests in flight; use ``async with engine.slot():``."""
        return self._process.get().slots

    async def track(self, awaitable: Awaitable[T]) -> T:
        """Await a request made by native code, keeping it alive until it really completes.

        If the awaiting task is cancelled, the native request goes on (it cannot be stopped
        from Python) and :meth:`close` waits for it before the loop goes away.
        """
        running = self._process.get()
        if running.draining or running.aborted:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise asyncio.CancelledError("the I/O engine is shutting down")
        future = asyncio.ensure_future(awaitable)
        running.tracked += 1
        running.pending.add(future)
        future.add_done_callback(running.request_done)
        return await asyncio.shield(future)

    @property
    def in_flight(self) -> int:
        """Requests made by native code (:meth:`track`) not yet complete, in this process."""
        running = self._process.peek()
        return 0 if running is None else len(running.pending)

    @property
    def aborted(self) -> bool:
        """Whether :meth:`abort` was called (in this process)."""
        running = self._process.peek()
        return running is not None and running.aborted

    def abort(self) -> None:
        """Cancel every request in flight, native ones included, and refuse new ones.

        For an interrupt (Ctrl-C): callers blocked on a request get ``CancelledError`` at
        once instead of waiting for the network, and :meth:`close` has nothing left to wait
        for. obstore drops a cancelled request. Safe to call from any thread and from a
        signal handler; idempotent. The engine runs no more requests afterwards.
        """
        running = self._process.peek()  # not started in this process: nothing to cancel
        if running is None or running.aborted or self._closed:
            return
        running.aborted = True
        self.cancel_in_flight()

    def cancel_in_flight(self) -> None:
        """Cancel every request in flight, native ones included; new ones may follow.

        Their callers get ``CancelledError`` at once. Safe from any thread and from a signal
        handler (it only schedules the cancellations).
        """
        running = self._process.peek()
        if running is None or self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            running.loop.call_soon_threadsafe(running.cancel_everything)

    def close(self, *, timeout_s: float = 30.0) -> None:
        """Stop the engine after the requests in flight have finished.

        Work that has not started a request yet is cancelled; requests already made by
        native code are waited for (at most ``timeout_s``), because the interpreter must not
        tear down while one could still call back into it. If some are still running at the
        deadline, the loop is stopped but deliberately not closed. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        running = self._process.peek()  # an engine not started in this process has no loop
        if running is None or not running.thread.is_alive():
            return
        loop = running.loop

        async def drain() -> int:
            running.draining = True
            current = asyncio.current_task()
            cancelled = [
                t for t in asyncio.all_tasks() if t is not current and t not in running.pending
            ]
            for task in cancelled:
                task.cancel()
            deadline = loop.time() + timeout_s
            while running.pending and loop.time() < deadline:
                await asyncio.wait(set(running.pending), timeout=deadline - loop.time())
            # Let the cancelled tasks unwind (a gather in one takes several loop turns)
            # before the loop stops, so none is destroyed pending and every error is seen.
            if cancelled:
                await asyncio.wait(cancelled, timeout=max(0.1, deadline - loop.time()))
            return len(running.pending)

        try:
            still_pending = asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout_s + 5.0)
        except Exception:  # shutting down: report, and leave the loop open below
            logger.warning("I/O engine did not drain cleanly; leaving its loop open")
            still_pending = 1
        loop.call_soon_threadsafe(loop.stop)
        running.thread.join(timeout_s)
        if running.tracked:
            # obstore's runtime threads release their last Python references just after a
            # request's future resolves; under CPU load that can lag. Give them a moment
            # after the last one (the GIL is free while we sleep) so none is left to run
            # after finalization; an engine idle for longer than that closes at once.
            time.sleep(max(0.0, running.last_done + _NATIVE_GRACE_S - time.monotonic()))
        if still_pending == 0 and not running.thread.is_alive():
            loop.close()
        else:
            logger.warning("I/O engine stopped with %d requests still in flight", still_pending)


# Engines still open; all are closed at exit, before the interpreter tears down. A forked
# child inherits its parent's: closing one that never ran there only marks it closed.
_live: set[IOEngine] = set()
# One default engine for a process and the children forked from it, which each run it anew:
# so a store made in the parent and one made in the child share the child's slots.
_default: IOEngine | None = None
_default_lock = PerProcess(threading.Lock)  # one held at a fork would stay held in the child


def default_engine() -> IOEngine:
    """Return this process's shared I/O engine, starting it on first use."""
    global _default
    engine = _default
    if engine is not None and not engine.closed:
        return engine
    with _default_lock.get():
        if _default is None or _default.closed:
            _default = IOEngine()
        return _default


def abort_all() -> None:
    """Cancel the requests in flight on every engine of this process (see `IOEngine.abort`).

    Meant for a SIGINT handler: it takes no lock and only schedules the cancellations.
    """
    for engine in list(_live):
        engine.abort()


def _close_all() -> None:
    for engine in list(_live):
        engine.close()


atexit.register(_close_all)
