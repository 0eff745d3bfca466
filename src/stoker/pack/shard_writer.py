"""Writing one shard of a pack: its samples read (``config.workers`` at once), prepared
(extensions normalised, images checked or re-encoded, other members checked as training
will decode them), written with one atomic PUT, then its record in ``_stoker/`` (see
:mod:`stoker.pack.packer` for the order of writes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.base import AsyncSampleReader, Sample, SampleReader, SampleRef
from stoker.format.spec import (
    IMAGE_FIELDS,
    PACK_STATE_DIR,
    normalise_extension,
    shard_key,
    shard_name,
)
from stoker.format.video import VIDEO_FIELDS, VideoError, VideoIndex
from stoker.format.video_decode import probe_video
from stoker.format.writer import SampleRecord, ShardRecord, ShardWriter
from stoker.pack.config import PackConfig
from stoker.pack.fieldcheck import check_field
from stoker.pack.reencode import process_image
from stoker.pack.video_reencode import reencode_video
from stoker.storage import Store
from stoker.storage.engine import default_engine

#: Samples up to this size are checked on the I/O loop's thread (a 16 kB JPEG decodes in
#: about 0.1 ms); larger ones in the read pool, so the loop is never held long.
INLINE_CHECK_BYTES = 16_384

#: Called by a shard writer as samples are read: ``tick(samples, nbytes)``.
ShardTick = Callable[[int, int], None]


def record_to_json(
    record: ShardRecord,
    skipped: list[dict[str, str]],
    fields: dict[str, int],
    bytes_in: int,
    videos: list[Any] | None = None,
) -> bytes:
    """A shard's record in ``_stoker/``; ``videos`` lists ``[sample number in the shard,
    data offset in the shard, data size, seek index as JSON]`` of each video."""
    return json.dumps(
        {
            "name": record.name,
            "size": record.size,
            "sha256": record.sha256,
            "samples": [[s.key, s.label, s.offset, s.length, s.crc32] for s in record.samples],
            "skipped": skipped,
            "fields": fields,
            "bytes_in": bytes_in,
            "videos": videos or [],
        }
    ).encode()


def record_from_json(data: bytes) -> tuple[ShardRecord, list[dict[str, str]], dict[str, int]]:
    raw = json.loads(data)
    samples = [
        SampleRecord(k, int(lb), int(o), int(n), int(c)) for k, lb, o, n, c in raw["samples"]
    ]
    return (
        ShardRecord(raw["name"], raw["size"], raw["sha256"], samples),
        raw["skipped"],
        raw["fields"],
    )


def record_videos(data: bytes) -> list[tuple[int, int, int, VideoIndex]]:
    """The videos of a shard's record (:func:`record_to_json`): sample number in the
    shard, data offset and size in the shard, seek index."""
    return [
        (int(n), int(offset), int(size), VideoIndex.from_json(index))
        for n, offset, size, index in json.loads(data).get("videos", [])
    ]


def _prepare(sample: Sample, config: PackConfig, where: str) -> Sample:
    """Normalise the sample's extensions (``jpeg`` -> ``jpg``: the names the shard will
    have), check and re-encode its images, re-encode its video where asked and index it
    (:func:`~stoker.format.video_decode.probe_video`), and check its other members as training
    will decode them (:mod:`stoker.pack.fieldcheck`)."""
    policy = config.images
    fields: dict[str, bytes] = {}
    named = [(normalise_extension(ext), data) for ext, data in sample.fields.items()]
    names = [ext for ext, _ in named]
    if len(set(names)) != len(names):
        raise SourceError(
            f"{where}: fields {sorted(sample.fields)} name the same extension twice "
            f"(as {sorted(names)})"
        )
    video = None
    for ext, data in named:
        if ext in VIDEO_FIELDS and video is None:
            try:
                if config.videos.rewrites:
                    data = reencode_video(data, config.videos, where=f"{where}: {ext}")
                    ext = "mp4"
                video = (ext, probe_video(data, where=f"{where}: {ext}"))
            except VideoError as exc:
                raise SourceError(str(exc)) from exc
            fields[ext] = data
        elif ext in IMAGE_FIELDS:
            new_ext, data = process_image(data, ext, policy, where=where)
            fields[new_ext] = data
        else:
            check_field(ext, data, key=sample.key, where=where, policy=policy)
            fields[ext] = data
    return Sample(key=sample.key, fields=fields, label=sample.label, video=video)


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
            heavy = (
                config.images.rewrites
                or any(e in VIDEO_FIELDS for e in sample.fields)
                or (
                    config.images.check
                    and sum(map(len, sample.fields.values())) > INLINE_CHECK_BYTES
                )
            )
            if heavy:
                return await loop.run_in_executor(pool, _prepare, sample, config, ref.location)
            return _prepare(sample, config, ref.location)
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
            return _prepare(reader.read(ref), config, ref.location)
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
    videos: list[Any] = []
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
                    written = writer.add(loaded)
                except ValueError as exc:
                    if config.on_error == "raise":
                        raise SourceError(f"{ref.location}: {exc}") from exc
                    skipped.append({"key": ref.key, "source": ref.location, "reason": str(exc)})
                    continue
                for ext in loaded.fields:
                    fields[ext] = fields.get(ext, 0) + 1
                if loaded.video is not None:
                    ext, index = loaded.video
                    start = written.offset + writer.data_offset(loaded, ext)
                    size = len(loaded.fields[ext])
                    videos.append([len(writer) - 1, start, size, index.to_json()])
            size = max(ref.size, 0)
            bytes_in += size
            if progress is not None:
                progress(1, size)
    finally:
        if own_pool:
            pool.shutdown(wait=True, cancel_futures=True)
    record = writer.close()
    payload = record_to_json(record, skipped, fields, bytes_in, videos)
    store.put(f"{PACK_STATE_DIR}/{shard_name(number).removesuffix('.tar')}.json", payload)
    return payload
