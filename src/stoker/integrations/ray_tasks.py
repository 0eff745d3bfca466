"""What runs inside Ray's worker processes for :func:`stoker.integrations.ray.read_dataset`:
the dataset opened once per process, a read task's groups fetched as blocks of raw
members, and those blocks decoded by the Loader's decode stage into Arrow tables."""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from stoker.core.metrics import Stages
from stoker.format.reader import ShardDataset, member_entry, member_extension
from stoker.format.video_decode import clip_from_row, clip_row
from stoker.pipeline.batcher import BatcherSettings
from stoker.pipeline.clips import VideoConfig
from stoker.pipeline.config import SAMPLE_PAGE_BYTES, DecodeConfig, SourceConfig
from stoker.pipeline.source import Source
from stoker.pipeline.sources import open_source

#: What a process without Ray Data is told.
NEEDS_RAY = (
    "stoker.integrations.ray needs Ray Data (and Ray Train for iter_torch_batches and "
    "get_dataset_shard): pip install 'ray[data,train]'"
)

try:
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no types
    from ray.data.extensions import ArrowPythonObjectArray, ArrowTensorArray
except ImportError as exc:  # pragma: no cover - the extra names itself
    raise ImportError(NEEDS_RAY) from exc

logger = logging.getLogger("stoker.integrations.ray")

#: Column prefix of a member's raw bytes in the read tasks' blocks.
MEMBER_PREFIX = "member:"


class Where:
    """Where a worker finds the data: its URL, the columns read (a Parquet table's) or
    the clips (a dataset of videos'), the storage options and the fingerprint of what the
    driver planned from."""

    __slots__ = ("columns", "fingerprint", "storage_options", "url", "video")

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any],
        fingerprint: str,
        columns: tuple[str, ...] | None = None,
        video: VideoConfig | None = None,
    ) -> None:
        self.url = url
        self.storage_options = storage_options
        self.fingerprint = fingerprint
        self.columns = columns
        self.video = video

    def __getstate__(self) -> tuple[Any, ...]:
        return self.url, self.storage_options, self.fingerprint, self.columns, self.video

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.url, self.storage_options, self.fingerprint, self.columns, self.video = state

    def key(self) -> tuple[str, str, str, str, str]:
        options = repr(sorted(self.storage_options.items()))
        return self.url, options, self.fingerprint, repr(self.columns), repr(self.video)

    def open(self) -> Source:
        """The source at this place, opened as the driver opened it."""
        config = SourceConfig(self.url, columns=self.columns, video=self.video)
        return open_source(
            config, storage_options=self.storage_options, cache=None, page_bytes=SAMPLE_PAGE_BYTES
        )


def fingerprint(source: Source) -> str:
    """A digest of what the source reads: a packed dataset's shards (names, sizes,
    SHA-256s), a Parquet table's row groups (files, rows, bytes): what the driver planned
    from, for workers to check."""
    digest = hashlib.sha256()
    for dataset in source.datasets:
        if isinstance(dataset, ShardDataset):
            for shard in dataset.shards:
                digest.update(f"{shard.name}\0{shard.size}\0{shard.sha256}\n".encode())
        else:
            for unit in (0, len(dataset) - 1):
                digest.update(f"{source.shard_of(unit)}\0{len(dataset)}\n".encode())
    return digest.hexdigest()


# One opened dataset per worker process and location: a task's ids index into it, so it
# is opened (its index read) once per process rather than once per read group.
_OPENED: dict[tuple[str, str, str, str, str], Source] = {}
_OPENING = threading.Lock()


def worker_source(where: Where) -> Source:
    """This process's opened source at ``where`` (opened on first use, then kept).

    Raises:
        ValueError: Its shards (or row groups) are not those the driver planned from.
    """
    key = where.key()
    with _OPENING:
        found = _OPENED.get(key)
        if found is None:
            opened = where.open()
            if fingerprint(opened) != where.fingerprint:
                raise ValueError(
                    f"{where.url}: the dataset's shards changed after read_dataset() planned "
                    "the epoch; make the dataset again"
                )
            found = _OPENED[key] = opened
        return found


class GroupRead:
    """A read task's work: consecutive read groups, each fetched as the Loader fetches it
    (one ranged GET per block), each handed on as one block."""

    def __init__(
        self, where: Where, groups: list[tuple[int, np.ndarray]], members: tuple[str, ...]
    ) -> None:
        self.where = where
        self.groups = [(epoch, np.asarray(ids, dtype=np.int64)) for epoch, ids in groups]
        self.members = members if where.video is None else ()  # clips carry their bytes

    def __call__(self) -> Iterator[Any]:
        source = worker_source(self.where)
        engine = source.datasets[0].store.engine
        # Every group's GETs go out now: the later groups arrive while Ray decodes the
        # first (a task's read and its decoding run in turn, block by block).
        fetches = [engine.submit(source.read_async(ids.tolist())) for _, ids in self.groups]
        for (epoch, ids), fetch in zip(self.groups, fetches, strict=True):
            yield raw_block(epoch, ids, fetch.result(), self.members)


def raw_block(
    epoch: int, ids: np.ndarray, samples: list[dict[str, Any]], members: Sequence[str]
) -> Any:
    names = list(members)
    for sample in samples:  # an index without field counts: the members found
        found = (member_extension(k) for k, v in sample.items() if isinstance(v, bytes))
        names.extend(name for name in found if name not in names)
    columns: dict[str, Any] = {
        "index": pa.array(ids, type=pa.int64()),
        "epoch": pa.array(np.full(len(ids), epoch), type=pa.int64()),
        "key": pa.array([s["key"] for s in samples], type=pa.string()),
        "label": pa.array([int(s["label"]) for s in samples], type=pa.int64()),
        "error": pa.array(
            [None if s.get("error") is None else str(s["error"]) for s in samples],
            type=pa.string(),
        ),
    }
    for name in names:
        entry = member_entry(name)
        columns[MEMBER_PREFIX + name] = pa.array([s.get(entry) for s in samples], type=pa.binary())
    if any("clip" in s for s in samples):  # a video's clips: packets, bytes and times
        columns.update(_clip_columns(samples))
    return pa.table(columns)


def _clip_columns(samples: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [clip_row(s["clip"]) if "clip" in s else None for s in samples]
    return {
        "clip": pa.array(rows),
        "clip_bytes": pa.array([s.get("clip_bytes") for s in samples], type=pa.binary()),
        "first_frame": pa.array([int(s["first_frame"]) for s in samples], type=pa.int64()),
        "timestamps": pa.array([np.asarray(s["timestamps"]).tolist() for s in samples]),
    }


def decode_block(
    block: Any, *, where: Where, transform: Any, seed: int, decode: DecodeConfig
) -> Any:
    """Decode a block of raw samples as the Loader decodes a batch (Ray's map function):
    each run of one epoch's samples as one batch, with that epoch's augmentations."""
    if block.num_rows == 0:
        return block.select(["index", "epoch", "key", "label"])
    epochs = block.column("epoch").to_numpy()
    cuts = [0, *(np.flatnonzero(np.diff(epochs)) + 1).tolist(), len(epochs)]
    source = worker_source(where)
    assembler = source.make_batcher(
        BatcherSettings(transform=transform, seed=seed, decode=decode, stages=Stages(), threads=1),
    )
    workers = assembler.workers
    skipped: list[tuple[str, str]] = []
    tables = []
    try:
        if workers is not None:
            workers.start_workers(batch_size=block.num_rows, depth=1)
        for begin, end in itertools.pairwise(cuts):
            part = block.slice(begin, end - begin)
            ids, raw = part.column("index").to_numpy(), raw_samples(part)
            epoch = int(epochs[begin])
            batch = assembler.finish(assembler.start(ids, raw, epoch), skipped)
            batch["epoch"] = np.full(len(batch["index"]), epoch, dtype=np.int64)
            tables.append(batch_table(batch))
    finally:
        if workers is not None:
            workers.close()
    for key, reason in skipped:
        logger.warning("%s: sample %r skipped: %s", where.url, key, reason)
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="default")


def raw_samples(block: Any) -> list[dict[str, Any]]:
    """The samples of a raw block as the reader gave them: members, key, label, error."""
    keys = block.column("key").to_pylist()
    labels = block.column("label").to_pylist()
    errors = block.column("error").to_pylist()
    raw: list[dict[str, Any]] = [
        {"key": key, "label": label}
        if error is None
        else {"key": key, "label": label, "error": error}
        for key, label, error in zip(keys, labels, errors, strict=True)
    ]
    if "clip" in block.column_names:
        clips = block.column("clip").to_pylist()
        data = block.column("clip_bytes").to_pylist()
        firsts = block.column("first_frame").to_pylist()
        times = block.column("timestamps").to_pylist()
        for sample, clip, blob, first, seconds in zip(raw, clips, data, firsts, times, strict=True):
            sample.update(first_frame=np.int64(first), timestamps=np.asarray(seconds))
            if clip is not None:
                sample.update(clip=clip_from_row(clip), clip_bytes=blob)
    for name in block.column_names:
        if name.startswith(MEMBER_PREFIX):
            member = member_entry(name[len(MEMBER_PREFIX) :])
            for sample, value in zip(raw, block.column(name).to_pylist(), strict=True):
                if value is not None:
                    sample[member] = value
    return raw


def batch_table(batch: Mapping[str, Any]) -> Any:
    """A Loader batch as an Arrow table of one row per sample, for Ray.

    Arrays of numbers become Ray tensor columns (``image`` one ``(H, W, 3)`` uint8 tensor
    a row), arrays of different shapes variable-shaped tensor columns, text and bytes
    string and binary columns; other values (parsed JSON, None among values) are kept as
    the Python objects they are (Ray's object column), so they come back unchanged.
    """
    return pa.table({name: column(value) for name, value in batch.items()})


def column(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.ndim == 1 and value.dtype.kind in "biuf":
            return pa.array(value)
        if value.dtype.kind in "biufcUS" and value.ndim > 1:
            return ArrowTensorArray.from_numpy(value)
        if value.ndim == 1 and value.dtype.kind in "US":
            return pa.array(value.tolist())
        return ArrowPythonObjectArray.from_objects(list(value))
    items = list(value)
    if all(v is None or isinstance(v, str) for v in items):
        return pa.array(items, type=pa.string())
    if all(v is None or isinstance(v, bytes) for v in items):
        return pa.array(items, type=pa.binary())
    if items and all(isinstance(v, np.ndarray) and v.dtype.kind in "biuf" for v in items):
        ragged = np.empty(len(items), dtype=object)
        ragged[:] = items
        return ArrowTensorArray.from_numpy(ragged)
    return ArrowPythonObjectArray.from_objects(items)
