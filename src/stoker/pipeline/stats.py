"""LoaderStats: what a loader has done, by stage, with its requests and their cost."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from stoker.core.metrics import Stage, StageTotals, add_durations, merge_snapshots
from stoker.core.pricing import EpochCost, StoragePrices
from stoker.core.units import format_bytes
from stoker.pipeline.order import EpochOrder
from stoker.pipeline.plan import DropLast, rank_units
from stoker.pipeline.world import World
from stoker.storage.base import Store


@dataclass(slots=True)
class LoaderStats:
    """Counters of one loader since it was made; ``print(stats)`` shows them as a short
    table (:meth:`table`).

    Each counter counts one thing, in the unit its name says. Times are seconds; a stage's
    time is summed over the threads that ran it, so stages running side by side add up to
    more than the wall-clock time.

    Attributes:
        samples: Samples delivered in batches.
        batches: Batches delivered.
        skipped: ``(key, reason)`` of samples left out with ``on_error="skip"``.
        padded: Samples repeated to even out ranks (summed over epochs).
        memory_cache_hits: Samples served from the in-memory sample cache
            (``CacheConfig(memory_bytes=...)``) instead of being read. The disk cache's
            hits are in ``disk_cache``; :attr:`cache_hits` adds both.
        requests: The store's request counters, each a total since the store was opened:
            ``requests.<op>`` (requests sent, retries included), ``bytes.read``,
            ``retries``, ``throttles``, ``errors.<kind>``; ``shaping.waits`` and
            ``shaping.wait_ms`` (requests that waited for the request rate the client
            shaped itself to, after the store throttled it or under
            ``max_requests_per_s``, and their waits summed in milliseconds: requests wait
            side by side, so this may exceed the elapsed time; 0 when never throttled
            nor capped); ``shaping.rate_per_s`` (that rate now, a level, not a total).
        disk_cache: The node-local disk cache's counters: ``cache.hits`` and
            ``cache.misses`` (pages looked up, found or not), ``cache.bytes_hit`` (bytes
            read from the cache: of a page, only the samples' parts a read asked for),
            ``cache.writes``, ``cache.bytes_written``, ``cache.evictions``,
            ``cache.errors``, ``cache.damaged`` (entries found damaged and removed),
            ``cache.waits`` (pages another process of the node was fetching, waited for
            in the cache) and ``cache.wait_timeouts`` (of those, fetched here after all,
            the wait over).
        stages: Time, calls, items, bytes and runs by duration per stage, keyed by
            :class:`~stoker.core.metrics.Stage` (a string): ``index`` (opening the
            dataset), ``fetch`` (a read group's requests, on the I/O engine), ``decode``
            (decode and built-in transform, per batch slice, in CPU seconds), ``transform``
            (a user callable, and only it), ``collate`` (assembling a batch), ``wait.fetch`` and
            ``wait.decode`` (the pipeline thread blocked on either), ``consumer.wait``
            (the caller blocked inside ``next()``) and ``consumer.step`` (the caller's
            time between batches).
        epoch_samples: Samples delivered per epoch on this rank (padding included; see
            :func:`samples_per_epoch`).
        threads: Decode threads (or processes) allowed now.
        prefetch: Read groups fetched ahead now.
        autotune: ``"tuning"``, ``"settled"`` or ``"fixed"`` (both settings given).
    """

    samples: int = 0
    batches: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    padded: int = 0
    memory_cache_hits: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    disk_cache: dict[str, int] = field(default_factory=dict)
    stages: dict[str, StageTotals] = field(default_factory=dict)
    epoch_samples: int = 0
    threads: int = 0
    prefetch: int = 0
    autotune: str = "fixed"

    def since(self, before: LoaderStats) -> LoaderStats:
        """What happened between the snapshot ``before`` and this one.

        Counts, stages, requests and cache counters are differences (those that did not
        move are left out); skipped samples are the new ones; settings are this one's.
        """
        empty = StageTotals()
        stages = {}
        for name, now in self.stages.items():
            then = before.stages.get(name, empty)
            if now.calls != then.calls:
                stages[name] = StageTotals(
                    now.seconds - then.seconds,
                    now.calls - then.calls,
                    now.items - then.items,
                    now.bytes - then.bytes,
                    add_durations(now.durations, then.durations, sign=-1),
                )
        requests = {
            k: v - before.requests.get(k, 0)
            for k, v in self.requests.items()
            if v != before.requests.get(k, 0)
        }
        return replace(
            self,
            samples=self.samples - before.samples,
            batches=self.batches - before.batches,
            skipped=self.skipped[len(before.skipped) :],
            padded=self.padded - before.padded,
            memory_cache_hits=self.memory_cache_hits - before.memory_cache_hits,
            requests=requests,
            disk_cache={
                k: v - before.disk_cache.get(k, 0)
                for k, v in self.disk_cache.items()
                if v != before.disk_cache.get(k, 0)
            },
            stages=stages,
        )

    @property
    def cache_hits(self) -> int:
        """Reads a cache answered instead of the store: samples from the in-memory cache
        plus pages from the disk cache (``disk_cache["cache.hits"]``)."""
        return self.memory_cache_hits + self.disk_cache.get("cache.hits", 0)

    def snapshot(
        self,
        *,
        stages: dict[str, StageTotals],
        epoch_samples: int,
        settings: tuple[int, int, str],
        stores: Sequence[Store],
        memory_cache_hits: int,
    ) -> LoaderStats:
        """A copy of these counts with the rest filled in: ``stages``, ``epoch_samples``,
        ``settings`` (threads, prefetch, autotune), the request counters of ``stores``
        (summed) and the disk cache's of the first (one disk cache serves them all)."""
        disk = stores[0].cache if stores else None
        return replace(
            self,
            skipped=list(self.skipped),
            stages=stages,
            epoch_samples=epoch_samples,
            threads=settings[0],
            prefetch=settings[1],
            autotune=settings[2],
            requests=merge_snapshots(store.counters.snapshot() for store in stores),
            memory_cache_hits=memory_cache_hits,
            disk_cache=disk.counters.snapshot() if disk is not None else {},
        )

    def table(self) -> str:
        """The counters as a short table: stages, requests, bytes, cache and waits."""
        return format_stats(self)

    def __str__(self) -> str:
        return format_stats(self)

    def _seconds(self, stage: str) -> float:
        totals = self.stages.get(stage)
        return totals.seconds if totals is not None else 0.0

    @property
    def wait_s(self) -> float:
        """Time the consumer waited inside ``next()`` for a batch: the input pipeline's
        stall as the training loop feels it."""
        return self._seconds(Stage.CONSUMER_WAIT)

    @property
    def step_s(self) -> float:
        """Time the consumer spent between batches (its training step)."""
        return self._seconds(Stage.CONSUMER_STEP)

    @property
    def decode_s(self) -> float:
        """Thread time spent decoding (and in built-in transforms)."""
        return self._seconds(Stage.DECODE)

    @property
    def fetch_s(self) -> float:
        """Time from each fetch's start to its completion, summed."""
        return self._seconds(Stage.FETCH)

    @property
    def wait_share(self) -> float:
        """Share of the consumer's time spent waiting for batches (0: never input-bound)."""
        total = self.wait_s + self.step_s
        return self.wait_s / total if total > 0 else 0.0

    def cost_per_epoch(self, prices: StoragePrices | None = None) -> EpochCost:
        """Requests, bytes and price of one epoch on this rank, at the measured rates.

        Measured over the samples delivered so far, so a warm cache lowers it.
        """
        prices = prices or StoragePrices()
        per_sample = self.epoch_samples / self.samples if self.samples else 0.0
        requests = self.requests.get("requests.get", 0) * per_sample
        nbytes = self.requests.get("bytes.read", 0) * per_sample
        return EpochCost(requests, nbytes, prices.cost(requests=requests, nbytes=nbytes))


def format_stats(stats: LoaderStats) -> str:
    """``print(loader.stats())``: a few lines a person can read."""
    s = stats
    lines = [
        f"{s.samples:,} samples in {s.batches:,} batches"
        + (f", {len(s.skipped)} skipped" if s.skipped else "")
        + (f", {s.padded} padded" if s.padded else "")
        + f"; {s.threads} decode threads, prefetch {s.prefetch} ({s.autotune})",
        f"  {'stage':<15}{'seconds':>9}{'calls':>8}{'items':>9}{'bytes':>11}",
    ]
    for name, totals in sorted(s.stages.items()):
        nbytes = format_bytes(totals.bytes) if totals.bytes else ""
        lines.append(
            f"  {name:<15}{totals.seconds:>9.3f}{totals.calls:>8}{totals.items:>9}{nbytes:>11}"
        )
    r = s.requests
    sent = sum(v for k, v in r.items() if k.startswith("requests."))
    errors = sum(v for k, v in r.items() if k.startswith("errors."))
    lines.append(
        f"  requests: {sent:,} sent ({r.get('requests.get', 0):,} GETs), "
        f"{format_bytes(r.get('bytes.read', 0))} read, {r.get('retries', 0)} retried, "
        f"{errors} failed, {r.get('throttles', 0)} throttled"
    )
    d = s.disk_cache
    disk = (
        f"disk {d.get('cache.hits', 0):,} hits / {d.get('cache.misses', 0):,} misses "
        f"({format_bytes(d.get('cache.bytes_hit', 0))} served)"
        if d
        else "no disk cache"
    )
    lines.append(f"  cache: memory {s.memory_cache_hits:,} samples; {disk}")
    lines.append(
        f"  waits: the caller waited {s.wait_s:.2f} s of {s.wait_s + s.step_s:.2f} s "
        f"({100 * s.wait_share:.0f}%); the pipeline waited {s._seconds(Stage.WAIT_FETCH):.2f} s "
        f"on the store, {s._seconds(Stage.WAIT_DECODE):.2f} s on decoding; requests waited "
        f"{r.get('shaping.wait_ms', 0) / 1000:.2f} s for the shaped rate"
    )
    return "\n".join(lines)


def samples_per_epoch(
    order: EpochOrder, *, world: World, batch_size: int, drop_last: DropLast
) -> int:
    """Samples one rank delivers in a full epoch of ``order``: its share (padding included),
    less the last incomplete batch with ``drop_last``; not batches times ``batch_size``."""
    size, drop = world.world_size, drop_last
    return rank_units(len(order.samples), world_size=size, batch_size=batch_size, drop_last=drop)


class ProgressLog:
    """A one-line summary at INFO every ``every_s`` seconds while a loader runs: images/s,
    the share of time waiting for input, the busiest stage, GETs and bytes read.

    Args:
        logger: Where the lines go.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.every_s: float | None = None  # None: silent
        self._last = (time.perf_counter(), 0)  # (when, samples then)

    def maybe_log(self, now: float, samples: int, stats: Callable[[], LoaderStats]) -> None:
        """Log a line if ``every_s`` has passed since the last one (``stats`` only then)."""
        if self.every_s is None or now - self._last[0] < self.every_s:
            return
        when, samples_then = self._last
        self._last = (now, samples)
        snapshot = stats()
        busiest = max(
            (Stage.FETCH, Stage.DECODE, Stage.TRANSFORM, Stage.COLLATE),
            key=lambda name: snapshot.stages.get(name, StageTotals()).seconds,
        )
        self.logger.info(
            "%.0f images/s; waiting for input %.0f%% of the time; busiest stage %s; "
            "%d GETs, %s read",
            (samples - samples_then) / (now - when),
            100 * snapshot.wait_share,
            busiest,
            snapshot.requests.get("requests.get", 0),
            format_bytes(snapshot.requests.get("bytes.read", 0)),
        )


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted(set(a) | set(b))}


def _add_stages(a: dict[str, StageTotals], b: dict[str, StageTotals]) -> dict[str, StageTotals]:
    empty = StageTotals()
    out = {}
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name, empty), b.get(name, empty)
        out[name] = StageTotals(
            x.seconds + y.seconds,
            x.calls + y.calls,
            x.items + y.items,
            x.bytes + y.bytes,
            add_durations(x.durations, y.durations),
        )
    return out


def side_by_side(parts: Sequence[LoaderStats]) -> LoaderStats:
    """The stats of loaders that ran at the same time over one rank's epoch (its
    DataLoader worker processes, each making every k-th batch).

    Counts, stage totals, requests, threads and prefetch add up (each worker has its
    own store, threads and read-ahead); padding and ``epoch_samples`` belong to the rank,
    so they are the largest part's (every worker plans the rank's whole epoch); autotune
    is ``"tuning"`` while any part tunes.
    """
    total = LoaderStats()
    for part in parts:
        total = LoaderStats(
            samples=total.samples + part.samples,
            batches=total.batches + part.batches,
            skipped=total.skipped + part.skipped,
            padded=max(total.padded, part.padded),
            memory_cache_hits=total.memory_cache_hits + part.memory_cache_hits,
            requests=_add(total.requests, part.requests),
            disk_cache=_add(total.disk_cache, part.disk_cache),
            stages=_add_stages(total.stages, part.stages),
            epoch_samples=max(total.epoch_samples, part.epoch_samples),
            threads=total.threads + part.threads,
            prefetch=total.prefetch + part.prefetch,
            autotune=_autotune(total.autotune, part.autotune) if total.batches else part.autotune,
        )
    return total


def one_after_another(
    earlier: LoaderStats, later: LoaderStats, *, same_store: bool = False
) -> LoaderStats:
    """The stats of a loader's runs in sequence (one per epoch): counts and stage totals
    add up; settings are the later run's, once it has delivered a batch.

    Args:
        earlier: The runs so far.
        later: The next run.
        same_store: Both read through one store whose counters keep running (the
            requests and disk cache counts of ``later`` already hold ``earlier``'s).
    """
    settings = later if later.batches or not earlier.batches else earlier
    return LoaderStats(
        samples=earlier.samples + later.samples,
        batches=earlier.batches + later.batches,
        skipped=earlier.skipped + later.skipped,
        padded=earlier.padded + later.padded,
        memory_cache_hits=earlier.memory_cache_hits + later.memory_cache_hits,
        requests=(
            dict(later.requests or earlier.requests)
            if same_store
            else _add(earlier.requests, later.requests)
        ),
        disk_cache=(
            dict(later.disk_cache or earlier.disk_cache)
            if same_store
            else _add(earlier.disk_cache, later.disk_cache)
        ),
        stages=_add_stages(earlier.stages, later.stages),
        epoch_samples=settings.epoch_samples,
        threads=settings.threads,
        prefetch=settings.prefetch,
        autotune=settings.autotune,
    )


def _autotune(a: str, b: str) -> str:
    for state in ("tuning", "settled"):
        if state in (a, b):
            return state
    return "fixed"
