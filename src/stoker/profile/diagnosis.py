"""What the doctor found: the `Diagnosis` that the doctor returns and the advice and plots read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from stoker.core.metrics import StageTotals, TraceEvent

#: How the places the waits fell are named (keys of ``Diagnosis.wait_phases``).
PHASE_NAMES = {
    "first_batch": "the first batch",
    "epoch_start": "epoch starts",
    "steady": "steady state",
}

#: The stage that held the training loop back, or ``"consumer"``: the model did (compute-bound).
Bottleneck = Literal["store", "decode", "transform", "collate", "consumer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    """What :func:`~stoker.profile.doctor.diagnose` found.

    Attributes:
        url: The dataset.
        verdict: ``"compute-bound"`` or ``"input-bound: <bottleneck>"``, followed by
            what qualifies it in parentheses: ``at epoch starts`` when most of the waiting
            fell in the first batches of each later epoch (the pipeline drained between
            epochs), ``<load>: not saturated`` when the resource waited on was busy less
            than :data:`~stoker.profile.doctor.SATURATED` of the time
            (``"input-bound: decode (at epoch starts; decode threads 30% busy: not
            saturated)"``).
        bottleneck: ``store``, ``decode``, ``transform``, ``collate``, or ``consumer`` when
            compute-bound.
        dominant_stage: The loader stage behind it (``fetch``, ``decode``, ...,
            ``consumer.step``).
        input_bound_share: Share of the consumer's time spent waiting for batches.
        wait_shares: Where that waiting went: ``store``, ``decode``, ``transform``,
            ``collate`` and ``other`` (bookkeeping), summing to 1.
        load: How busy each resource was over the measured window: ``store`` (share of
            the time at least one request was in flight), ``requests_in_flight`` (read
            groups in flight on average), ``decode_busy`` (decode threads busy on average),
            ``decode_threads`` (that as a share of the loader's threads, at most 1),
            ``cpu`` (this process's CPU time per core and second) and ``machine`` (the
            system's one-minute load average per core: above 1, other processes compete
            for the cores).
        advice: What to change, most useful first.
        step_s: The simulated step.
        batch_size: Samples per batch.
        num_threads: The loader's decode threads.
        prefetch: The loader's read groups in flight.
        batches: Batches measured (after the warm-up).
        samples: Samples in them.
        seconds: Length of the measured window.
        first_batch_s: Time from the start to the first batch.
        wait_phases: Seconds the training loop waited in the measured window, by where the
            waits fell: ``first_batch`` (the run's first batch, when measured),
            ``epoch_start`` (the first
            :data:`~stoker.profile.doctor.EPOCH_START_BATCHES` batches of each epoch after
            the first, at most a quarter of an epoch) and ``steady`` (the rest).
        epochs: Epochs the run started (the first one included).
        saturated: Whether the resource behind the bottleneck was saturated (None: no
            measure of it, or compute-bound).
        stages: Each stage's totals over the measured window.
        requests: Store counters over the measured window.
        request_rates: For each prefix the store throttled (``BUCKET/PREFIX``), the request
            rate the client shaped itself to by the end, in requests per second.
        origin_s: Start of the run on the ``perf_counter`` clock.
        window_start_s: Start of the measured window, on the same clock.
        events: The loader's timeline (``Loader.events``) over the whole run.
    """

    url: str
    verdict: str
    bottleneck: Bottleneck
    dominant_stage: str
    input_bound_share: float
    wait_shares: dict[str, float]
    load: dict[str, float]
    advice: list[str]
    step_s: float
    batch_size: int
    num_threads: int
    prefetch: int
    batches: int
    samples: int
    seconds: float
    first_batch_s: float
    wait_phases: dict[str, float] = field(default_factory=dict)
    epochs: int = 1
    saturated: bool | None = None
    stages: dict[str, StageTotals] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    request_rates: dict[str, float] = field(default_factory=dict)
    origin_s: float = 0.0
    window_start_s: float = 0.0
    events: tuple[TraceEvent, ...] = ()

    def summary(self) -> str:
        """The verdict with what it rests on, in one line: the share of time waiting, where
        the waits fell and how busy the decode threads and the store were
        (``"compute-bound: waited for data 3% of the time (epoch starts 20%, steady state
        80%); decode threads 30% busy, requests in flight 45% of the time"``)."""
        waited = sum(self.wait_phases.values())
        where = ", ".join(
            f"{PHASE_NAMES.get(k, k)} {100 * v / waited:.0f}%"
            for k, v in self.wait_phases.items()
            if v > 0
        )
        load = self.load
        return (
            f"{self.verdict}: waited for data {100 * self.input_bound_share:.0f}% of the time"
            + (f" ({where})" if where else "")
            + f"; decode threads {100 * load.get('decode_threads', 0.0):.0f}% busy, requests "
            f"in flight {100 * load.get('store', 0.0):.0f}% of the time"
        )

    @property
    def images_per_s(self) -> float:
        """Samples delivered per second over the measured window."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the timeline left out)."""
        return {
            "url": self.url,
            "verdict": self.verdict,
            "bottleneck": self.bottleneck,
            "dominant_stage": self.dominant_stage,
            "input_bound_share": round(self.input_bound_share, 4),
            "wait_shares": {k: round(v, 4) for k, v in self.wait_shares.items()},
            "load": {k: round(v, 4) for k, v in self.load.items()},
            "advice": self.advice,
            "step_s": self.step_s,
            "batch_size": self.batch_size,
            "num_threads": self.num_threads,
            "prefetch": self.prefetch,
            "batches": self.batches,
            "samples": self.samples,
            "seconds": round(self.seconds, 4),
            "first_batch_s": round(self.first_batch_s, 4),
            "wait_phases": {k: round(v, 4) for k, v in self.wait_phases.items()},
            "epochs": self.epochs,
            "saturated": self.saturated,
            "images_per_s": round(self.images_per_s, 1),
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "requests": self.requests,
            "request_rates": {k: round(v, 1) for k, v in self.request_rates.items()},
        }
