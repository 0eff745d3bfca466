"""pack(): foreign input -> optional resize/re-encode -> indexed shards, resumable.

The run is planned before anything is read (:func:`~stoker.pack.plan.plan_shards`), so each
shard can be written on its own: by a pool of local threads, or by Ray tasks. Commit order
makes a crash harmless:

1. ``_stoker/plan.json`` records the plan's id (input listing + arguments);
2. each shard is written with one atomic PUT, then its record ``_stoker/shard-N.json``
   (offsets, checksums, skipped inputs) — a record exists only for a complete shard;
3. when every shard has its record, ``index.bin`` and then ``index.json`` are written.

A rerun with the same input and arguments reads the records that exist and writes only the
missing shards; a rerun with different ones is refused rather than mixed in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from stoker.errors import SourceError
from stoker.format.foreign.base import AsyncSampleReader, Sample, SampleReader, SampleRef
from stoker.format.index import DatasetIndex, write_index
from stoker.format.spec import (
    IMAGE_FIELDS,
    MAX_PREFIXES,
    PACK_STATE_DIR,
    normalise_extension,
    shard_key,
    shard_name,
)
from stoker.format.writer import SampleRecord, ShardRecord, ShardWriter
from stoker.pack.fieldcheck import check_field
from stoker.pack.plan import plan_shards
from stoker.pack.reencode import ImagePolicy, process_image
from stoker.pack.report import PackProgress, PackReport
from stoker.pack.resume import check_shards_present, resume_state
from stoker.pack.sources import check_class_names, open_reader, refuse_destination_in_source
from stoker.storage import Store, open_store
from stoker.storage.engine import default_engine

logger = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 128_000_000
#: Samples up to this size are checked on the I/O loop's thread (a 16 kB JPEG decodes in
#: about 0.1 ms); larger ones in the read pool, so the loop is never held long.
INLINE_CHECK_BYTES = 16_384


@dataclass(frozen=True, slots=True, kw_only=True)
class PackConfig:
    """How to pack.

    Attributes:
        max_shard_bytes: Target shard size, cut by input bytes.
        samples_per_shard: Cut by sample count instead.
        images: Checking, resizing and re-encoding of images. Its ``check`` also says
            whether the other members are checked as training will decode them (``npy``
            headers and sizes, JSON, UTF-8 text, integer ``cls``; see
            :mod:`stoker.pack.fieldcheck`).
        shuffle_seed: Pack the samples in the random order of this seed (recorded in the
            index), so that every read group, and so every batch, mixes classes whatever the
            order the input lists them in (class folders are sorted). None keeps the input's
            order, which windows of consecutive records (video frames) need.
        workers: Samples read at once (threads; reads release the GIL).
        shards_in_flight: Shards built at once (each holds its bytes in memory).
        engine: ``"local"`` threads, or ``"ray"`` tasks that each write whole shards.
        on_error: ``"raise"`` stops at the first bad input, naming it; ``"skip"`` leaves it
            out and records it, with the reason, in the manifest and the report.
        prefixes: Key prefixes the shards are spread over (``40/shard-000001.tar``), so
            that reads can pass one S3 prefix's request limit; 1 keeps them flat.
    """

    max_shard_bytes: int = DEFAULT_SHARD_BYTES
    samples_per_shard: int | None = None
    images: ImagePolicy = field(default_factory=ImagePolicy)
    shuffle_seed: int | None = 0
    workers: int = 32
    shards_in_flight: int = 2
    engine: Literal["local", "ray"] = "local"
    on_error: Literal["raise", "skip"] = "raise"
    prefixes: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.prefixes <= MAX_PREFIXES:
            raise ValueError(f"prefixes must be between 1 and {MAX_PREFIXES}, got {self.prefixes}")
        if self.workers < 1 or self.shards_in_flight < 1:
            raise ValueError("workers and shards_in_flight must be >= 1")
        if self.engine not in ("local", "ray"):
            raise ValueError(f"engine must be 'local' or 'ray', got {self.engine!r}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")

    def output_params(self) -> dict[str, Any]:
        """The parameters that change the bytes written (part of the plan id)."""
        # One prefix adds nothing, so plans and manifests of flat packs stay as they were.
        spread = {"prefixes": self.prefixes} if self.prefixes > 1 else {}
        return {"images": asdict(self.images), **spread}


#: Called by a shard writer as samples are read: ``tick(samples, nbytes)``.
ShardTick = Callable[[int, int], None]


def _record_to_json(
    record: ShardRecord, skipped: list[dict[str, str]], fields: dict[str, int], bytes_in: int
) -> bytes:
    return json.dumps(
        {
            "name": record.name,
            "size": record.size,
            "sha256": record.sha256,
            "samples": [[s.key, s.label, s.offset, s.length, s.crc32] for s in record.samples],
            "skipped": skipped,
            "fields": fields,
            "bytes_in": bytes_in,
        }
    ).encode()


def _record_from_json(data: bytes) -> tuple[ShardRecord, list[dict[str, str]], dict[str, int]]:
    raw = json.loads(data)
    samples = [
        SampleRecord(k, int(lb), int(o), int(n), int(c)) for k, lb, o, n, c in raw["samples"]
    ]
    return (
        ShardRecord(raw["name"], raw["size"], raw["sha256"], samples),
        raw["skipped"],
        raw["fields"],
    )


def _prepare(sample: Sample, policy: ImagePolicy, where: str) -> Sample:
    """Normalise the sample's extensions (``jpeg`` -> ``jpg``: the names the shard will
    have), check and re-encode its images, and check its other members as training will
    decode them (:mod:`stoker.pack.fieldcheck`)."""
    fields: dict[str, bytes] = {}
    named = [(normalise_extension(ext), data) for ext, data in sample.fields.items()]
    names = [ext for ext, _ in named]
    if len(set(names)) != len(names):
        raise SourceError(
            f"{where}: fields {sorted(sample.fields)} name the same extension twice "
            f"(as {sorted(names)})"
        )
    for ext, data in named:
        if ext in IMAGE_FIELDS:
            new_ext, data = process_image(data, ext, policy, where=where)
            fields[new_ext] = data
        else:
            check_field(ext, data, key=sample.key, where=where, policy=policy)
            fields[ext] = data
    return Sample(key=sample.key, fields=fields, label=sample.label)


async def _load_all_async(
    reader: AsyncSampleReader,
    refs: Sequence[SampleRef],
    config: PackConfig,
    pool: ThreadPoolExecutor,
) -> list[Sample | tuple[SampleRef, str]]:
    """Read a shard's samples with ``config.workers`` reads in flight on the I/O loop."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(config.workers)

    async def load(ref: SampleRef) -> Sample | tuple[SampleRef, str]:
        try:
            async with slots:
                sample = await reader.read_async(ref)
            # Decoding goes off the loop thread, except the check of a small sample: its
            # decode (about 1 us per 100 bytes) costs less than the hand-over to a thread.
            heavy = config.images.rewrites or (
                config.images.check and sum(map(len, sample.fields.values())) > INLINE_CHECK_BYTES
            )
            if heavy:
                return await loop.run_in_executor(
                    pool, _prepare, sample, config.images, ref.location
                )
            return _prepare(sample, config.images, ref.location)
        except SourceError as exc:
            if config.on_error == "raise":
                raise
            return ref, str(exc)

    return list(await asyncio.gather(*(load(ref) for ref in refs)))


def write_one_shard(
    reader: SampleReader,
    refs: Sequence[SampleRef],
    number: int,
    store: Store,
    config: PackConfig,
    *,
    read_pool: ThreadPoolExecutor | None = None,
    progress: ShardTick | None = None,
) -> bytes:
    """Read, check and write shard ``number`` and its record; returns the record's JSON.

    Raises:
        SourceError: A bad input, with ``on_error="raise"``.
    """

    def load(ref: SampleRef) -> Sample | tuple[SampleRef, str]:
        try:
            return _prepare(reader.read(ref), config.images, ref.location)
        except SourceError as exc:
            if config.on_error == "raise":
                raise
            return ref, str(exc)

    own_pool = read_pool is None
    pool = read_pool or ThreadPoolExecutor(config.workers, thread_name_prefix="stoker-pack")
    writer = ShardWriter(store, shard_key(number, prefixes=config.prefixes))
    skipped: list[dict[str, str]] = []
    fields: dict[str, int] = {}
    bytes_in = 0
    try:
        if isinstance(reader, AsyncSampleReader) and reader.reads_remote:
            loaded_all = default_engine().run(_load_all_async(reader, refs, config, pool))
        else:
            loaded_all = list(pool.map(load, refs))
        for ref, loaded in zip(refs, loaded_all, strict=True):
            if isinstance(loaded, tuple):
                skipped.append({"key": ref.key, "source": ref.location, "reason": loaded[1]})
            else:
                try:
                    writer.add(loaded)
                except ValueError as exc:
                    if config.on_error == "raise":
                        raise SourceError(f"{ref.location}: {exc}") from exc
                    skipped.append({"key": ref.key, "source": ref.location, "reason": str(exc)})
                    continue
                for ext in loaded.fields:
                    fields[ext] = fields.get(ext, 0) + 1
            size = max(ref.size, 0)
            bytes_in += size
            if progress is not None:
                progress(1, size)
    finally:
        if own_pool:
            pool.shutdown(wait=True, cancel_futures=True)
    record = writer.close()
    payload = _record_to_json(record, skipped, fields, bytes_in)
    store.put(f"{PACK_STATE_DIR}/{shard_name(number).removesuffix('.tar')}.json", payload)
    return payload


def pack(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    config: PackConfig | None = None,
    source_format: str = "auto",
    storage_options: Mapping[str, Any] | None = None,
    progress: PackProgress | None = None,
    class_names: Sequence[str] | None = None,
    allow_outside_list: bool = False,
) -> PackReport:
    """Pack ``source`` into indexed shards at ``destination``.

    Args:
        source: Image folder (local or bucket), CSV/JSONL list, WebDataset tars, TFRecord
            files or an HDF5 file.
        destination: Where the dataset goes (``s3://bucket/dataset`` or a local path).
        config: Shard size, image handling, order, parallelism, error policy.
        source_format: ``"auto"`` (guess from names) or one of ``"imagefolder"``,
            ``"list"``, ``"webdataset"``, ``"tfrecord"``, ``"hdf5"``.
        storage_options: For both source and destination (see :func:`stoker.open_store`).
        progress: Called as ``progress(total, samples, nbytes)`` as samples are read (see
            :data:`~stoker.pack.report.PackProgress`).
        class_names: Names of the labels, in label order, for the index (and for a list's
            class-name labels); an image folder's names are its folders, and must match.
        allow_outside_list: Let a CSV/JSONL list name files outside its own folder.

    Returns:
        What was packed.

    Raises:
        SourceError: Bad input with ``on_error="raise"``; names the file or record.
        StokerError: The destination holds a pack made from other input or arguments
            (the message names the arguments that differ).
        ValueError: The destination lies inside the source folder, or holds anything
            but an unfinished or finished pack of the same input and arguments (the
            message names what is there).
    """
    config = config or PackConfig()
    started = time.perf_counter()
    refuse_destination_in_source(os.fspath(source), os.fspath(destination))
    reader, fmt = open_reader(
        os.fspath(source),
        source_format=source_format,
        storage_options=storage_options,
        on_error=config.on_error,
        class_names=class_names,
        allow_outside_list=allow_outside_list,
    )
    refs = reader.refs()
    names = check_class_names(class_names, reader.class_names, refs)
    plan = plan_shards(
        refs,
        max_shard_bytes=config.max_shard_bytes,
        samples_per_shard=config.samples_per_shard,
        shuffle_seed=config.shuffle_seed,
        params=config.output_params(),
    )
    store = open_store(destination, storage_options=storage_options)
    report = PackReport(source=reader.description, source_format=fmt, destination=store.url)
    keys = [shard_key(n, prefixes=config.prefixes) for n in range(len(plan.shards))]
    done = resume_state(store, plan, fmt, reader.description, shard_keys=keys)
    todo = [n for n in range(len(plan.shards)) if n not in done]
    report.shards_reused = len(done)
    if progress is not None:
        reused = sum(len(plan.shards[n]) for n in done)
        progress(len(refs), reused, 0)
    lock = threading.Lock()

    def tick(samples: int, nbytes: int) -> None:
        with lock:
            report.bytes_in += nbytes
        if progress is not None:
            progress(len(refs), samples, nbytes)

    payloads = dict(done)
    shard_refs = {n: [refs[i] for i in plan.shards[n]] for n in todo}
    if config.engine == "ray":
        from stoker.pack.ray_engine import write_shards_with_ray

        payloads.update(
            write_shards_with_ray(
                reader,
                shard_refs,
                store.url,
                storage_options,
                config,
                tick,
                write_shard=write_one_shard,
            )
        )
    else:
        with (
            ThreadPoolExecutor(config.workers, thread_name_prefix="stoker-pack-read") as reads,
            ThreadPoolExecutor(
                config.shards_in_flight, thread_name_prefix="stoker-pack-shard"
            ) as shards,
        ):
            futures = {
                n: shards.submit(
                    write_one_shard,
                    reader,
                    shard_refs[n],
                    n,
                    store,
                    config,
                    read_pool=reads,
                    progress=tick,
                )
                for n in todo
            }
            for n, future in futures.items():
                payloads[n] = future.result()

    records: list[ShardRecord] = []
    fields: dict[str, int] = {}
    skipped = list(getattr(reader, "problems", []))
    for n in range(len(plan.shards)):
        record, shard_skipped, shard_fields = _record_from_json(payloads[n])
        records.append(record)
        skipped.extend(shard_skipped)
        for ext, count in shard_fields.items():
            fields[ext] = fields.get(ext, 0) + count
        if n in todo:
            report.bytes_out += record.size
    packed_with = {
        "source": reader.description,
        "format": fmt,
        "plan_id": plan.plan_id,
        "max_shard_bytes": config.max_shard_bytes,
        "samples_per_shard": config.samples_per_shard,
        "shuffle_seed": config.shuffle_seed,
        **config.output_params(),
    }
    check_shards_present(store, records)
    index = DatasetIndex.from_shards(
        [r for r in records if r.samples],
        class_names=names,
        fields=fields,
        packed_with=packed_with,
        skipped=skipped,
    )
    write_index(store, index)
    report.samples = len(index)
    report.shards = len(index.shards)
    report.skipped = skipped
    report.requests = {"source": reader.requests(), "destination": store.counters.snapshot()}
    report.seconds = time.perf_counter() - started
    return report
