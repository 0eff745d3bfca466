"""How fast the training step would run if data were free: the headspace check.

:func:`headspace` runs the user's own step on batches as the loader delivers them, keeping
them, then runs the same step on the same batches again from memory, where the data costs
nothing. The two times give what the step costs alone, what data costs on top of it, and
so how much faster training could go with a faster input pipeline (the headspace), with
no model of the step and no simulated accelerator::

    report = stoker.profile.headspace.headspace(loader, lambda batch: train_step(batch))
    print(report.summary())

The batches kept hold ``steps`` batches in memory. A step that depends on state it changes
(an optimizer) runs ``2 * steps`` times; time a copy of the model, or accept that the
replayed steps train it twice on the same batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Headspace:
    """What a headspace check measured.

    Attributes:
        steps: Batches timed, live and again replayed.
        live_s: Mean seconds an iteration took live: waiting for the batch, then the step.
        wait_s: Of which the mean wait for the batch (the loader's ``next()``).
        step_s: Mean seconds the step took on the replayed batches (data free).
        requests: Store requests made while the batches were replayed (0: the replay read
            nothing).
    """

    steps: int
    live_s: float
    wait_s: float
    step_s: float
    requests: int

    @property
    def speedup(self) -> float:
        """How many times faster an iteration would be with free data (1.0: none)."""
        return self.live_s / self.step_s if self.step_s > 0 else float("inf")

    @property
    def data_bound(self) -> bool:
        """Whether waiting for data costs more than a twentieth of each iteration."""
        return self.wait_s > 0.05 * self.live_s

    def summary(self) -> str:
        """One paragraph for a reader."""
        share = self.wait_s / self.live_s if self.live_s > 0 else 0.0
        verdict = (
            f"data-bound: {share:.0%} of each iteration waits for the batch; with data free "
            f"the step would run {self.speedup:.2f}x as fast"
            if self.data_bound
            else "step-bound: data is (nearly) free already; a faster loader gains nothing"
        )
        return (
            f"{self.steps} steps: {self.live_s * 1e3:.1f} ms an iteration live "
            f"({self.wait_s * 1e3:.1f} ms waiting for data), {self.step_s * 1e3:.1f} ms a step "
            f"on the same batches from memory; {verdict}."
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "speedup": self.speedup, "data_bound": self.data_bound}


def headspace(
    loader: Iterable[Any],
    step: Callable[[Any], Any],
    *,
    steps: int = 20,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> Headspace:
    """Time ``step`` on ``steps`` live batches of ``loader`` (after ``warmup`` untimed
    ones), then on the same batches replayed from memory (see the module docstring).

    Args:
        loader: A :class:`stoker.Loader`, or any iterable of batches (a ``TorchLoader``).
        step: The training step, called with each batch; its result is not kept.
        steps: Batches timed.
        warmup: Batches before the timed ones (connections, compilation, first reads).
        clock: The clock (``time.perf_counter``).

    Raises:
        ValueError: ``steps`` < 1 or ``warmup`` < 0, or the loader ran out of batches
            before ``warmup + steps``.
    """
    if isinstance(steps, bool) or steps < 1 or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got {steps} and {warmup}")
    batches: Iterator[Any] = iter(loader)
    try:
        for _ in range(warmup):
            step(_next(batches, warmup + steps))
        kept, waited = [], 0.0
        started = clock()
        for _ in range(steps):
            asked = clock()
            batch = _next(batches, warmup + steps)
            waited += clock() - asked
            step(batch)
            kept.append(batch)
        live = clock() - started
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    before = _requests(loader)
    started = clock()
    for batch in kept:
        step(batch)
    replayed = clock() - started
    return Headspace(
        steps=steps,
        live_s=live / steps,
        wait_s=waited / steps,
        step_s=replayed / steps,
        requests=_requests(loader) - before,
    )


def _next(batches: Iterator[Any], needed: int) -> Any:
    try:
        return next(batches)
    except StopIteration:
        raise ValueError(
            f"the loader gave fewer than warmup + steps = {needed} batches: ask for fewer"
        ) from None


def _requests(loader: Any) -> int:
    """Requests the loader's stores have made so far (0 where it does not say)."""
    stats = getattr(loader, "stats", None)
    if stats is None:
        return 0
    counters = stats().requests
    return int(sum(v for k, v in counters.items() if k.startswith("requests.")))
