"""The I/O engine: runs coroutines for sync callers and shuts down without crashing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import CancelledError

import pytest

from stoker.storage import open_store
from stoker.storage.engine import IOEngine, default_engine
from stoker.testing.forks import in_forked_child
from stoker.testing.netproxy import FaultConfig


def test_run_and_submit() -> None:
    engine = IOEngine(max_in_flight=2)
    try:

        async def double(x: int) -> int:
            await asyncio.sleep(0)
            return 2 * x

        assert engine.run(double(21)) == 42
        futures = [engine.submit(double(i)) for i in range(10)]
        assert [f.result() for f in futures] == [2 * i for i in range(10)]
    finally:
        engine.close()
    assert engine.closed
    with pytest.raises(RuntimeError, match="closed"):
        engine.run(asyncio.sleep(0))


def test_slots_bound_concurrency() -> None:
    engine = IOEngine(max_in_flight=3)
    peak = 0
    active = 0

    async def job() -> None:
        nonlocal peak, active
        async with engine.slot():
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.01)
            active -= 1

    async def many() -> None:
        await asyncio.gather(*(job() for _ in range(20)))

    try:
        engine.run(many())
    finally:
        engine.close()
    assert peak == 3


def test_errors_propagate_with_their_type() -> None:
    engine = IOEngine()
    try:

        async def fail() -> None:
            raise KeyError("inside")

        with pytest.raises(KeyError, match="inside"):
            engine.run(fail())
    finally:
        engine.close()


def test_bad_limit() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        IOEngine(max_in_flight=0)


def test_exit_with_requests_in_flight_is_clean(s3_bucket) -> None:
    """Leaving the interpreter while obstore requests are pending must exit 0, not abort."""
    s3_bucket.store().put("k", b"x" * 1000)
    script = textwrap.dedent(
        f"""
        import sys, time
        from stoker.storage import open_store
        store = open_store("{s3_bucket.url}", storage_options={s3_bucket.options()!r})
        futures = [store.engine.submit(store.get_async("k")) for _ in range(500)]
        time.sleep(float(sys.argv[1]))
        """
    )
    for delay in ("0", "0.005", "0.02", "0.05"):
        done = subprocess.run(
            [sys.executable, "-c", script, delay],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, (delay, done.returncode, done.stderr[-2000:])


def test_close_lets_cancelled_tasks_unwind_before_the_loop_stops() -> None:
    """A task cancelled by close() may need several loop turns to unwind (a gather, a
    finally that awaits): the loop runs them all, so none is destroyed pending at exit
    ("Task was destroyed but it is pending!") and no error goes unseen."""
    engine = IOEngine()

    async def leaf() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.02)  # cleanup that awaits (closing a connection, say)

    async def outer() -> list[None]:
        return await asyncio.gather(*(leaf() for _ in range(4)))

    futures = [engine.submit(outer()) for _ in range(3)]
    time.sleep(0.05)
    engine.close()
    assert not asyncio.all_tasks(engine.loop)
    assert all(future.cancelled() for future in futures)


def test_an_idle_engine_closes_without_the_native_grace(monkeypatch) -> None:
    # The grace lets native request threads drop their last references after a request;
    # it is counted from the last request's end, so an idle engine does not pay it again.
    from stoker.storage import engine as engine_module

    slept: list[float] = []
    engine = IOEngine(max_in_flight=2)

    async def request() -> int:
        return 7

    async def tracked() -> int:
        return await engine.track(request())

    assert engine.run(tracked()) == 7
    time.sleep(engine_module._NATIVE_GRACE_S + 0.05)
    monkeypatch.setattr(engine_module.time, "sleep", slept.append)
    engine.close()
    assert slept == [0.0]


def test_abort_wakes_a_caller_stuck_on_a_request(s3_bucket, proxy) -> None:
    """A request stalled by the server (its body never comes) would hold its caller for the
    client's timeout; abort() cancels it, the caller gets CancelledError, and close() has
    nothing left to wait for."""
    s3_bucket.store().put("k", b"x" * 10_000)
    proxy.set_faults(FaultConfig(fault_rate=1.0, kinds=("stall",)))
    engine = IOEngine()
    store = open_store(
        s3_bucket.url, storage_options=s3_bucket.options(proxy.endpoint), engine=engine
    )
    outcome: list[BaseException | bytes] = []

    def caller() -> None:
        try:
            outcome.append(bytes(engine.run(store.get_async("k"))))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    while proxy.stats().faults["stall"] == 0:  # an event, not a time: the request is held
        time.sleep(0.01)
    engine.abort()
    thread.join(10)  # a hang guard: the stall lasts the client's 30 s timeout
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], CancelledError | asyncio.CancelledError)
    assert engine.aborted
    with pytest.raises(CancelledError):  # an aborted engine runs no more requests
        engine.run(store.get_async("k"))
    engine.close(timeout_s=30.0)
    assert engine.closed


def test_ctrl_c_in_run_cancels_the_stuck_request_and_the_engine_goes_on(s3_bucket, proxy) -> None:
    """KeyboardInterrupt while run() waits on a stalled request: the request is cancelled
    (nothing left for close() to wait for) and the engine still serves (a notebook)."""
    s3_bucket.store().put("k", b"x" * 10_000)
    proxy.set_faults(FaultConfig(fault_rate=1.0, kinds=("stall",)))
    engine = IOEngine()
    options = s3_bucket.options(proxy.endpoint)
    store = open_store(s3_bucket.url, storage_options=options, engine=engine)

    interrupted = threading.Event()

    def interrupt_once_stalled() -> None:
        while proxy.stats().faults["stall"] == 0:  # an event, not a time
            time.sleep(0.01)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        while not interrupted.wait(5.0):  # again if it was lost (a CI run timed out once)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    assert threading.current_thread() is threading.main_thread()
    # Python's own Ctrl-C, whatever handler an earlier test in this process left behind.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    thread = threading.Thread(target=interrupt_once_stalled)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.run(store.get_async("k"))
    finally:
        interrupted.set()
        thread.join()
        signal.signal(signal.SIGINT, previous)

    async def pending() -> int:
        for _ in range(1000):  # loop turns for the cancelled request to unwind
            if not engine.in_flight:
                break
            await asyncio.sleep(0)
        return engine.in_flight

    assert engine.run(pending()) == 0
    assert not engine.aborted
    proxy.set_faults(FaultConfig())
    assert bytes(engine.run(store.get_async("k"))) == b"x" * 10_000
    engine.close()


def test_a_forked_child_runs_the_engine_anew_with_every_slot_free() -> None:
    """fork() while a coroutine holds the engine's only slot: in the child the same engine
    object runs (stores and prefetchers made in the parent hold it) on a loop of its own,
    with every slot free; the parent's coroutine goes on untouched."""
    engine = IOEngine(max_in_flight=1)
    holding = threading.Event()

    async def hold() -> None:
        async with engine.slot():
            holding.set()
            await asyncio.sleep(60)

    async def take_the_slot() -> int:
        async with engine.slot():
            return os.getpid()

    held = engine.submit(hold())
    try:
        assert holding.wait(10)
        child = in_forked_child(lambda: engine.run(take_the_slot()), timeout_s=30)
        assert child != os.getpid()
        assert not held.done()
    finally:
        engine.close(timeout_s=5)
    assert held.cancelled()


def test_the_default_engine_is_one_object_in_parent_and_child() -> None:
    engine = default_engine()
    assert engine.run(asyncio.sleep(0, result=1)) == 1

    def child() -> tuple[bool, int]:
        return default_engine() is engine, engine.run(asyncio.sleep(0, result=2))

    assert in_forked_child(child, timeout_s=30) == (True, 2)
