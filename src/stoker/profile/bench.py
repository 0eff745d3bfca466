"""Measure a loader: images per second, time to first batch, bytes and requests per sample."""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass
from typing import Any

from stoker.pipeline.loader import Loader


@dataclass(frozen=True, slots=True)
class BenchResult:
    """What one benchmark run measured.

    Attributes:
        samples: Samples delivered.
        batches: Batches delivered.
        seconds: Wall time from the first ``next()`` to the last batch.
        first_batch_s: Time from creating the iterator to the first batch.
        images_per_s: ``samples / seconds``.
        bytes_per_sample: Bytes read from the store per delivered sample.
        requests_per_sample: GET requests per delivered sample.
        wait_share: Share of the time the consumer waited on the pipeline.
        peak_rss_mb: Peak resident memory of this process.
        requests: GET requests made.
    """

    samples: int
    batches: int
    seconds: float
    first_batch_s: float
    images_per_s: float
    bytes_per_sample: float
    requests_per_sample: float
    wait_share: float
    peak_rss_mb: float
    requests: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def bench_loader(loader: Loader, *, max_batches: int | None = None) -> BenchResult:
    """Run ``loader`` through (at most ``max_batches`` of) one epoch and measure it."""
    before = loader.stats()
    started = time.perf_counter()
    first = 0.0
    batches = samples = 0
    for batch in loader:
        if batches == 0:
            first = time.perf_counter() - started
        batches += 1
        samples += len(batch["label"])
        if max_batches is not None and batches >= max_batches:
            break
    seconds = time.perf_counter() - started
    done = loader.stats().since(before)
    read = done.requests.get("bytes.read", 0)
    gets = done.requests.get("requests.get", 0)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return BenchResult(
        samples=samples,
        batches=batches,
        seconds=seconds,
        first_batch_s=first,
        images_per_s=samples / seconds if seconds > 0 else 0.0,
        bytes_per_sample=read / samples if samples else 0.0,
        requests_per_sample=gets / samples if samples else 0.0,
        wait_share=done.wait_s / seconds if seconds > 0 else 0.0,
        requests=gets,
        peak_rss_mb=rss_kb / 1024,
    )
