"""Live metrics: serve_metrics() over HTTP on loopback, scraped during and after an epoch,
through the Loader and through TorchLoader with DataLoader workers; the text parses with
prometheus_client's parsers (both formats) and says what stats() says."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from stoker import CacheConfig, Loader, World
from stoker.core.metrics import DURATION_BUCKETS_S, StageTotals
from stoker.integrations.prometheus import LoaderCollector, serve_metrics
from stoker.pipeline.stats import LoaderStats
from stoker.testing.images import write_packed_images

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.openmetrics.parser import (  # noqa: E402
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("metrics"),
        files=48,
        classes=3,
        width=32,
        height=24,
        samples_per_shard=12,
    )


def scrape(url: str, *, openmetrics: bool = False) -> Series:
    """Every sample of a scrape by (name, labels), parsed as Prometheus would."""
    headers = {"Accept": OPENMETRICS} if openmetrics else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (loopback)
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (loopback)
        text = answer.read().decode()
        kind = answer.headers["Content-Type"]
    if openmetrics:
        assert kind.startswith("application/openmetrics-text")
        families = list(parse_openmetrics(text))  # strict: refuses what OpenMetrics forbids
    else:
        assert kind.startswith("text/plain")
        families = list(text_string_to_metric_families(text))
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in families
        for sample in family.samples
    }


def value(series: Series, name: str, **labels: str) -> float:
    """The one sample of ``name`` with these labels (besides loader, rank, world_size)."""
    found = [
        v
        for (n, have), v in series.items()
        if n == name and {k: v for k, v in have if k not in RANK_LABELS} == labels
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


RANK_LABELS = ("loader", "rank", "world_size")


def expected(stats: LoaderStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What a scrape of ``stats`` should say, figure by figure."""
    r = stats.requests
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {
        ("stoker_samples_total", ()): stats.samples,
        ("stoker_batches_total", ()): stats.batches,
        ("stoker_skipped_samples_total", ()): len(stats.skipped),
        ("stoker_epoch_samples", ()): stats.epoch_samples,
        ("stoker_store_read_bytes_total", ()): r["bytes.read"],
        ("stoker_memory_cache_hits_total", ()): stats.memory_cache_hits,
        ("stoker_decode_threads", ()): stats.threads,
        ("stoker_prefetch_groups", ()): stats.prefetch,
        ("stoker_autotune_state", (("state", stats.autotune),)): 1,
    }
    for key, n in r.items():
        if key.startswith("requests."):
            out["stoker_store_requests_total", (("op", key.split(".", 1)[1]),)] = n
    for key, n in stats.disk_cache.items():
        if key in ("cache.hits", "cache.misses"):
            out[f"stoker_disk_cache_{key.split('.')[1]}_total", ()] = n
    if "cache.bytes_hit" in stats.disk_cache:
        out["stoker_disk_cache_hit_bytes_total", ()] = stats.disk_cache["cache.bytes_hit"]
    for stage, totals in stats.stages.items():
        label = (("stage", stage),)
        out["stoker_stage_seconds_total", label] = totals.seconds
        out["stoker_stage_calls_total", label] = totals.calls
        out["stoker_stage_items_total", label] = totals.items
        out["stoker_stage_bytes_total", label] = totals.bytes
        out["stoker_stage_duration_seconds_count", label] = sum(totals.durations)
        out["stoker_stage_duration_seconds_sum", label] = totals.seconds
        below = 0
        for bound, n in zip([*DURATION_BUCKETS_S, "+Inf"], totals.durations, strict=True):
            below += n
            out["stoker_stage_duration_seconds_bucket", (*label, ("le", str(bound)))] = below
        assert below == totals.calls > 0
    return out


def assert_says(series: Series, stats: LoaderStats) -> None:
    for (name, labels), want in expected(stats).items():
        assert value(series, name, **dict(labels)) == pytest.approx(want), (name, labels)


def test_a_scrape_says_what_the_loaders_stats_say(dataset_url: str, tmp_path: Path) -> None:
    world = World(rank=1, world_size=2)
    cache = CacheConfig(dir=tmp_path / "cache")
    with (
        Loader(dataset_url, batch_size=6, world=world, cache=cache) as loader,
        serve_metrics(loader, port=0, name="train") as server,
    ):
        loader.read_ahead = False  # after an epoch, nothing is read until the next
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        batches = iter(loader)
        for _ in range(2):
            next(batches)
        # During the epoch: the pipeline reads on, so the store's figures and the
        # pipeline's stages lie between the stats before and after the scrape; what the
        # consumer's next() records does not move while it holds the loader.
        before = loader.stats()
        during = scrape(server.url)
        after = loader.stats()
        assert value(during, "stoker_samples_total") == after.samples == 12
        assert value(during, "stoker_batches_total") == after.batches == 2
        assert value(during, "stoker_stage_calls_total", stage="consumer.wait") == 2
        for op in ("get", "head"):
            key = f"requests.{op}"
            got = value(during, "stoker_store_requests_total", op=op)
            assert before.requests.get(key, 0) <= got <= after.requests[key]
        got = value(during, "stoker_store_read_bytes_total")
        assert before.requests["bytes.read"] <= got <= after.requests["bytes.read"]
        assert {dict(labels)["rank"] for _, labels in during} == {"1"}
        assert {dict(labels)["world_size"] for _, labels in during} == {"2"}
        assert {dict(labels)["loader"] for _, labels in during} == {"train"}
        list(batches)
        list(loader)  # a second epoch, from the disk cache
        stats = loader.stats()
        # After the epochs nothing moves: every figure is the stats' own, in both formats.
        text, openmetrics = scrape(server.url), scrape(server.url, openmetrics=True)
    assert stats.samples == 48  # rank 1's half of two epochs of 48
    assert stats.disk_cache["cache.hits"] > 0
    assert_says(text, stats)
    assert_says(openmetrics, stats)


def test_the_endpoint_stops_with_its_block(dataset_url: str) -> None:
    with Loader(dataset_url, batch_size=6) as loader:
        with serve_metrics(loader, port=0) as server:
            assert value(scrape(server.url), "stoker_samples_total") == 0
        with pytest.raises(OSError):  # noqa: PT011 (refused: its message is the OS's)
            urllib.request.urlopen(server.url, timeout=5)  # noqa: S310 (loopback)


class Fixed:
    """A loader whose stats() are given."""

    def __init__(self, stats: LoaderStats) -> None:
        self.now = stats

    def stats(self) -> LoaderStats:
        return self.now


def collect(collector: LoaderCollector) -> Series:
    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    text = prometheus_client.generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_counter_of_the_stats_has_a_name() -> None:
    durations = (0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0)  # 0.0025 s and 0.25 s
    stats = LoaderStats(
        samples=10,
        batches=2,
        skipped=[("a", "bad JSON"), ("b", "truncated")],
        padded=1,
        memory_cache_hits=3,
        requests={
            "requests.get": 7,
            "bytes.read": 700,
            "retries": 2,
            "throttles": 1,
            "errors.timeout": 4,
            "shaping.waits": 5,
            "shaping.wait_ms": 1500,
            "shaping.rate_per_s": 40,
            "hedges": 6,  # a counter the store may grow one day: named after it
        },
        disk_cache={"cache.hits": 8, "cache.bytes_written": 90, "cache.wait_timeouts": 1},
        stages={"fetch": StageTotals(0.5, 3, 10, 700, durations)},
        epoch_samples=20,
        threads=4,
        prefetch=2,
        autotune="settled",
    )
    series = collect(LoaderCollector(Fixed(stats), world=World(rank=3, world_size=4)))
    assert {
        (name, tuple(sorted((k, v) for k, v in labels if k not in RANK_LABELS))): got
        for (name, labels), got in series.items()
    } == {
        ("stoker_samples_total", ()): 10,
        ("stoker_batches_total", ()): 2,
        ("stoker_skipped_samples_total", ()): 2,
        ("stoker_padded_samples_total", ()): 1,
        ("stoker_epoch_samples", ()): 20,
        ("stoker_store_requests_total", (("op", "get"),)): 7,
        ("stoker_store_read_bytes_total", ()): 700,
        ("stoker_store_retries_total", ()): 2,
        ("stoker_store_throttles_total", ()): 1,
        ("stoker_store_errors_total", (("kind", "timeout"),)): 4,
        ("stoker_store_shaped_waits_total", ()): 5,
        ("stoker_store_shaped_wait_seconds_total", ()): 1.5,
        ("stoker_store_shaped_rate_per_second", ()): 40,
        ("stoker_store_hedges_total", ()): 6,
        ("stoker_memory_cache_hits_total", ()): 3,
        ("stoker_disk_cache_hits_total", ()): 8,
        ("stoker_disk_cache_written_bytes_total", ()): 90,
        ("stoker_disk_cache_wait_timeouts_total", ()): 1,
        ("stoker_stage_seconds_total", (("stage", "fetch"),)): 0.5,
        ("stoker_stage_calls_total", (("stage", "fetch"),)): 3,
        ("stoker_stage_items_total", (("stage", "fetch"),)): 10,
        ("stoker_stage_bytes_total", (("stage", "fetch"),)): 700,
        ("stoker_input_bound_ratio", ()): 0,
        ("stoker_decode_threads", ()): 4,
        ("stoker_prefetch_groups", ()): 2,
        ("stoker_autotune_state", (("state", "tuning"),)): 0,
        ("stoker_autotune_state", (("state", "settled"),)): 1,
        ("stoker_autotune_state", (("state", "fixed"),)): 0,
        ("stoker_stage_duration_seconds_count", (("stage", "fetch"),)): 3,
        ("stoker_stage_duration_seconds_sum", (("stage", "fetch"),)): 0.5,
        **{
            ("stoker_stage_duration_seconds_bucket", (("le", str(bound)), ("stage", "fetch"))): (
                0 if bound < 0.0025 else 1 if bound < 0.25 else 3
            )
            for bound in DURATION_BUCKETS_S
        },
        ("stoker_stage_duration_seconds_bucket", (("le", "+Inf"), ("stage", "fetch"))): 3,
    }
    rank = {("loader", "loader"), ("rank", "3"), ("world_size", "4")}
    assert all(rank <= labels for _, labels in series)


def test_counters_never_go_down_and_loaders_share_a_registry() -> None:
    loader = Fixed(LoaderStats(samples=10, requests={"requests.get": 5}, threads=4))
    other = Fixed(LoaderStats(samples=1))
    registry = prometheus_client.CollectorRegistry()
    collector = LoaderCollector(loader, name="train")
    registry.register(collector)
    registry.register(LoaderCollector(other, name="val"))
    text = prometheus_client.generate_latest(registry).decode()
    assert text.count("stoker_samples_total{") == 2
    assert 'loader="train"' in text
    assert 'loader="val"' in text
    # A scrape meeting an adapter's fold of an epoch into its totals (see RunRecord).
    loader.now = LoaderStats(samples=8, requests={"requests.get": 6}, threads=2)
    series = collect(collector)
    assert value(series, "stoker_samples_total") == 10  # not 8: a counter kept its high
    assert value(series, "stoker_store_requests_total", op="get") == 6
    assert value(series, "stoker_decode_threads") == 2  # a gauge says what is now


def test_torch_workers_figures_are_summed_in_the_training_process(dataset_url: str) -> None:
    from stoker.integrations.torch import TorchLoader

    world = World(rank=0, world_size=1)
    with (
        TorchLoader(dataset_url, batch_size=6, num_workers=2, world=world) as loader,
        serve_metrics(loader, port=0) as server,
    ):
        batches = iter(loader)
        for _ in range(4):  # two from each worker
            next(batches)
        during = scrape(server.url)
        # The workers' reports arrive with their batches, so nothing moves until next().
        reports = loader._record._workers  # each worker's last report (private: the check)
        assert len(reports) == 2
        for key in ("requests.get", "bytes.read"):
            each = [report.requests[key] for report in reports.values()]
            assert all(n > 0 for n in each)
            name = (
                "stoker_store_read_bytes_total"
                if key == "bytes.read"
                else "stoker_store_requests_total"
            )
            labels = {} if key == "bytes.read" else {"op": "get"}
            assert value(during, name, **labels) == sum(each)
        assert_says(during, loader.stats())
        assert value(during, "stoker_samples_total") == 24
        list(batches)
        stats = loader.stats()
        after = scrape(server.url)
    assert stats.samples == 48
    assert_says(after, stats)
    assert value(after, "stoker_decode_threads") == stats.threads  # both workers' threads


def test_prometheus_client_is_imported_at_the_first_call_and_named_when_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code = "import sys, stoker.integrations.prometheus; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'stoker\[metrics\]'"):
        serve_metrics(Fixed(LoaderStats()), port=0)
