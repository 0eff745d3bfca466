"""The I/O engine: runs coroutines for sync callers and shuts down without crashing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest

from stoker.storage.engine import IOEngine


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
