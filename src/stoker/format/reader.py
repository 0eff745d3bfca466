"""Random access into a packed dataset: one ranged GET per sample, coalesced for many."""

from __future__ import annotations

import asyncio
import hashlib
import os
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.errors import CorruptShardError
from stoker.format.index import DatasetIndex, ShardEntry, read_index
from stoker.format.tar import parse_members
from stoker.storage.base import Store
from stoker.storage.open import engine_for, open_store

#: Samples closer than this in one shard are fetched by one request (the gap is read too).
DEFAULT_MAX_GAP_BYTES = 1 << 20
#: Cap on one coalesced request.
DEFAULT_MAX_RUN_BYTES = 64 << 20


@dataclass(slots=True)
class VerifyReport:
    """What :meth:`ShardDataset.verify` checked and found.

    Attributes:
        shards: Shards checked.
        samples: Samples checked.
        bytes: Bytes read.
        corrupt: ``(shard, sample key or "", what is wrong)`` for every problem found.
    """

    shards: int = 0
    samples: int = 0
    bytes: int = 0
    corrupt: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No problem found."""
        return not self.corrupt


class ShardDataset:
    """A packed dataset opened for random access.

    Use :func:`open_dataset` to make one. Samples come back as dicts: ``"key"``,
    ``"label"`` (int, -1 for none) and one ``bytes`` entry per field extension
    (``"jpg"``, ``"cls"``, ...). Every sample read is checked against its CRC-32 in the
    index, so corrupted bytes raise :class:`~stoker.errors.CorruptShardError` naming the
    shard and sample instead of reaching the caller.

    Args:
        store: Store rooted at the dataset.
        index: Its index.
    """

    def __init__(self, store: Store, index: DatasetIndex) -> None:
        self._store = store
        self._index = index

    @property
    def url(self) -> str:
        """The dataset's URL."""
        return self._store.url

    @property
    def store(self) -> Store:
        """The store the dataset is read from."""
        return self._store

    @property
    def index(self) -> DatasetIndex:
        """The full index (arrays of shard ids, offsets, lengths, labels, keys)."""
        return self._index

    @property
    def class_names(self) -> list[str]:
        """Class names, indexed by label."""
        return self._index.class_names

    @property
    def shards(self) -> list[ShardEntry]:
        """Shards with their sample counts, sizes and checksums."""
        return self._index.shards

    @property
    def labels(self) -> np.ndarray:
        """Label of every sample (int64, -1 for none)."""
        return self._index.label

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"ShardDataset({self.url!r}, samples={len(self)}, shards={len(self.shards)})"

    def _check_index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        return i % n if n else i

    def _decode(self, i: int, span: memoryview | bytes) -> dict[str, Any]:
        key = self._index.keys[i]
        shard = self._index.shards[int(self._index.shard[i])].name
        if zlib.crc32(span) != int(self._index.crc32[i]):
            raise CorruptShardError(
                f"{self.url}/{shard}: sample {key!r} (#{i}) fails its CRC-32 check"
            )
        sample: dict[str, Any] = dict(parse_members(span, where=f"{self.url}/{shard}:{key}"))
        sample["key"] = key
        sample["label"] = int(self._index.label[i])
        return sample

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = self._check_index(i)
        start = int(self._index.offset[i])
        shard = self._index.shards[int(self._index.shard[i])].name
        span = self._store.get_range(shard, start=start, end=start + int(self._index.length[i]))
        return self._decode(i, span)

    def read_many(
        self,
        indices: Sequence[int],
        *,
        max_gap_bytes: int = DEFAULT_MAX_GAP_BYTES,
        max_run_bytes: int = DEFAULT_MAX_RUN_BYTES,
    ) -> list[dict[str, Any]]:
        """Read many samples, in the order given, with coalesced concurrent ranged GETs.

        Samples of one shard that lie within ``max_gap_bytes`` of each other share one
        request of at most ``max_run_bytes``; all requests are in flight at once, bounded by
        the store's I/O engine.
        """
        engine = engine_for(self._store)
        return engine.run(
            self.read_many_async(indices, max_gap_bytes=max_gap_bytes, max_run_bytes=max_run_bytes)
        )

    async def read_many_async(
        self,
        indices: Sequence[int],
        *,
        max_gap_bytes: int = DEFAULT_MAX_GAP_BYTES,
        max_run_bytes: int = DEFAULT_MAX_RUN_BYTES,
    ) -> list[dict[str, Any]]:
        """Async form of :meth:`read_many`; run it on the store's I/O engine."""
        wanted = [self._check_index(i) for i in indices]
        runs = plan_runs(
            self._index,
            sorted(set(wanted)),
            max_gap_bytes=max_gap_bytes,
            max_run_bytes=max_run_bytes,
        )

        async def fetch(run: Run) -> dict[int, dict[str, Any]]:
            name = self._index.shards[run.shard].name
            data = await self._store.get_range_async(name, start=run.start, end=run.end)
            out = {}
            for i in run.samples:
                start = int(self._index.offset[i]) - run.start
                out[i] = self._decode(i, data[start : start + int(self._index.length[i])])
            return out

        found: dict[int, dict[str, Any]] = {}
        for part in await asyncio.gather(*(fetch(run) for run in runs)):
            found.update(part)
        return [found[i] for i in wanted]

    def verify(self, *, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Read every shard whole and check its SHA-256, and every sample's CRC-32.

        Never raises for corruption: every problem, with its shard and sample, is listed
        in the report.

        Args:
            progress: Called with the bytes of each shard once it is checked.
        """
        engine = engine_for(self._store)
        report = VerifyReport()
        first_sample = np.concatenate([[0], np.cumsum([s.samples for s in self.shards])])

        async def check(number: int, entry: ShardEntry) -> None:
            try:
                data = await self._store.get_async(entry.name)
            except FileNotFoundError:
                report.corrupt.append((entry.name, "", "shard is missing"))
                return
            report.shards += 1
            report.bytes += len(data)
            if len(data) != entry.size:
                report.corrupt.append(
                    (entry.name, "", f"size {len(data)} != {entry.size} in the index")
                )
            digest_ok = hashlib.sha256(data).hexdigest() == entry.sha256
            for i in range(int(first_sample[number]), int(first_sample[number + 1])):
                report.samples += 1
                start = int(self._index.offset[i])
                span = data[start : start + int(self._index.length[i])]
                if zlib.crc32(span) != int(self._index.crc32[i]):
                    report.corrupt.append(
                        (entry.name, self._index.keys[i], "sample bytes fail their CRC-32")
                    )
            if not digest_ok and not any(c[0] == entry.name for c in report.corrupt):
                report.corrupt.append((entry.name, "", "SHA-256 mismatch outside any sample"))
            if progress is not None:
                progress(len(data))

        async def check_all() -> None:
            limit = asyncio.Semaphore(max(2, min(8, os.cpu_count() or 2)))

            async def bounded(number: int, entry: ShardEntry) -> None:
                async with limit:
                    await check(number, entry)

            await asyncio.gather(*(bounded(n, e) for n, e in enumerate(self.shards)))

        engine.run(check_all())
        report.corrupt.sort()
        return report


@dataclass(slots=True)
class Run:
    """One coalesced request: a byte range of one shard and the samples inside it."""

    shard: int
    start: int
    end: int
    samples: list[int]


def plan_runs(
    index: DatasetIndex, indices: Sequence[int], *, max_gap_bytes: int, max_run_bytes: int
) -> list[Run]:
    """Group samples into as few ranged requests as the gap and size limits allow."""
    order = sorted(indices, key=lambda i: (int(index.shard[i]), int(index.offset[i])))
    runs: list[Run] = []
    for i in order:
        shard, start = int(index.shard[i]), int(index.offset[i])
        end = start + int(index.length[i])
        if runs:
            last = runs[-1]
            if (
                last.shard == shard
                and start - last.end <= max_gap_bytes
                and end - last.start <= max_run_bytes
            ):
                last.end = max(last.end, end)
                last.samples.append(i)
                continue
        runs.append(Run(shard, start, end, [i]))
    return runs


def open_dataset(
    url: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> ShardDataset:
    """Open a packed dataset: reads ``index.json`` and ``index.bin`` (two GETs, no LIST).

    Args:
        url: The dataset's root, as given to ``stoker pack``.
        storage_options: See :func:`stoker.open_store`.

    Raises:
        FileNotFoundError: No index at ``url``.
        ShardFormatError: The index is malformed or from a newer format version.
    """
    store = open_store(url, storage_options=storage_options)
    return ShardDataset(store, read_index(store))
