"""shaping.wait_ms counts waits for the shaped request rate only, not the slow-start
window's queueing (the issue: 34-60 s of 'shaping' in epochs of 1-4 s, never throttled)."""

from __future__ import annotations

import asyncio

from stoker.storage.shaping import PrefixShaper, ShapingPolicy


def test_queueing_in_the_slow_start_window_is_not_a_shaping_wait() -> None:
    s = PrefixShaper(policy=ShapingPolicy())  # never throttled, no cap: no shaped rate

    async def run() -> list[float]:
        held = [await s.acquire() for _ in range(8)]  # the initial window, full
        queued = [asyncio.ensure_future(s.acquire()) for _ in range(4)]
        await asyncio.sleep(0.05)
        for _ in range(4):
            s.succeeded()
            s.release()
        waited = [w for _, w in await asyncio.gather(*queued)]
        return [w for _, w in held] + waited

    waits = asyncio.run(run())
    assert waits == [0.0] * 12  # what the store adds to shaping.wait_ms
    assert (s.waits, s.wait_s) == (0, 0.0)
    assert s.window_waits == 4
    assert s.window_wait_s > 0  # the waits are added up (their length is the clock's)


def test_a_cap_is_a_shaping_wait() -> None:
    s = PrefixShaper(policy=ShapingPolicy(), cap=100.0)

    async def run() -> float:
        total = 0.0
        for _ in range(6):
            total += (await s.acquire())[1]
            s.release()
        return total

    assert asyncio.run(run()) > 0.03  # 5 tokens at 100/s after the first
    assert s.waits >= 4
