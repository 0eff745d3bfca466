"""Measure a loader: images per second, time to first batch, bytes and requests per sample."""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass
from typing import Any

from stoker.core.metrics import Stage
from stoker.pipeline.loader import Loader
from stoker.pipeline.stats import samples_per_epoch


@dataclass(frozen=True, slots=True)
class BenchResult:
    """What one benchmark run measured.

    Attributes:
        samples: Samples delivered.
        batches: Batches delivered.
        seconds: Wall time from the first ``next()`` to the last batch.
        first_batch_s: Time from creating the iterator to the first batch.
        images_per_s: ``samples / seconds``.
        bytes_per_sample: Bytes read from the store per sample fetched (a whole epoch
            fetches what it delivers; a part of one also fetches some samples ahead).
        requests_per_sample: GET requests per sample fetched.
        wait_share: Share of the time the consumer waited on the pipeline.
        peak_rss_mb: Peak resident memory of this process.
        requests: GET requests made.
        epoch_samples: Samples this rank delivers in a whole epoch.
        requests_per_epoch: GET requests of a whole epoch: ``requests`` when the run was
            one, else at the rate of the samples fetched so far.
        whole_epoch: Whether the run was a whole epoch.
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
    epoch_samples: int = 0
    requests_per_epoch: int = 0
    whole_epoch: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def bench_loader(loader: Loader, *, max_batches: int | None = None) -> BenchResult:
    """Run ``loader`` through (at most ``max_batches`` of) one epoch and measure it (the
    next epoch is not read ahead, so the requests and bytes are this epoch's)."""
    loader.read_ahead = False
    before = loader.stats()
    epoch_samples = samples_per_epoch(
        loader.source.epoch_order(loader.order_config, loader.epoch),
        world=loader.world,
        batch_size=loader.batch_size,
        drop_last=loader.drop_last,
    )
    started = time.perf_counter()
    first = 0.0
    batches = samples = 0
    whole = True
    for batch in loader:
        if batches == 0:
            first = time.perf_counter() - started
        batches += 1
        samples += len(batch["index"])
        if max_batches is not None and batches >= max_batches:
            whole = batches == len(loader)
            break
    seconds = time.perf_counter() - started
    done = loader.stats().since(before)
    read = done.requests.get("bytes.read", 0)
    gets = done.requests.get("requests.get", 0)
    fetched = done.stages[Stage.FETCH].items if Stage.FETCH in done.stages else 0
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return BenchResult(
        samples=samples,
        batches=batches,
        seconds=seconds,
        first_batch_s=first,
        images_per_s=samples / seconds if seconds > 0 else 0.0,
        bytes_per_sample=read / fetched if fetched else 0.0,
        requests_per_sample=gets / fetched if fetched else 0.0,
        wait_share=done.wait_s / seconds if seconds > 0 else 0.0,
        requests=gets,
        peak_rss_mb=rss_kb / 1024,
        epoch_samples=epoch_samples,
        # Part of an epoch: at the rate of the samples fetched (some ahead of delivery).
        requests_per_epoch=gets if whole else round(gets / max(fetched, 1) * epoch_samples),
        whole_epoch=whole,
    )
