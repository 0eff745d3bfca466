"""Random access into a packed dataset: one ranged GET per sample, coalesced for many."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np

from stoker.core.crc import crc32
from stoker.errors import CorruptShardError, ShardFormatError
from stoker.format.index import DatasetIndex, ShardEntry, read_index
from stoker.format.runs import Run, plan_runs
from stoker.format.shard_sizes import ShardSizes
from stoker.format.tar import parse_members
from stoker.format.verify import VerifyReport, verify_shards
from stoker.storage.base import Store
from stoker.storage.cached import index_cache
from stoker.storage.open import open_store

#: Samples closer than this in one shard are fetched by one request (the gap is read too).
DEFAULT_MAX_GAP_BYTES = 1 << 20
#: Cap on one coalesced request.
DEFAULT_MAX_RUN_BYTES = 64 << 20


#: Entries of a sample dict that the reader fills itself (not members).
SAMPLE_ENTRIES = ("key", "label")
#: The member a sample's label is read from: ``stoker pack`` writes each labelled sample's
#: label as its ``.cls`` member and ``stoker index`` reads the index's labels from them.
LABEL_MEMBER = "cls"


def member_entry(extension: str) -> str:
    """The entry of a sample dict holding the member with this extension: the extension,
    or ``<ext>_member`` for one the reader fills itself (a ``.key`` member is
    ``"key_member"``: ``"key"`` is the sample's key)."""
    return f"{extension}_member" if extension in SAMPLE_ENTRIES else extension


def member_extension(entry: str) -> str:
    """The member extension a sample dict's entry holds (the inverse of :func:`member_entry`)."""
    stem = entry.removesuffix("_member")
    return stem if stem != entry and stem in SAMPLE_ENTRIES else entry


class ShardDataset:
    """A packed dataset opened for random access.

    Use :func:`open_dataset` to make one. Samples come back as dicts: ``"key"``,
    ``"label"`` (int, -1 for none) and one ``bytes`` entry per field extension
    (``"jpg"``, ``"cls"``, ...; a member named ``key`` or ``label`` comes under
    ``"key_member"`` or ``"label_member"``, see :func:`member_entry`). Every sample read is
    checked against its CRC-32 in the index, so corrupted bytes raise
    :class:`~stoker.errors.CorruptShardError` naming the shard and sample instead of
    reaching the caller. The first read of each shard also checks the shard's size against
    the index, so a truncated or replaced shard, or an index copied from another dataset,
    is refused as a whole: the size comes with the read (a ranged GET's answer gives the
    whole object's size; a disk cache checks each page it fetches so,
    :func:`~stoker.storage.sized.get_parts_sized`), or, from a store that cannot give it,
    from one HEAD. A read served whole from a disk cache is not checked again: its pages
    are versioned by the shard's SHA-256 and were checked when fetched. :meth:`verify`
    checks whole shards against their SHA-256.

    Args:
        store: Store rooted at the dataset.
        index: Its index.
    """

    def __init__(self, store: Store, index: DatasetIndex) -> None:
        self._store = store
        self._index = index
        self._sizes = ShardSizes(store, index)

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
        """Class names, indexed by label: ``class_names[batch["label"][i]]``.

        ``stoker pack`` numbers an image folder's class folders in sorted order (label 0 is
        the first folder) and records their names; ``pack --class-name`` or ``stoker
        index`` name others. Empty when the dataset has no names; -1 labels a sample with no
        class.
        """
        return self._index.class_names

    @property
    def shards(self) -> list[ShardEntry]:
        """Shards with their sample counts, sizes and checksums."""
        return self._index.shards

    @property
    def labels(self) -> np.ndarray:
        """Label of every sample (int64, -1 for none)."""
        return self._index.label

    def member_counts(self) -> dict[str, int] | None:
        """Member extensions with the samples holding each, as the index counts them;
        None for an index that does not count them."""
        return dict(self._index.fields) or None

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"ShardDataset({self.url!r}, samples={len(self)}, shards={len(self.shards)})"

    def _check_index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        return i % n if n else i

    async def read_parts_async(
        self, number: int, *, start: int, end: int, parts: Sequence[tuple[int, int]]
    ) -> list[memoryview]:
        """``parts`` of ``[start, end)`` of shard ``number`` (one ranged read, see
        :meth:`~stoker.storage.base.Store.get_parts_async`), the shard's size checked
        against the index on its first read: from the read's answer where the store gives
        it, else by :meth:`check_size_async` (one HEAD). A read of a shard not yet checked
        that ends past the object (``ValueError``) is explained by a HEAD: a shard shorter
        than the index says raises that.

        Raises:
            CorruptShardError: The shard's size differs from the index's.
        """
        return await self._sizes.read_parts_async(number, start=start, end=end, parts=parts)

    async def check_size_async(self, number: int) -> None:
        """Check shard ``number``'s size against the index once, by one HEAD (shared by the
        reads that start before it answers); a no-op once a read found it right.

        Raises:
            CorruptShardError: Its size differs from the index's.
        """
        await self._sizes.check_async(number)

    def _decode(self, i: int, span: memoryview | bytes) -> dict[str, Any]:
        if self._index.tokens is not None:
            raise ShardFormatError(
                f"{self.url} is a token dataset: its samples are documents of a token "
                "stream; read sequences with stoker.TokenLoader"
            )
        key = self._index.keys[i]
        shard = self._index.shards[int(self._index.shard[i])].name
        if crc32(span) != int(self._index.crc32[i]):
            raise CorruptShardError(
                f"{self.url}/{shard}: sample {key!r} (#{i}) fails its CRC-32 check"
            )
        where = f"{self.url}/{shard}:{key}"
        sample: dict[str, Any] = dict(parse_members(span, where=where, verified=True))
        for name in SAMPLE_ENTRIES:  # a member of that name is kept under another
            if name in sample:
                sample[member_entry(name)] = sample.pop(name)
        sample["key"] = key
        sample["label"] = int(self._index.label[i])
        return sample

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = self._check_index(i)
        start = int(self._index.offset[i])
        number = int(self._index.shard[i])
        end = start + int(self._index.length[i])
        read = self.read_parts_async(number, start=start, end=end, parts=[(start, end)])
        return self._decode(i, self._store.engine.run(read)[0])

    @overload
    def read_many(
        self,
        indices: Sequence[int],
        *,
        max_gap_bytes: int = ...,
        max_run_bytes: int = ...,
        return_errors: Literal[False] = ...,
    ) -> list[dict[str, Any]]: ...

    @overload
    def read_many(
        self,
        indices: Sequence[int],
        *,
        max_gap_bytes: int = ...,
        max_run_bytes: int = ...,
        return_errors: Literal[True],
    ) -> list[dict[str, Any] | ShardFormatError]: ...

    def read_many(
        self,
        indices: Sequence[int],
        *,
        max_gap_bytes: int = DEFAULT_MAX_GAP_BYTES,
        max_run_bytes: int = DEFAULT_MAX_RUN_BYTES,
        return_errors: bool = False,
    ) -> list[dict[str, Any]] | list[dict[str, Any] | ShardFormatError]:
        """Read many samples, in the order given, with coalesced concurrent ranged GETs.

        Samples of one shard that lie within ``max_gap_bytes`` of each other share one
        request of at most ``max_run_bytes``; all requests are in flight at once, bounded by
        the store's I/O engine.

        Args:
            indices: Sample numbers.
            max_gap_bytes: Largest gap read through to join two samples into one request.
            max_run_bytes: Largest single request.
            return_errors: Return a corrupt sample's error in its place instead of raising
                it (as ``asyncio.gather(return_exceptions=True)`` does), so that a caller
                can skip it and keep the rest: a :class:`~stoker.errors.CorruptShardError`
                for a CRC-32 mismatch or a shard whose size is not the index's, a
                :class:`~stoker.errors.ShardFormatError` for a malformed member. Storage
                errors (a missing shard, a failed request) are raised either way.

        Raises:
            CorruptShardError: A sample fails its CRC-32, or its shard's size is not the
                index's (unless ``return_errors``).
            ShardFormatError: A sample's members are malformed (unless ``return_errors``).
        """
        engine = self._store.engine
        return engine.run(
            self._read_many(indices, max_gap_bytes, max_run_bytes, return_errors=return_errors)
        )

    @overload
    async def read_many_async(
        self,
        indices: Sequence[int],
        *,
        max_gap_bytes: int = ...,
        max_run_bytes: int = ...,
        return_errors: Literal[False] = ...,
    ) -> list[dict[str, Any]]: ...

    @overload
    async def read_many_async(
        self,
        indices: Sequence[int],
        *,
        max_gap_bytes: int = ...,
        max_run_bytes: int = ...,
        return_errors: Literal[True],
    ) -> list[dict[str, Any] | ShardFormatError]: ...

    async def read_many_async(
        self,
        indices: Sequence[int],
        *,
        max_gap_bytes: int = DEFAULT_MAX_GAP_BYTES,
        max_run_bytes: int = DEFAULT_MAX_RUN_BYTES,
        return_errors: bool = False,
    ) -> list[dict[str, Any]] | list[dict[str, Any] | ShardFormatError]:
        """Async form of :meth:`read_many`; run it on the store's I/O engine."""
        return await self._read_many(
            indices, max_gap_bytes, max_run_bytes, return_errors=return_errors
        )

    async def _read_many(
        self,
        indices: Sequence[int],
        max_gap_bytes: int,
        max_run_bytes: int,
        *,
        return_errors: bool,
    ) -> list[dict[str, Any] | ShardFormatError]:
        wanted = [self._check_index(i) for i in indices]
        runs = plan_runs(
            self._index,
            sorted(set(wanted)),
            max_gap_bytes=max_gap_bytes,
            max_run_bytes=max_run_bytes,
        )

        async def fetch(run: Run) -> dict[int, dict[str, Any] | ShardFormatError]:
            name = self._index.shards[run.shard].name
            # One request for the run; through a disk cache, only the samples' bytes are
            # read (the gaps between them may be another loader worker's samples).
            parts = [self._span(i) for i in run.samples]
            spans = await self.read_parts_async(
                run.shard, start=run.start, end=run.end, parts=parts
            )
            # A part of a cached page is checked by the sample's CRC-32 alone: one that
            # fails it is read again as whole pages, whose CRC-32 the cache checks (a
            # damaged page is removed and fetched again); failing again, it is corrupt.
            cached = self._store.cache is not None
            out, again = self._decode_all(run.samples, spans, return_errors, retry=cached)
            if again:
                data = await self._store.get_range_async(name, start=run.start, end=run.end)
                spans = [data[s - run.start : e - run.start] for s, e in map(self._span, again)]
                out.update(self._decode_all(again, spans, return_errors, retry=False)[0])
            return out

        # A wrong size explains a failed read of its shard, so it wins.
        reads = await asyncio.gather(*(fetch(run) for run in runs), return_exceptions=True)
        found: dict[int, dict[str, Any] | ShardFormatError] = {}
        for run, read in zip(runs, reads, strict=True):
            wrong_size = self._sizes.error(run.shard)
            if wrong_size is not None:
                error: BaseException = wrong_size
            elif isinstance(read, BaseException):
                error = read
            else:
                found.update(read)
                continue
            if not return_errors or not isinstance(error, ShardFormatError):
                raise error
            found.update((i, error) for i in run.samples)
        return [found[i] for i in wanted]

    def _span(self, i: int) -> tuple[int, int]:
        start = int(self._index.offset[i])
        return start, start + int(self._index.length[i])

    def _decode_all(
        self, samples: list[int], spans: list[memoryview], return_errors: bool, *, retry: bool
    ) -> tuple[dict[int, dict[str, Any] | ShardFormatError], list[int]]:
        """Decoded samples (or their errors, with ``return_errors``), and with ``retry``
        those that failed their CRC-32, left to read again."""
        out: dict[int, dict[str, Any] | ShardFormatError] = {}
        again: list[int] = []
        for i, span in zip(samples, spans, strict=True):
            try:
                out[i] = self._decode(i, span)
            except ShardFormatError as exc:
                if retry and isinstance(exc, CorruptShardError):
                    again.append(i)
                elif not return_errors:
                    raise
                else:
                    out[i] = exc
        return out, again

    def verify(self, *, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Read every shard whole and check its size and SHA-256, every sample's CRC-32,
        that every sample's tar members parse (so a dataset that verifies can be read), and
        that no ``index.json`` entry (``class_names`` among them) was edited after writing.

        Never raises for corruption: every problem, with its shard and sample, is listed
        in the report (:func:`~stoker.format.verify.verify_shards`).

        Args:
            progress: Called with the bytes of each shard once it is checked.
        """
        return verify_shards(self._store, self._index, url=self.url, progress=progress)


def open_dataset(
    url: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ShardDataset:
    """Open a packed dataset: reads ``index.json`` and ``index.bin`` (two GETs, no LIST).

    Args:
        url: The dataset's root, as given to ``stoker pack``.
        storage_options: See :func:`stoker.open_store`.
        cache_dir: A node's disk cache (:class:`~stoker.storage.cache.DiskCache`), to
            fetch the index once per node (see :func:`~stoker.format.index.read_index`);
            the dataset's own reads do not go through it.

    Raises:
        FileNotFoundError: No index at ``url``.
        ShardFormatError: The index is malformed or from a newer format version.
    """
    store = open_store(url, storage_options=storage_options)
    cache = index_cache(cache_dir)
    try:
        return ShardDataset(store, read_index(store, cache=cache))
    finally:
        if cache is not None:
            cache.close()
