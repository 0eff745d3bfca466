"""One attempt of an :class:`~stoker.storage.remote.ObstoreStore` request: paced by the
rate shaper of its prefix (:mod:`stoker.storage.shaping`), run in a slot of the I/O engine
and counted; and the per-process state it uses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from stoker.core.metrics import Counters
from stoker.storage.engine import IOEngine
from stoker.storage.hedge import HedgePolicy, Hedger
from stoker.storage.native import rebuild
from stoker.storage.retry import classify
from stoker.storage.shaping import PrefixShaper

T = TypeVar("T")


class Connection:
    """What a store uses in one process: its obstore client, counters and shapers."""

    __slots__ = ("counters", "hedger", "native", "reported_rate", "shapers")

    def __init__(self, native: Any, hedge: HedgePolicy | None) -> None:
        self.native = native  # None until a missing local folder is written to
        self.hedger = None if hedge is None else Hedger(hedge)
        self.counters = Counters()
        self.shapers: dict[str, PrefixShaper] = {}
        self.reported_rate = 0  # what counters["shaping.rate_per_s"] holds now

    def report(self, shaper: PrefixShaper) -> None:
        """Set ``shaping.rate_per_s`` (a level, not a total) to the rate of ``shaper``, the
        prefix last used."""
        rate = shaper.rate
        level = 0 if rate is None else max(1, round(rate))
        if level != self.reported_rate:
            self.counters.add("shaping.rate_per_s", level - self.reported_rate)
            self.reported_rate = level


def reconnect(opened: Any, hedge: HedgePolicy | None) -> Connection:
    # A process forked from the one that opened the store: the client made there runs on
    # the parent's obstore runtime, which did not survive the fork; make it again here.
    return Connection(None if opened is None else rebuild(opened), hedge)


async def shaped_attempt(
    call: Callable[[], Awaitable[T]],
    *,
    op: str,
    shaper: PrefixShaper,
    engine: IOEngine,
    here: Connection,
) -> T:
    """Run ``call`` once its shaper lets it go and an engine slot is free; tell the shaper
    whether the server throttled it."""
    sent_at, waited_s = await shaper.acquire()
    try:
        async with engine.slot():
            if shaper.outdated(sent_at):  # throttled while this one waited for a slot
                sent_at, more_s = await shaper.take_token()
                waited_s += more_s
            if waited_s > 0:
                here.counters.add("shaping.waits")
                here.counters.add("shaping.wait_ms", round(waited_s * 1000))
            here.counters.add(f"requests.{op}")
            try:
                result = await call()
            except Exception as exc:
                if classify(exc) == "throttle":
                    shaper.throttled(sent_at)
                else:
                    shaper.succeeded()  # the server answered: not over its limit
                here.report(shaper)
                raise
            shaper.succeeded()
            here.report(shaper)
            return result
    finally:
        shaper.release()
