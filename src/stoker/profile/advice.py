"""The doctor's advice and its text report.

Advice names the setting to change with the value to try, from what was measured: the
round trip and size of each read for a slow store, the thread time per sample for slow
decoding or a slow transform.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from stoker.core.metrics import Stage, StageTotals
from stoker.core.units import format_bytes
from stoker.pipeline.autotune import default_threads
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import PlannedTransform

if TYPE_CHECKING:
    from stoker.profile.diagnosis import Diagnosis

#: The doctor suggests at most this many read groups in flight (memory grows with it).
MAX_SUGGESTED_PREFETCH = 32


def advise(diagnosis: Diagnosis, loader: Loader) -> list[str]:
    """What to change, most useful first, from what ``diagnosis`` measured on ``loader``."""
    d = diagnosis
    bottleneck, share, load = d.bottleneck, d.input_bound_share, d.load
    cores = os.cpu_count() or 1
    empty = StageTotals()
    if bottleneck == "consumer":
        spare = 1.0 - load["decode_threads"]
        return [
            f"Nothing to change in the input pipeline: the step waited for data "
            f"{100 * share:.0f}% of the time.",
            f"It has headroom (decode threads {100 * spare:.0f}% idle); a faster model or a "
            "larger batch would use it.",
        ]
    if bottleneck == "store":
        return _store_advice(d, loader)
    decode = d.stages.get(Stage.DECODE, empty)
    transform = d.stages.get(Stage.TRANSFORM, empty)
    if bottleneck == "transform":
        per = transform.seconds / max(transform.items, 1)
        return [
            f"Your transform takes {1000 * per:.1f} ms of thread time per sample and, being "
            "Python, holds the GIL: threads cannot run it in parallel.",
            "Use a built-in transform (stoker.transforms.RandomResizedCrop, CenterCrop) where "
            "it does the same job: it decodes only the crop, at a reduced JPEG scale.",
            'Or run it in worker processes: Loader(method="process") (the transform must be '
            "picklable: a module-level function or class); or move the augmentation onto "
            "the accelerator.",
        ]
    if bottleneck == "collate":
        return [
            "Assembling batches dominates: use a transform with a fixed output size "
            "(RandomResizedCrop, CenterCrop) so images are decoded straight into the batch.",
        ]
    per = decode.seconds / max(decode.items, 1)
    advice = [f"Decoding takes {1000 * per:.1f} ms of thread time per sample."]
    if loader.num_threads < cores:
        advice.append(
            f"More decode threads: Loader(num_threads={default_threads()}) "
            f"(now {loader.num_threads}, on {cores} cores)."
        )
    elif load["cpu"] > 0.75:
        advice.append(
            f"The process keeps {100 * load['cpu']:.0f}% of {cores} cores busy: more threads "
            "will not help; more cores per accelerator, or less work per image, will."
        )
    busy_s = load["decode_busy"]  # thread-seconds per second
    on_cpu = load["cpu"] * cores / busy_s if busy_s > 0 else 1.0
    if load["decode_threads"] > 0.5 and on_cpu < 0.6 and load["cpu"] < 0.6:
        # Busy threads, idle process: the cores (or the GIL) are held elsewhere.
        advice.insert(
            1,
            f"The decoders ran on a core only {100 * on_cpu:.0f}% of the time they were busy, "
            f"and the process used {100 * load['cpu']:.0f}% of the cores (machine load "
            f"{load['machine']:.1f} per core): other processes hold them. Give the job its "
            "own cores before tuning stoker.",
        )
    if isinstance(loader.transform, PlannedTransform):
        advice.append(
            "Less work per image: a smaller output size lets the JPEG decode at a smaller "
            "DCT scale (1/2, 1/4, 1/8); or pack with `stoker pack --resize SHORTER_SIDE` "
            "so stored images are nearer the training size."
        )
    else:
        advice.append(
            "Use a built-in RandomResizedCrop or CenterCrop (stoker.transforms): it plans "
            "the crop before decoding and decodes the JPEG at a reduced DCT scale."
        )
    return advice


def _store_advice(d: Diagnosis, loader: Loader) -> list[str]:
    fetch = d.stages.get(Stage.FETCH, StageTotals())
    latency = fetch.seconds / max(fetch.calls, 1)
    per_fetch = fetch.bytes / max(fetch.calls, 1)
    rate = fetch.bytes / max(d.seconds, 1e-9)
    group = loader.order_config.group_samples
    decode = d.stages.get(Stage.DECODE, StageTotals())
    decode_batch_s = decode.seconds / max(decode.items, 1) * loader.batch_size
    decode_batch_s /= loader.num_threads
    target = loader.batch_size / max(d.step_s, decode_batch_s, 1e-3)  # samples/s wanted
    needed = math.ceil(latency * target / max(group, 1)) + 1
    wanted = min(max(loader.prefetch * 2, needed), MAX_SUGGESTED_PREFETCH)
    advice = [
        f"Each read group ({group} samples, {format_bytes(per_fetch)}) took "
        f"{1000 * latency:.0f} ms to arrive; {format_bytes(rate)}/s came in over the window.",
        f"More requests in flight: Loader(prefetch={wanted}) (now {loader.prefetch} read "
        "groups) overlaps more round trips"
        + (
            f"; keeping up with this step would take about {needed}, so make reads bigger too."
            if needed > wanted
            else "."
        ),
    ]
    if per_fetch < 4_000_000:
        bigger = max(loader.order_config.blocks * 4, 1)
        advice.append(
            f"Bigger reads: OrderConfig(block_size={bigger}) (now "
            f"{loader.order_config.blocks} samples per ranged GET) pays each round trip "
            "for more bytes."
        )
    if loader.dataset.store.cache is None:
        advice.append(
            "A disk cache: Loader(cache=CacheConfig(dir=...)) (or `stoker bench --cache-dir`) "
            "serves epochs after the first, and restarts, from local disk."
        )
    retries = d.requests.get("retries", 0)
    if retries:
        advice.append(
            f"{retries} requests were retried ({d.requests.get('throttles', 0)} throttled): "
            "spread shards over prefixes (`stoker pack --prefixes N`) or lower the request "
            "rate (StorageOptions(max_requests_per_s=...))."
        )
    advice.append(
        "Run next to the data: a training job in the bucket's region sees a few ms per "
        "request instead of tens."
    )
    return advice


def format_diagnosis(diagnosis: Diagnosis) -> str:
    """The report as text: verdict, shares, stage table and advice."""
    d = diagnosis
    lines = [
        f"{d.url}: {d.verdict.upper()}",
        f"  at a {1000 * d.step_s:g} ms step, the training loop waited for data "
        f"{100 * d.input_bound_share:.0f}% of the time "
        f"({d.batches} batches of {d.batch_size} in {d.seconds:.1f} s, "
        f"{d.images_per_s:,.0f} images/s; first batch after {d.first_batch_s:.2f} s).",
        "  Where the wait went: "
        + ", ".join(f"{k} {100 * v:.0f}%" for k, v in d.wait_shares.items() if v >= 0.005),
        f"  Load: requests in flight {100 * d.load['store']:.0f}% of the time "
        f"({d.load['requests_in_flight']:.1f} read groups on average, {d.prefetch} allowed); "
        f"decode threads: {d.load['decode_busy']:.1f} busy on average ({d.num_threads} at the "
        "end); "
        f"CPU {100 * d.load['cpu']:.0f}% (machine load {d.load['machine']:.1f} per core).",
    ]
    throttles = d.requests.get("throttles", 0)
    if throttles:
        sent = sum(v for k, v in d.requests.items() if k.startswith("requests."))
        rates = ", ".join(f"{prefix} at {rate:,.0f}/s" for prefix, rate in d.request_rates.items())
        lines.append(
            f"  Throttled: the store answered {throttles} of {sent} requests 503 SlowDown or "
            "429 (its per-prefix limit)" + (f"; requests now shaped to {rates}." if rates else ".")
        )
    lines += [
        "",
        f"  {'stage':<15}{'seconds':>9}{'calls':>8}{'items':>9}{'bytes':>11}",
    ]
    for name, totals in d.stages.items():
        lines.append(
            f"  {name:<15}{totals.seconds:>9.3f}{totals.calls:>8}{totals.items:>9}"
            f"{format_bytes(totals.bytes) if totals.bytes else '':>11}"
        )
    lines += ["", "What to do:"] + [f"  - {line}" for line in d.advice]
    return "\n".join(lines)
