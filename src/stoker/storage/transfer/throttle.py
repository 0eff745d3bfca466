"""A transfer's budget for a store that throttles everything (``TransferConfig.max_throttled_s``).

Each request retries a throttle within its own policy, and the rate shaper slows a prefix
down; neither bounds a transfer of many files, which went on for as long as its files took
to fail one by one (200 files: 450 s, saying nothing). :func:`within_throttle_budget` runs
the transfer and watches the shapers of its engine: once the store has answered every
request with a throttle for the budget, none served, it cancels the transfer (which removes
its partial files as it unwinds) and raises :class:`~stoker.errors.RetriesExhaustedError`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from stoker.errors import RetriesExhaustedError
from stoker.storage.shaping import Shapers

T = TypeVar("T")


async def within_throttle_budget(
    work: Coroutine[Any, Any, T],
    *,
    shapers: Shapers,
    budget_s: float,
    stopped: Callable[[], str],
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``work``; cancel it once ``shapers`` have seen nothing but throttles for
    ``budget_s`` seconds since it started.

    Args:
        work: The transfer.
        shapers: The rate shapers of the engine its requests run on.
        budget_s: Seconds of nothing but throttles to allow.
        stopped: Says what the cancelled transfer left (called after it has unwound), for
            the end of the error message.

    Raises:
        RetriesExhaustedError: The budget ran out.
    """
    task = asyncio.ensure_future(work)
    started = clock()
    poll_s = min(1.0, budget_s / 10)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            since = shapers.throttled_since()
            if since is None or clock() - max(since, started) < budget_s:
                continue
            task.cancel()
            await asyncio.wait({task})  # let it unwind: its partial files go
            if not task.cancelled():  # it ended by itself meanwhile
                return task.result()
            raise RetriesExhaustedError(
                f"the store is throttling: it answered every request with 503 SlowDown or 429 "
                f"for {budget_s:g} s and served none (max_throttled_s, --max-throttled-s); "
                f"{stopped()}"
            )
    except BaseException:
        task.cancel()  # interrupted: the transfer stops too
        raise
