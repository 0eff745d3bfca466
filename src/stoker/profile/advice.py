"""The doctor's advice and its text report.

Advice names the setting to change with the value to try, from what was measured: the
round trip and size of each read for a slow store, the thread time per sample for slow
decoding or a slow transform. It is written for where it is read: ``advice_for="cli"``
names ``stoker doctor`` flags (``--threads 8``), ``"python"`` the Loader's arguments
(``decode=DecodeConfig(threads=8)``). It agrees with the autotuner: where autotune chose a
setting, the advice says what it chose and why another value is suggested, if one is.
"""

from __future__ import annotations

import io
import math
import os
from typing import TYPE_CHECKING, Literal

from PIL import Image

from stoker.core.metrics import Stage, StageTotals
from stoker.core.units import format_bytes
from stoker.format.foreign.locations import is_remote
from stoker.pipeline.folder_advice import PACKED_SPEEDUP, pack_command
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import PlannedTransform
from stoker.profile.diagnosis import PHASE_NAMES

if TYPE_CHECKING:
    from stoker.profile.diagnosis import Diagnosis

#: The doctor suggests at most this many read groups in flight (memory grows with it).
MAX_SUGGESTED_PREFETCH = 32

#: Who reads the advice: a command line (flags) or Python code (arguments).
AdviceFor = Literal["python", "cli"]

#: Samples whose stored size the doctor reads before suggesting ``pack --resize``.
SIZE_SAMPLES = 8

_IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp")


def _pick(advice_for: AdviceFor, python: str, cli: str) -> str:
    return cli if advice_for == "cli" else python


def stored_shorter_side(loader: Loader, samples: int = SIZE_SAMPLES) -> int | None:
    """The median shorter side of ``samples`` stored images spread over the dataset.

    Reads only their headers' sizes (a few ranged GETs); None when the dataset holds no
    images or they cannot be read.
    """
    dataset = loader.dataset
    if len(dataset) == 0:
        return None
    step = max(1, len(dataset) // samples)
    sides: list[int] = []
    try:
        for sample in dataset.read_many(range(0, len(dataset), step)[:samples]):
            data = next((sample[f] for f in _IMAGE_FIELDS if f in sample), None)
            if data is not None:
                with Image.open(io.BytesIO(data)) as image:
                    sides.append(min(image.size))
    except (OSError, ValueError):  # a store or format error: say nothing about sizes
        return None
    return sorted(sides)[len(sides) // 2] if sides else None


def advise(diagnosis: Diagnosis, loader: Loader, *, advice_for: AdviceFor = "python") -> list[str]:
    """What to change, most useful first, from what ``diagnosis`` measured on ``loader``.

    Args:
        diagnosis: What the doctor measured.
        loader: The loader it measured (its settings and its autotuner's choices).
        advice_for: Name ``stoker doctor`` flags (``"cli"``) or Python arguments.
    """
    d = diagnosis
    bottleneck, share, load = d.bottleneck, d.input_bound_share, d.load
    empty = StageTotals()
    if bottleneck == "consumer":
        spare = 1.0 - load["decode_threads"]
        return [
            f"Nothing to change in the input pipeline: the step waited for data "
            f"{100 * share:.0f}% of the time.",
            f"It has headroom (decode threads {100 * spare:.0f}% idle); a faster model or a "
            "larger batch would use it.",
        ]
    first = _epoch_start_advice(d) + _unsaturated_advice(d, loader, advice_for)
    if bottleneck == "store":
        return _folder_advice(d, loader) + first + _store_advice(d, loader, advice_for)
    if bottleneck == "decode":
        return first + _decode_advice(d, loader, advice_for)
    transform = d.stages.get(Stage.TRANSFORM, empty)
    if bottleneck == "transform":
        per = transform.seconds / max(transform.items, 1)
        return [
            f"Your transform takes {1000 * per:.1f} ms of thread time per sample and, being "
            "Python, holds the GIL: threads cannot run it in parallel.",
            "Use a built-in transform (stoker.transforms.RandomResizedCrop, CenterCrop) where "
            "it does the same job: it decodes only the crop, at a reduced JPEG scale.",
            'Or run it in worker processes: Loader(decode=DecodeConfig(method="process")) '
            "(the transform must be picklable: a module-level function or class); or move "
            "the augmentation onto the accelerator.",
        ]
    if bottleneck == "collate":
        return [
            "Assembling batches dominates: use a transform with a fixed output size "
            "(RandomResizedCrop, CenterCrop) so images are decoded straight into the batch.",
        ]
    return first + _decode_advice(d, loader, advice_for)


def _epoch_start_advice(d: Diagnosis) -> list[str]:
    """Advice when most of the waiting fell at the start of epochs."""
    waited = sum(d.wait_phases.values())
    at_starts = d.wait_phases.get("epoch_start", 0.0)
    if waited <= 0 or at_starts < 0.5 * waited:
        return []
    return [
        f"{100 * at_starts / waited:.0f}% of the waiting fell in the first batches of "
        f"epochs 2 to {d.epochs}: the pipeline drained between epochs. Iterate the same "
        "Loader for every epoch (it reads and decodes the next epoch's first batches while "
        "one ends; a new Loader, or a DataLoader without persistent_workers, starts cold).",
    ]


def _unsaturated_advice(d: Diagnosis, loader: Loader, advice_for: AdviceFor) -> list[str]:
    """Advice when the stage waited on was idle most of the time: the pipeline started it
    too late (too little ahead), not too slowly."""
    if d.saturated is not False:
        return []
    deeper = _pick(
        advice_for,
        f"Loader(prefetch={min(2 * loader.prefetch, MAX_SUGGESTED_PREFETCH)})",
        f"--prefetch {min(2 * loader.prefetch, MAX_SUGGESTED_PREFETCH)}",
    )
    return [
        f"The {d.bottleneck} stage was waited on but not saturated: its work started too "
        f"late rather than ran too slowly. More ahead helps: {deeper} (now "
        f"{loader.prefetch}).",
    ]


def _decode_advice(d: Diagnosis, loader: Loader, advice_for: AdviceFor) -> list[str]:
    load = d.load
    cores = os.cpu_count() or 1
    decode = d.stages.get(Stage.DECODE, StageTotals())
    per = decode.seconds / max(decode.items, 1)
    advice = [f"Decoding takes {1000 * per:.1f} ms of thread time per sample."]
    tuner = loader._tuner  # what autotune chose, and whether it could
    threads = loader.num_threads
    more = _pick(advice_for, f"Loader(decode=DecodeConfig(threads={cores}))", f"--threads {cores}")
    if load["cpu"] > 0.75:
        advice.append(
            f"The process keeps {100 * load['cpu']:.0f}% of {cores} cores busy: more threads "
            "will not help; more cores per accelerator, or less work per image, will."
        )
    elif tuner.tune_threads and tuner.settled:
        advice.append(
            f"Autotune settled on {threads} decode threads: one more did not raise images/s "
            f"by {100 * tuner.config.min_gain:.0f}%, so more threads would not help here; "
            "less work per image would."
        )
    elif tuner.tune_threads:
        longer = _pick(advice_for, "diagnose(seconds=...)", "stoker doctor --seconds")
        advice.append(
            f"Autotune was still choosing the decode threads ({threads} when the "
            f"measurement ended, on {cores} cores): measure longer ({longer}) to see "
            "where it settles."
        )
    elif threads < cores:
        advice.append(f"More decode threads: {more} (now {threads}, on {cores} cores).")
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
    transform = loader.transform
    if isinstance(transform, PlannedTransform):
        line = (
            "Less work per image: a smaller output size lets the JPEG decode at a smaller "
            "DCT scale (1/2, 1/4, 1/8)."
        )
        size = transform.output_size
        target = round(max(size) * 256 / 224) if size is not None else None
        stored = stored_shorter_side(loader) if target is not None else None
        if target is not None and stored is not None and stored > target:
            line += (
                f" Or pack with `stoker pack --resize {target}`: stored images have a "
                f"shorter side of about {stored} pixels, the output is {max(size or (0,))}."
            )
        advice.append(line)
    else:
        advice.append(
            "Use a built-in RandomResizedCrop or CenterCrop (stoker.transforms): it plans "
            "the crop before decoding and decodes the JPEG at a reduced DCT scale."
        )
    return advice


def _folder_advice(d: Diagnosis, loader: Loader) -> list[str]:
    """The first advice when reads bound an unpacked folder: say so, and how to pack it."""
    source = loader.source
    if not source.one_get_per_unit:
        return []
    gets = d.requests.get("requests.get", 0)
    size = d.requests.get("bytes.read", 0) / max(gets, 1)
    measured = (
        f" ({gets:,} GETs of {format_bytes(size)} on average, "
        f"{gets / max(d.seconds, 1e-9):,.0f} a second)"
        if gets
        else ""
    )
    return [
        f"Reads bound this run: {source.url} is an unpacked folder, read with one GET per "
        f"image{measured}. Pack it with `{pack_command(source.url)}` and point the loader "
        "at the packed copy: its shards are read with ranged GETs of many images each "
        f"(streamed {PACKED_SPEEDUP} in benchmarks/loader.py).",
    ]


def _store_advice(d: Diagnosis, loader: Loader, advice_for: AdviceFor) -> list[str]:
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
    tuner = loader._tuner  # what autotune chose, and why it stopped
    chosen = ""
    if tuner.tune_prefetch:
        budget = tuner.config.max_buffer_bytes
        chosen = (
            f" Autotune stopped at {loader.prefetch}, the most its memory budget for reading "
            f"ahead ({format_bytes(budget)}) allows: in Python, "
            "Loader(autotune=AutotuneConfig(max_buffer_bytes=...)) raises it."
            if tuner.prefetch >= tuner.max_prefetch
            else f" Autotune had chosen {loader.prefetch} when the measurement ended."
        )
    prefetch = _pick(advice_for, f"Loader(prefetch={wanted})", f"--prefetch {wanted}")
    advice = [
        f"Each read group ({group} samples, {format_bytes(per_fetch)}) took "
        f"{1000 * latency:.0f} ms to arrive; {format_bytes(rate)}/s came in over the window.",
        f"More requests in flight: {prefetch} (now {loader.prefetch} read groups) overlaps "
        "more round trips"
        + (
            f"; keeping up with this step would take about {needed}, so make reads bigger too."
            if needed > wanted
            else "."
        )
        + chosen,
    ]
    folder = loader.source.one_get_per_unit  # one GET per image: _folder_advice
    if not folder and per_fetch < 4_000_000:
        bigger = max(loader.order_config.blocks * 4, 1)
        setting = _pick(
            advice_for, f"Loader(order=OrderConfig(block_size={bigger}))", f"--block-size {bigger}"
        )
        advice.append(
            f"Bigger reads: {setting} (now {loader.order_config.blocks} samples per ranged "
            "GET) pays each round trip for more bytes."
        )
    local_folder = folder and not is_remote(loader.source.url)
    if loader.dataset.store.cache is None and not local_folder:  # local files: no cache
        cache = _pick(advice_for, "Loader(cache=CacheConfig(dir=...))", "--cache-dir DIR")
        advice.append(
            f"A disk cache: {cache} serves epochs after the first, and restarts, from local disk."
        )
    retries = d.requests.get("retries", 0)
    if retries:
        rate_limit = _pick(
            advice_for,
            "lower the request rate (StorageOptions(max_requests_per_s=...))",
            "lower the request rate (`stoker --max-requests-per-s N doctor ...`)",
        )
        advice.append(
            f"{retries} requests were retried ({d.requests.get('throttles', 0)} throttled): "
            f"spread shards over prefixes (`stoker pack --prefixes N`) or {rate_limit}."
        )
    advice.append(
        "Run next to the data: a training job in the bucket's region sees a few ms per "
        "request instead of tens."
    )
    return advice


def _phases(d: Diagnosis) -> str:
    waited = sum(d.wait_phases.values())
    if waited <= 0:
        return "no wait measured."
    parts = ", ".join(
        f"{PHASE_NAMES.get(k, k)} {1000 * v:.0f} ms ({100 * v / waited:.0f}%)"
        for k, v in d.wait_phases.items()
        if v > 0
    )
    return f"{parts}; {d.epochs} epoch{'s' if d.epochs != 1 else ''} run."


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
        "  When it fell: " + _phases(d),
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
