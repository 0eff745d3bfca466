"""Is the input pipeline the bottleneck, which stage, and what to change.

:func:`diagnose` runs a loader against a simulated training step and reads the answer off
the loader's own stage timings:

1. The consumer's time splits into waiting inside ``next()`` and its step. The share spent
   waiting is the input-bound share: above :data:`INPUT_BOUND_SHARE` the pipeline is the
   bottleneck, below it the model is (compute-bound).
2. While the consumer waits, the pipeline (running inside ``next()``) is blocked on
   something: the store (``wait.fetch``: a read group's requests have not come back), the
   decode threads (``wait.decode``, split between decoding and a user transform by their
   thread time) or assembling the batch (``collate``). The largest of these names the
   bottleneck, except decoding on idle threads behind a store with requests in flight
   most of the time: reads that arrive just in time leave every batch's decoding to wait
   for, and the reads are the bound. This attribution needs no model of the machine, so
   it holds on busy cores.
3. Where the waits fell: at the run's first batch, at the start of each later epoch (its
   first :data:`EPOCH_START_BATCHES` batches, at most a quarter of the epoch: a pipeline
   that drains between epochs waits
   there) or in the steady state; the verdict names the epoch starts when most of the
   waiting was there. And whether the resource waited on was saturated (decode threads or
   cores busy, requests in flight, at least :data:`SATURATED` of the time, or a machine
   loaded past its cores): a stage waited on
   but idle most of the time is named as not saturated (the pipeline runs it too late, not
   too slowly).

Alongside, the report gives each resource's load (how much of the time a request was in
flight, how busy the decode threads and the CPU were) and concrete advice with numbers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from stoker.core.metrics import Stage, StageTotals, TraceEvent
from stoker.pipeline.loader import Loader
from stoker.profile.advice import AdviceFor, advise
from stoker.profile.diagnosis import Bottleneck, Diagnosis
from stoker.profile.measure import Measured, Tally, close_window, run_batches
from stoker.storage.url import parse_url

__all__ = [
    "EPOCH_START_BATCHES",
    "INPUT_BOUND_SHARE",
    "SATURATED",
    "STAGE_OF",
    "Bottleneck",
    "Diagnosis",
    "diagnose",
]

#: Above this share of waiting, the consumer is input-bound.
INPUT_BOUND_SHARE = 0.10
#: Batches of each epoch after the first that count as its start.
EPOCH_START_BATCHES = 5
#: A resource busy at least this share of the time is saturated.
SATURATED = 0.7
#: The share of the waits on the store that names it the bound when the decoders, waited
#: on longer, were idle and requests in flight all along (see ``_bound``).
STORE_SHARE = 0.2
#: The longest simulated step: an hour (a measurement waits for several).
MAX_STEP_S = 3600

#: The stage behind each bottleneck, as ``loader.stats().stages`` names it.
STAGE_OF: dict[str, str] = {
    "store": Stage.FETCH,
    "decode": Stage.DECODE,
    "transform": Stage.TRANSFORM,
    "collate": Stage.COLLATE,
    "consumer": Stage.CONSUMER_STEP,
}


def _union_s(events: Sequence[TraceEvent], start: float, end: float) -> float:
    """Time within [start, end] covered by at least one of ``events``."""
    spans = sorted(
        (max(e.start_s, start), min(e.start_s + e.seconds, end))
        for e in events
        if e.start_s < end and e.start_s + e.seconds > start
    )
    covered = 0.0
    reach = start
    for lo, hi in spans:
        if hi > reach:
            covered += hi - max(lo, reach)
            reach = hi
    return covered


def diagnose(
    loader: Loader,
    *,
    step_s: float,
    max_batches: int | None = None,
    seconds: float | None = None,
    warmup_batches: int = 1,
    step: Literal["sleep", "spin"] = "sleep",
    max_events: int = 100_000,
    advice_for: AdviceFor = "python",
) -> Diagnosis:
    """Run ``loader`` against a simulated training step and say what limits it.

    Runs one epoch, or, with ``max_batches`` or ``seconds``, until either is reached
    (iterating the loader again for further epochs, as a training loop does: it moves on
    to the next epoch by itself). The first ``warmup_batches`` (opening connections,
    filling the prefetch queue) are left out of the measurement.

    Args:
        loader: The loader to examine; it keeps a timeline from now on (``Loader.trace``).
        step_s: Simulated training step per batch, in seconds.
        max_batches: Measure at most this many batches.
        seconds: Measure for about this long.
        warmup_batches: Batches before the measured window.
        step: ``"sleep"`` frees the core during the step, as waiting on an accelerator
            does; ``"spin"`` keeps one core busy, as a model trained on the CPU does.
        max_events: Length of the timeline kept.
        advice_for: Write the advice as ``stoker doctor`` flags (``"cli"``) or as the
            Loader's Python arguments.

    Raises:
        ValueError: Bad arguments, or the epoch has no batch after the warm-up.
    """
    if not 0 <= step_s <= MAX_STEP_S:
        raise ValueError(f"step_s must be a number of seconds in 0..{MAX_STEP_S}, got {step_s}")
    if warmup_batches < 0 or (max_batches is not None and max_batches < 1):
        raise ValueError("warmup_batches must be >= 0 and max_batches >= 1")
    if step not in ("sleep", "spin"):
        raise ValueError(f"step must be 'sleep' or 'spin', got {step!r}")
    loader.trace(max_events=max_events)
    origin = time.perf_counter()
    tally = Tally(
        warmup_batches=warmup_batches,
        # An epoch's start: its first batches, at most a quarter of it (a short epoch is no
        # more start than steady state).
        start_batches=min(EPOCH_START_BATCHES, len(loader) // 4),
        origin=origin,
        window_start=origin,
        before=loader.stats() if warmup_batches == 0 else None,
        cpu_before=time.process_time(),
    )
    iterator = run_batches(loader, tally, step_s=step_s, step=step, limits=(max_batches, seconds))
    measured = close_window(loader, tally, iterator, step_s=step_s, step=step)
    return _conclude(loader, advice_for, measured)


def _saturation(bottleneck: Bottleneck, load: dict[str, float]) -> tuple[bool | None, str]:
    """Whether the resource behind ``bottleneck`` was saturated, and its load in words
    (None: no such measure, as for a transform holding the GIL or collating)."""
    if bottleneck == "store":
        busy = load["store"]
        return busy >= SATURATED, f"requests in flight {100 * busy:.0f}% of the time"
    if bottleneck == "decode":
        # Decoding is timed in CPU seconds: on cores other processes hold, a thread waiting
        # for one looks idle, so a machine loaded past its cores counts as saturated.
        busy = max(load["decode_threads"], load["cpu"])
        saturated = busy >= SATURATED or load["machine"] >= 1.0
        return saturated, f"decode threads {100 * load['decode_threads']:.0f}% busy"
    return None, ""


def _bound(waits: dict[Bottleneck, float], load: dict[str, float]) -> Bottleneck:
    """The stage that bounds the pipeline: the one waited on longest, unless that is
    decoding with its threads idle most of the time while requests were in flight most of
    it and the store was waited on too (at least :data:`STORE_SHARE` of the waits).

    A batch whose reads arrive just in time is decoded only then, so the loop waits for its
    decoding after every read: on a store that bounds the run, ``wait.decode`` can pass
    ``wait.fetch`` with decoders 15% busy (an unpacked folder, one GET per image). Decoders
    that are idle are not what holds the batches back; the reads are.
    """
    top = max(waits, key=lambda k: waits[k])
    if top != "decode" or load["store"] < SATURATED:
        return top
    # The decoders' own measures; a machine loaded past its cores (a local test server
    # counts) does not make them the bound while the reads were in flight all along.
    decoders_busy = max(load["decode_threads"], load["cpu"]) >= SATURATED
    waited = sum(waits.values())
    if decoders_busy or waited <= 0 or waits["store"] < STORE_SHARE * waited:
        return top
    return "store"


def _request_rates(loader: Loader) -> dict[str, float]:
    """The shaped rate of each prefix of the loader's datasets that was throttled."""
    rates: dict[str, float] = {}
    for dataset in loader.source.datasets:
        url = parse_url(dataset.url)
        shapers = dataset.store.engine.shapers.snapshot()
        for (_, bucket, prefix), (throttles, rate) in shapers.items():
            inside = prefix == url.prefix or prefix.startswith(f"{url.prefix}/")
            if bucket == url.bucket and inside and throttles and rate is not None:
                rates["/".join(p for p in (bucket, prefix) if p)] = rate
    return rates


def _load(loader: Loader, m: Measured, *, decoding_s: float) -> dict[str, float]:
    """How busy each resource was over the window: the store (time with a request in flight,
    and requests in flight on average), the decode threads (``decoding_s`` of decoding and
    transforms), this process's CPU and the machine."""
    window = max(m.window_s, 1e-9)
    end = m.window_start_s + m.window_s
    fetches = [e for e in m.events if e.stage == Stage.FETCH]
    in_flight = sum(
        min(e.start_s + e.seconds, end) - max(e.start_s, m.window_start_s)
        for e in fetches
        if e.start_s < end and e.start_s + e.seconds > m.window_start_s
    )
    cores = os.cpu_count() or 1
    step_cpu = m.step_total_s if m.step == "spin" else 0.0
    return {
        "store": _union_s(fetches, m.window_start_s, end) / window,
        "requests_in_flight": in_flight / window,
        "decode_busy": decoding_s / window,
        # Autotune may change the thread count while measuring: share of the final count.
        "decode_threads": min(1.0, decoding_s / (loader.num_threads * window)),
        "cpu": max(0.0, m.cpu_s - step_cpu) / (cores * window),
        "machine": os.getloadavg()[0] / cores,
    }


def _verdict(
    share: float, waits: dict[Bottleneck, float], load: dict[str, float], phases: dict[str, float]
) -> tuple[Bottleneck, str, bool | None]:
    """The bottleneck, the verdict in words, and whether the bottleneck was saturated."""
    bottleneck: Bottleneck
    saturated: bool | None = None
    phase_total = sum(phases.values())
    at_starts = phase_total > 0 and phases["epoch_start"] >= 0.5 * phase_total
    if share < INPUT_BOUND_SHARE:
        bottleneck = "consumer"
        verdict = "compute-bound"
    else:
        bottleneck = _bound(waits, load)
        saturated, busy = _saturation(bottleneck, load)
        notes = ["at epoch starts"] if at_starts else []
        if saturated is False:
            notes.append(f"{busy}: not saturated")
        verdict = f"input-bound: {bottleneck}" + (f" ({'; '.join(notes)})" if notes else "")
    return bottleneck, verdict, saturated


def _conclude(loader: Loader, advice_for: AdviceFor, m: Measured) -> Diagnosis:
    def seconds(stage: str) -> float:
        return m.stages.get(stage, StageTotals()).seconds

    consumer = m.wait_s + m.step_total_s
    share = m.wait_s / consumer if consumer > 0 else 0.0
    decode_s, transform_s = seconds(Stage.DECODE), seconds(Stage.TRANSFORM)
    transform_part = transform_s / (decode_s + transform_s) if decode_s + transform_s else 0.0
    waits: dict[Bottleneck, float] = {
        "store": seconds(Stage.WAIT_FETCH),
        "decode": seconds(Stage.WAIT_DECODE) * (1 - transform_part),
        "transform": seconds(Stage.WAIT_DECODE) * transform_part,
        "collate": seconds(Stage.COLLATE),
    }
    known = sum(waits.values())
    total_wait = max(m.wait_s, known)
    wait_shares: dict[str, float] = {
        k: v / total_wait if total_wait else 0.0 for k, v in waits.items()
    }
    wait_shares["other"] = max(0.0, 1.0 - sum(wait_shares.values()))
    load = _load(loader, m, decoding_s=decode_s + transform_s)
    bottleneck, verdict, saturated = _verdict(share, waits, load, m.wait_phases)
    diagnosis = Diagnosis(
        url=loader.dataset.url,
        verdict=verdict,
        bottleneck=bottleneck,
        dominant_stage=STAGE_OF[bottleneck],
        input_bound_share=share,
        wait_shares=wait_shares,
        load=load,
        advice=[],
        step_s=m.step_s,
        batch_size=loader.batch_size,
        num_threads=loader.num_threads,
        prefetch=loader.prefetch,
        batches=m.batches,
        samples=m.samples,
        seconds=m.window_s,
        first_batch_s=m.first_batch_s,
        wait_phases=m.wait_phases,
        epochs=m.epochs,
        saturated=saturated,
        stages=m.stages,
        requests=m.requests,
        request_rates=_request_rates(loader),
        origin_s=m.origin_s,
        window_start_s=m.window_start_s,
        events=m.events,
    )
    return replace(diagnosis, advice=advise(diagnosis, loader, advice_for=advice_for))
