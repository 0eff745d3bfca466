"""Live metrics: a loader's counters on a Prometheus / OpenMetrics endpoint, per rank.

:func:`serve_metrics` starts an HTTP endpoint in the training process whose every scrape
reads ``loader.stats()`` (:class:`~stoker.pipeline.stats.LoaderStats`) once and turns it
into metric families: nothing is recorded per batch for it, so a loader nobody scrapes
pays nothing. :class:`LoaderCollector` is the same on a ``prometheus_client`` registry of
your own. With ``TorchLoader(num_workers=k)`` the endpoint lives in the training process
and shows the rank's figures summed over its workers (what ``TorchLoader.stats()``
gives). ``docs/observability.md`` lists every name.

Needs ``prometheus_client`` (``pip install 'stoker[metrics]'``), imported at the first
call.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from stoker.core.metrics import DURATION_BUCKETS_S
from stoker.pipeline.stats import LoaderStats
from stoker.pipeline.world import World

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

__all__ = ["LoaderCollector", "MetricsServer", "serve_metrics"]

PREFIX = "stoker"

#: Store counters (``stats().requests``) with a name of their own; ``requests.<op>`` and
#: ``errors.<kind>`` become labels, and any other counter ``stoker_store_<name>_total``.
STORE_COUNTERS = {
    "bytes.read": ("store_read_bytes", "Bytes read from the store (retries included)."),
    "bytes.written": ("store_written_bytes", "Bytes written to the store."),
    "retries": ("store_retries", "Requests sent again after a retryable failure."),
    "throttles": ("store_throttles", "Requests the store answered with a throttle (503/429)."),
    "shaping.waits": (
        "store_shaped_waits",
        "Requests that waited for the request rate the client shaped itself to.",
    ),
}

#: Disk cache counters (``stats().disk_cache``, without ``cache.``) with a name of their own.
DISK_CACHE_COUNTERS = {
    "bytes_hit": "disk_cache_hit_bytes",
    "bytes_written": "disk_cache_written_bytes",
}

AUTOTUNE_STATES = ("tuning", "settled", "fixed")


class Observed(Protocol):
    """What :func:`serve_metrics` reads: ``stoker.Loader``, ``TokenLoader``, the
    framework adapters (``TorchLoader``, ...)."""

    def stats(self) -> LoaderStats: ...


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # an optional extra
        raise ImportError(
            "live metrics need prometheus_client: pip install 'stoker[metrics]'"
        ) from exc
    return prometheus_client


def _world_of(loader: Observed, world: World | None) -> World:
    if world is not None:
        return world
    found = getattr(loader, "world", None)  # Loader, TokenLoader, TorchLoader have one
    return found if isinstance(found, World) else World()


def _snake(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


@dataclass(slots=True)
class _Families:
    """The metric families of one scrape, made as they are first named."""

    core: Any  # prometheus_client.core
    labels: dict[str, str]
    made: dict[str, Any] = field(default_factory=dict)  # name: a family of core's

    def counter(self, name: str, doc: str, value: float, **extra: str) -> None:
        self._add(self.core.CounterMetricFamily, name, doc, value, extra)

    def gauge(self, name: str, doc: str, value: float, **extra: str) -> None:
        self._add(self.core.GaugeMetricFamily, name, doc, value, extra)

    def histogram(
        self, name: str, doc: str, durations: tuple[int, ...], seconds: float, **extra: str
    ) -> None:
        """Runs counted by duration bucket (:data:`DURATION_BUCKETS_S`) as a histogram."""
        bounds = [*(str(bound) for bound in DURATION_BUCKETS_S), "+Inf"]
        buckets = list(zip(bounds, itertools.accumulate(durations), strict=True))
        family = self._family(self.core.HistogramMetricFamily, name, doc, extra)
        family.add_metric([*self.labels.values(), *extra.values()], buckets, sum_value=seconds)

    def _add(self, kind: Any, name: str, doc: str, value: float, extra: dict[str, str]) -> None:
        family = self._family(kind, name, doc, extra)
        family.add_metric([*self.labels.values(), *extra.values()], value)

    def _family(self, kind: Any, name: str, doc: str, extra: dict[str, str]) -> Any:
        full = f"{PREFIX}_{name}"
        family = self.made.get(full)
        if family is None:
            family = kind(full, doc, labels=[*self.labels, *extra])
            self.made[full] = family
        return family


class LoaderCollector:
    """A ``prometheus_client`` collector of one loader's counters, read at each scrape.

    Register it on a registry of your own (``prometheus_client.REGISTRY.register(
    LoaderCollector(loader, name="train"))``) to add stoker's metrics to an endpoint the
    process already serves; :func:`serve_metrics` makes one for its own endpoint. Several
    loaders may share a registry under different ``name`` s.

    Counters never go down between scrapes: a scrape that meets an adapter folding an
    epoch's figures into its totals shows the previous value, not a reset.

    Args:
        loader: The loader to read (anything with ``stats()``).
        name: The ``loader`` label of every series.
        world: The ``rank`` and ``world_size`` labels; by default the loader's own
            ``world`` (``World()`` if it has none).
    """

    def __init__(self, loader: Observed, *, name: str = "loader", world: World | None = None):
        _prometheus()  # fail now, not at the first scrape
        self.loader = loader
        world = _world_of(loader, world)
        self.labels = {"loader": name, "rank": str(world.rank), "world_size": str(world.world_size)}
        self._lock = threading.Lock()  # scrapes may come on several threads at once
        self._highest: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def describe(self) -> list[Metric]:
        # Nothing to check against other collectors: their series differ by the labels.
        # (Without this, registering would read the loader's stats once.)
        return []

    def collect(self) -> Iterator[Metric]:
        """The metric families of ``loader.stats()`` now."""
        from prometheus_client import core

        families = _Families(core, self.labels)
        _name_stats(self.loader.stats(), families)
        with self._lock:
            for family in families.made.values():
                if family.type in ("counter", "histogram"):
                    self._never_down(family)
        yield from families.made.values()

    def _never_down(self, family: Metric) -> None:
        for n, sample in enumerate(family.samples):
            key = (sample.name, tuple(sorted(sample.labels.items())))
            highest = max(self._highest.get(key, 0.0), sample.value)
            self._highest[key] = highest
            family.samples[n] = sample._replace(value=highest)


def _name_stats(stats: LoaderStats, out: _Families) -> None:
    """Every figure of ``stats`` in ``out``: the list in docs/observability.md."""
    out.counter("samples", "Samples delivered in batches.", stats.samples)
    out.counter("batches", "Batches delivered.", stats.batches)
    out.counter("skipped_samples", "Samples skipped (on_error='skip').", len(stats.skipped))
    out.counter("padded_samples", "Samples repeated to even out ranks.", stats.padded)
    out.gauge("epoch_samples", "Samples this rank delivers in an epoch.", stats.epoch_samples)
    for key, value in stats.requests.items():
        kind, _, rest = key.partition(".")
        if kind == "requests":
            out.counter(
                "store_requests", "Requests sent to the store, by operation.", value, op=rest
            )
        elif kind == "errors":
            out.counter(
                "store_errors",
                "Failed request attempts by kind, retried ones included.",
                value,
                kind=rest,
            )
        elif key == "shaping.wait_ms":
            out.counter(
                "store_shaped_wait_seconds",
                "Time requests waited for the shaped rate, summed over requests.",
                value / 1000,
            )
        elif key == "shaping.rate_per_s":
            out.gauge(
                "store_shaped_rate_per_second",
                "The request rate the client holds itself to now (0: unshaped).",
                value,
            )
        elif key in STORE_COUNTERS:
            out.counter(*STORE_COUNTERS[key], value)
        else:
            out.counter(f"store_{_snake(key)}", f"The store's {key} counter.", value)
    out.counter(
        "memory_cache_hits",
        "Samples served by the in-memory sample cache.",
        stats.memory_cache_hits,
    )
    for key, value in stats.disk_cache.items():
        short = key.removeprefix("cache.")
        name = DISK_CACHE_COUNTERS.get(short, f"disk_cache_{_snake(short)}")
        out.counter(name, f"The node-local disk cache's {key} counter.", value)
    for stage, totals in stats.stages.items():
        out.counter(
            "stage_seconds",
            "Seconds spent in a stage (threads add up).",
            totals.seconds,
            stage=stage,
        )
        out.counter("stage_calls", "Times a stage ran.", totals.calls, stage=stage)
        out.counter("stage_items", "Items (samples) a stage handled.", totals.items, stage=stage)
        out.counter("stage_bytes", "Bytes a stage handled.", totals.bytes, stage=stage)
        if totals.durations:
            out.histogram(
                "stage_duration_seconds",
                "A stage's runs by duration (fetch: a read group's requests; consumer.wait: "
                "the training loop's wait for a batch).",
                totals.durations,
                totals.seconds,
                stage=stage,
            )
    out.gauge(
        "input_bound_ratio",
        "Share of the training loop's time spent waiting for batches, since the start.",
        stats.wait_share,
    )
    out.gauge("decode_threads", "Decode threads (or processes) allowed now.", stats.threads)
    out.gauge("prefetch_groups", "Read groups fetched ahead now (queue depth).", stats.prefetch)
    for state in AUTOTUNE_STATES:
        out.gauge(
            "autotune_state",
            "The autotuner's state (1: this one).",
            float(stats.autotune == state),
            state=state,
        )


class MetricsServer:
    """A running metrics endpoint (see :func:`serve_metrics`); ``close()`` or a ``with``
    block stops it.

    Attributes:
        port: The port it listens on (the one chosen, with ``port=0``).
        url: Its address, ``http://ADDR:PORT/metrics``.
        collector: The :class:`LoaderCollector` it serves.
    """

    def __init__(self, collector: LoaderCollector, *, port: int, addr: str) -> None:
        prometheus = _prometheus()
        registry = prometheus.CollectorRegistry(auto_describe=False)
        registry.register(collector)
        self.collector = collector
        served: tuple[WSGIServer, threading.Thread] = prometheus.start_http_server(
            port, addr=addr, registry=registry
        )
        self._server, self._thread = served
        self.port: int = self._server.server_port
        host = f"[{addr}]" if ":" in addr else addr
        self.url = f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(
    loader: Observed,
    *,
    port: int,
    addr: str = "127.0.0.1",
    name: str = "loader",
    world: World | None = None,
) -> MetricsServer:
    """Serve ``loader``'s counters for Prometheus at ``http://addr:port/metrics``.

    Each scrape reads ``loader.stats()`` once (text format 0.0.4, or OpenMetrics when the
    scraper asks for it); the endpoint runs on a daemon thread of this process. Give each
    rank of a node its own port, ``port=base + local_rank`` (stoker reads no environment:
    ``LOCAL_RANK`` is the launcher's to give), or ``port=0`` for a free one
    (:attr:`MetricsServer.port`).

    Args:
        loader: The loader to read (anything with ``stats()``).
        port: The port to listen on (0: any free one).
        addr: The address to listen on; ``"0.0.0.0"`` for scrapers on other machines.
        name: The ``loader`` label of every series (``"train"``, ``"val"``).
        world: The ``rank`` and ``world_size`` labels (default: the loader's ``world``).

    Returns:
        The running endpoint.
    """
    return MetricsServer(LoaderCollector(loader, name=name, world=world), port=port, addr=addr)
