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

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from stoker.format.foreign.base import SampleReader, SampleRef
from stoker.format.index import DatasetIndex, write_index
from stoker.format.spec import shard_key
from stoker.format.video_table import VIDEOS_NAME, VideoEntry, encode_videos, videos_manifest
from stoker.format.writer import ShardRecord
from stoker.pack.config import DEFAULT_SHARD_BYTES, PackConfig
from stoker.pack.plan import PackPlan, plan_shards
from stoker.pack.report import PackProgress, PackReport
from stoker.pack.resume import check_shards_present, resume_state
from stoker.pack.shard_writer import (
    ShardTick,
    record_from_json,
    record_videos,
    write_one_shard,
)
from stoker.pack.sources import check_class_names, open_reader, refuse_destination_in_source
from stoker.storage import Store, open_store

if TYPE_CHECKING:
    from stoker.pack.tokenizers import Tokenizer
    from stoker.pack.tokens import TokenPackConfig

logger = logging.getLogger(__name__)

# Importable from here as before.
__all__ = ["DEFAULT_SHARD_BYTES", "PackConfig", "PackReport", "pack", "write_one_shard"]


def pack(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    config: PackConfig | TokenPackConfig | None = None,
    source_format: str = "auto",
    storage_options: Mapping[str, Any] | None = None,
    progress: PackProgress | None = None,
    class_names: Sequence[str] | None = None,
    allow_outside_list: bool = False,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    offsets: str | os.PathLike[str] | None = None,
) -> PackReport:
    """Pack ``source`` into indexed shards at ``destination``: samples, or, with a
    :class:`~stoker.pack.tokens.TokenPackConfig`, token documents (as
    :func:`~stoker.pack.tokens.pack_tokens`, which takes ``tokenizer`` and ``offsets``).

    Every pack follows one destination rule (empty, or holding a pack of the same input and
    arguments, which the run resumes), reports progress as ``progress(total, samples,
    nbytes)`` (see :data:`~stoker.pack.report.PackProgress`) and returns a
    :class:`~stoker.pack.report.PackReport`.

    Args:
        source: Image folder (local or bucket), CSV/JSONL list, WebDataset tars, TFRecord
            files or an HDF5 file; for tokens, ``.npy``/``.bin`` documents, concatenated
            tokens, or JSONL or Parquet text.
        destination: Where the dataset goes (``s3://bucket/dataset`` or a local path).
        config: Shard size, image handling, order, parallelism, error policy; a
            ``TokenPackConfig`` packs tokens.
        source_format: ``"auto"`` (guess from names) or one of ``"imagefolder"``,
            ``"list"``, ``"webdataset"``, ``"tfrecord"``, ``"hdf5"``.
        storage_options: For both source and destination (see :func:`stoker.open_store`).
        progress: Called as ``progress(total, samples, nbytes)`` as samples are read.
        class_names: Names of the labels, in label order, for the index (and for a list's
            class-name labels); an image folder's names are its folders, and must match.
        allow_outside_list: Let a CSV/JSONL list name files outside its own folder.
        tokenizer: For token text (see :func:`~stoker.pack.tokens.pack_tokens`).
        offsets: For concatenated tokens (see :func:`~stoker.pack.tokens.pack_tokens`).

    Returns:
        What was packed.

    Raises:
        SourceError: Bad input with ``on_error="raise"``; names the file or record.
        StokerError: The destination holds a pack made from other input or arguments
            (the message names the arguments that differ).
        ValueError: The destination lies inside the source folder, or holds anything
            but an unfinished or finished pack of the same input and arguments (the
            message names what is there); arguments of one kind of pack given to the other.
    """
    from stoker.pack.tokens import TokenPackConfig, pack_tokens

    tokens = isinstance(config, TokenPackConfig)
    sample_options = source_format != "auto" or class_names is not None or allow_outside_list
    token_options = tokenizer is not None or offsets is not None
    if (tokens and sample_options) or (not tokens and token_options):
        raise ValueError(
            "source_format, class_names and allow_outside_list apply to a pack of samples; "
            "tokenizer and offsets to a pack of tokens (config=TokenPackConfig(...))"
        )
    if isinstance(config, TokenPackConfig):
        return pack_tokens(
            source,
            destination,
            config=config,
            tokenizer=tokenizer,
            offsets=offsets,
            storage_options=storage_options,
            progress=progress,
        )
    return _pack_samples(
        source,
        destination,
        config or PackConfig(),
        source_format=source_format,
        storage_options=storage_options,
        progress=progress,
        class_names=class_names,
        allow_outside_list=allow_outside_list,
    )


def _pack_samples(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    config: PackConfig,
    *,
    source_format: str,
    storage_options: Mapping[str, Any] | None,
    progress: PackProgress | None,
    class_names: Sequence[str] | None,
    allow_outside_list: bool,
) -> PackReport:
    """:func:`pack` of samples (images, records) with ``config``."""
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
    payloads.update(_write_shards(reader, shard_refs, store, config, tick, storage_options))
    _commit(store, reader, fmt, plan, config, payloads, set(todo), names, report)
    report.requests = {"source": reader.requests(), "destination": store.counters.snapshot()}
    report.seconds = time.perf_counter() - started
    return report


def _write_shards(
    reader: SampleReader,
    shard_refs: dict[int, list[SampleRef]],
    store: Store,
    config: PackConfig,
    tick: ShardTick,
    storage_options: Mapping[str, Any] | None,
) -> dict[int, bytes]:
    """Write each shard of ``shard_refs`` and its record (by local threads, or Ray tasks
    with ``engine="ray"``); each shard's record as JSON, by number."""
    if config.engine == "ray":
        from stoker.pack.ray_engine import write_shards_with_ray

        return write_shards_with_ray(
            reader,
            shard_refs,
            store.url,
            storage_options,
            config,
            tick,
            write_shard=write_one_shard,
        )
    with (
        ThreadPoolExecutor(config.workers, thread_name_prefix="stoker-pack-read") as reads,
        ThreadPoolExecutor(config.shards_in_flight, thread_name_prefix="stoker-pack-shard") as pool,
    ):
        futures = {
            n: pool.submit(
                write_one_shard, reader, refs, n, store, config, read_pool=reads, progress=tick
            )
            for n, refs in shard_refs.items()
        }
        return {n: future.result() for n, future in futures.items()}


def _commit(
    store: Store,
    reader: SampleReader,
    fmt: str,
    plan: PackPlan,
    config: PackConfig,
    payloads: dict[int, bytes],
    written: set[int],
    names: list[str],
    report: PackReport,
) -> None:
    """Gather every shard's record, check the shards are there, and write the index (the
    commit point); the report gets the dataset's counts, the skipped inputs and the bytes
    of the shards this run ``written``."""
    records: list[ShardRecord] = []
    fields: dict[str, int] = {}
    videos: list[VideoEntry] = []
    skipped = list(getattr(reader, "problems", []))
    for n in range(len(plan.shards)):
        record, shard_skipped, shard_fields = record_from_json(payloads[n])
        before = sum(len(r.samples) for r in records)
        videos.extend(
            VideoEntry(before + i, offset, size, index)
            for i, offset, size, index in record_videos(payloads[n])
        )
        records.append(record)
        skipped.extend(shard_skipped)
        for ext, count in shard_fields.items():
            fields[ext] = fields.get(ext, 0) + count
        if n in written:
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
    if videos:
        table = encode_videos(videos)
        store.put(VIDEOS_NAME, table)
        index.videos = videos_manifest(table)
    write_index(store, index)
    report.samples, report.shards, report.skipped = len(index), len(index.shards), skipped
