"""What a Loader reads: one dataset, a mix of datasets, or windows of records.

A *source* gives the loader three things: the order of an epoch over its *units* (samples,
mixed samples or windows), the bytes of a unit (to size reads and budgets), and the units
themselves for a list of ids, read concurrently on the I/O engine. Each unit is a dict
with its fields (``jpg``, ...), ``key`` and ``label``, plus the source's extra arrays; a
sample that fails its checks (CRC-32, malformed members) is a dict with ``key``, ``label``
and its ``error``, which the loader raises or skips like an undecodable image:

- :class:`DatasetSource`: samples of one packed dataset, with rows of side tables
  (``.npy`` arrays in the bucket, read by ranged GETs; see
  :mod:`stoker.format.sidetable`) attached under their names;
- :class:`MixedSource`: several dataset (or token) sources in set proportions
  (:mod:`stoker.pipeline.mixing`), each unit tagged with its ``source``;
- :class:`WindowSource`: windows of consecutive records
  (:mod:`stoker.pipeline.windows`); a unit holds its ``records`` in order, its labels as
  an array, and each side table's rows stacked per record;
- :class:`~stoker.pipeline.tokens.TokenSource`: sequences of a token dataset's stream.

Orders stay pure functions of (seed, epoch, sizes), so partition and resume work the same
for every source.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from stoker.errors import BucketNotFoundError
from stoker.format.reader import ShardDataset, open_dataset
from stoker.format.sidetable import SideTable, open_side_table
from stoker.pipeline.config import CacheConfig, SourceConfig
from stoker.pipeline.mixing import MixConfig, MixedOrder, mixed_epoch_order, source_counts
from stoker.pipeline.order import EpochOrder, OrderConfig, epoch_order
from stoker.pipeline.plan import block_size_for
from stoker.pipeline.tokens import TokenConfig, TokenSource, token_block_size, token_sources
from stoker.pipeline.windows import (
    WindowConfig,
    dirname_sequence_ids,
    window_epoch_order,
    window_records,
    window_starts,
)
from stoker.storage.base import Store
from stoker.storage.cache import DiskCache
from stoker.storage.cached import cache_reads
from stoker.storage.open import open_store

#: The Loader reads only the samples it delivers: a ranged read joins adjacent samples, never
#: a gap. A gap is usually another block, read with its own group; reading it through too
#: made an epoch read 1.4-1.8x its shards' bytes.
LOADER_MAX_GAP_BYTES = 0


class SourceDataset(Protocol):
    """What the Loader and its tools use of a dataset a source reads: a packed
    :class:`~stoker.format.reader.ShardDataset` or an unpacked folder's
    :class:`~stoker.pipeline.folder.FolderDataset`."""

    @property
    def url(self) -> str:
        """Where it is."""
        ...

    @property
    def store(self) -> Store:
        """Its store: counters, I/O engine and disk cache."""
        ...

    @property
    def class_names(self) -> list[str]:
        """Names of the labels, indexed by label."""
        ...

    def __len__(self) -> int: ...

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Samples by number, in the order given."""
        ...


class Source(Protocol):
    """The loader's view of what it reads (see the module docstring)."""

    @property
    def url(self) -> str:
        """Where the data is, for messages."""
        ...

    @property
    def datasets(self) -> Sequence[SourceDataset]:
        """The datasets read (packed, or an unpacked folder)."""
        ...

    @property
    def extra_fields(self) -> tuple[str, ...]:
        """Names of the arrays each unit carries besides its image (stacked per batch)."""
        ...

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        """The order of one epoch over unit ids."""
        ...

    def units(self) -> int:
        """Units in one epoch."""
        ...

    def unit_bytes(self) -> float:
        """Mean bytes read per unit."""
        ...

    def shuffled(self) -> bool:
        """Whether the units were written in random order (consecutive ones are unrelated)."""
        ...

    def nbytes(self, ids: Sequence[int]) -> int:
        """Bytes of these units in their shards."""
        ...

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        """The units, in the order given (ids may repeat)."""
        ...


class DatasetSource:
    """Samples of one packed dataset, with side-table rows attached.

    Args:
        dataset: The dataset.
        side_tables: Arrays with one row per sample, by the name the batch shows them.

    Raises:
        ValueError: A side table does not have one row per sample.
    """

    def __init__(
        self, dataset: ShardDataset, side_tables: Mapping[str, SideTable] | None = None
    ) -> None:
        self.dataset = dataset
        self.side_tables = dict(side_tables or {})
        for name, table in self.side_tables.items():
            if len(table) != len(dataset):
                raise ValueError(
                    f"side table {name!r} ({table.url}) has {len(table)} rows but "
                    f"{dataset.url} has {len(dataset)} samples"
                )

    @property
    def url(self) -> str:
        return self.dataset.url

    @property
    def datasets(self) -> list[ShardDataset]:
        return [self.dataset]

    @property
    def extra_fields(self) -> tuple[str, ...]:
        return tuple(self.side_tables)

    @property
    def shard_sizes(self) -> list[int]:
        """Samples in each shard."""
        return [s.samples for s in self.dataset.shards]

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        return epoch_order(self.shard_sizes, config=config, epoch=epoch)

    def units(self) -> int:
        return len(self.dataset)

    def shuffled(self) -> bool:
        # `stoker pack` records the seed it shuffled with (None: the input's order kept).
        return self.dataset.index.packed_with.get("shuffle_seed") is not None

    def unit_bytes(self) -> float:
        lengths = self.dataset.index.length
        rows = sum(t.row_bytes for t in self.side_tables.values())
        return (float(lengths.mean()) if len(lengths) else 1.0) + rows

    def nbytes(self, ids: Sequence[int]) -> int:
        return int(self.dataset.index.length[np.asarray(ids, dtype=np.int64)].sum())

    def _broken(self, i: int, error: Exception) -> dict[str, Any]:
        """A stand-in for a sample that failed its checks: decoding it raises ``error``."""
        return {
            "key": self.dataset.index.keys[i],
            "label": int(self.dataset.index.label[i]),
            "error": error,
        }

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        unique = list(dict.fromkeys(int(i) for i in ids))
        # A corrupt sample comes back as its error, so the loader can skip just that one.
        reads: list[Any] = [
            self.dataset.read_many_async(
                unique, return_errors=True, max_gap_bytes=LOADER_MAX_GAP_BYTES
            )
        ]
        reads += [table.rows_async(unique) for table in self.side_tables.values()]
        samples, *rows = await asyncio.gather(*reads)
        found = {
            i: sample if isinstance(sample, dict) else self._broken(i, sample)
            for i, sample in zip(unique, samples, strict=True)
        }
        for name, table_rows in zip(self.side_tables, rows, strict=True):
            for n, i in enumerate(unique):
                found[i][name] = table_rows[n]
        return [found[int(i)] for i in ids]


class MixedSource:
    """Several dataset (or token) sources in one epoch, in the proportions of ``mix``.

    Unit ids are mixed ids (see :mod:`stoker.pipeline.mixing`); each unit carries the
    ``source`` it came from. Every source uses the loader's order settings with its own
    block size (its blocks hold about as many bytes as the loader aims for). Token sources
    of one ``seq_len`` have units of equal tokens, so proportions of units are proportions
    of tokens.

    Args:
        sources: The sources, in the order of ``mix``'s weights or counts.
        mix: How much of each source an epoch holds.
        block_sizes: Each source's samples per block.
    """

    def __init__(
        self,
        sources: Sequence[DatasetSource] | Sequence[TokenSource],
        mix: MixConfig,
        block_sizes: Sequence[int],
    ) -> None:
        if mix.sources != len(sources):
            raise ValueError(f"mix is for {mix.sources} sources, but {len(sources)} were given")
        self.sources: list[DatasetSource | TokenSource] = list(sources)
        self.mix = mix
        self.block_sizes = list(block_sizes)
        sizes = [s.units() for s in self.sources]
        self._offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self._last: tuple[tuple[OrderConfig, int], MixedOrder] | None = None

    @property
    def url(self) -> str:
        return " + ".join(s.url for s in self.sources)

    @property
    def datasets(self) -> list[ShardDataset]:
        return [d for s in self.sources for d in s.datasets]

    @property
    def extra_fields(self) -> tuple[str, ...]:
        names = [set(s.extra_fields) for s in self.sources]
        common = set.intersection(*names) if names else set()
        return ("source", *sorted(common))

    def mixed_order(self, config: OrderConfig, epoch: int) -> MixedOrder:
        """The mixed epoch with each source's share (see :class:`MixedOrder`)."""
        if self._last is not None and self._last[0] == (config, epoch):
            return self._last[1]
        orders = [replace(config, block_size=b) for b in self.block_sizes]
        mixed = mixed_epoch_order(
            [s.shard_sizes for s in self.sources], orders=orders, mix=self.mix, epoch=epoch
        )
        self._last = ((config, epoch), mixed)
        return mixed

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        return self.mixed_order(config, epoch).order

    def units(self) -> int:
        return sum(source_counts([s.units() for s in self.sources], self.mix))

    def shuffled(self) -> bool:
        return all(s.shuffled() for s in self.sources)

    def _locate(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        offsets = self._offsets
        values = np.asarray(ids, dtype=np.int64) % max(int(offsets[-1]), 1)
        which = np.searchsorted(offsets[1:], values, side="right").astype(np.int64)
        return which, values - offsets[which]

    def unit_bytes(self) -> float:
        weights = np.asarray([s.units() for s in self.sources], dtype=np.float64)
        sizes = np.asarray([s.unit_bytes() for s in self.sources])
        return float((weights * sizes).sum() / max(weights.sum(), 1.0))

    def nbytes(self, ids: Sequence[int]) -> int:
        which, local = self._locate(ids)
        return sum(
            self.sources[k].nbytes(local[which == k].tolist()) for k in range(len(self.sources))
        )

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        which, local = self._locate(ids)
        parts = await asyncio.gather(
            *(s.read_async(local[which == k].tolist()) for k, s in enumerate(self.sources))
        )
        cursors = [iter(part) for part in parts]
        out = []
        for k in which.tolist():
            unit = dict(next(cursors[k]))  # a repeat must not share its dict with the first
            unit["source"] = k
            out.append(unit)
        return out


class WindowSource:
    """Windows of consecutive records of one dataset source.

    Args:
        source: The dataset source of records.
        window: Window size, shift and stride.
        sequence_ids: One id per record; no window crosses a change of id. Default: from
            ``window.sequences`` (``"dirname"``: the records' key directories), else none.
    """

    def __init__(
        self,
        source: DatasetSource,
        window: WindowConfig,
        sequence_ids: np.ndarray | Sequence[int] | None = None,
    ) -> None:
        self.source = source
        self.window = window
        if sequence_ids is None and window.sequences == "dirname":
            sequence_ids = dirname_sequence_ids(source.dataset.index.keys)
        self.starts = window_starts(source.shard_sizes, window, sequence_ids)
        if not len(self.starts):
            raise ValueError(
                f"{source.url}: no window of {window.size} records fits in any shard"
                + ("" if sequence_ids is None else " or sequence")
            )

    @property
    def url(self) -> str:
        return self.source.url

    @property
    def datasets(self) -> list[ShardDataset]:
        return self.source.datasets

    @property
    def extra_fields(self) -> tuple[str, ...]:
        return ("records", *self.source.extra_fields)

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        return window_epoch_order(self.source.shard_sizes, self.starts, order=config, epoch=epoch)

    def units(self) -> int:
        return len(self.starts)

    def shuffled(self) -> bool:
        return False  # windows are runs of consecutive frames, read over an unshuffled pack

    def unit_bytes(self) -> float:
        return self.source.unit_bytes() * self.window.size

    def records(self, ids: Sequence[int]) -> np.ndarray:
        """Record ids of windows, one row per window."""
        return window_records(np.asarray(ids, dtype=np.int64), self.starts, self.window)

    def nbytes(self, ids: Sequence[int]) -> int:
        return self.source.nbytes(np.unique(self.records(ids)).tolist())

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        rows = self.records(ids)
        unique = np.unique(rows).tolist()
        found = dict(zip(unique, await self.source.read_async(unique), strict=True))
        units = []
        for row in rows.tolist():
            members = [found[r] for r in row]
            unit: dict[str, Any] = {
                "records": np.asarray(row, dtype=np.int64),
                "key": members[0]["key"],
                "label": np.asarray([m["label"] for m in members], dtype=np.int64),
                "members": members,
            }
            for name in self.source.extra_fields:
                unit[name] = np.stack([m[name] for m in members])
            units.append(unit)
        return units


#: What a Loader accepts as its source.
SourceLike = (
    str | os.PathLike[str] | ShardDataset | Sequence[str | os.PathLike[str]] | SourceConfig | Source
)


def open_source(
    source: SourceLike,
    *,
    storage_options: Mapping[str, Any] | None,
    cache: CacheConfig | None,
    page_bytes: int,
    tokens: TokenConfig | None = None,
) -> Source:
    """Open what a Loader reads: datasets (through a disk cache), side tables, a mix.

    Args:
        source: Dataset URL(s) or opened datasets, or a :class:`SourceConfig` (a mix,
            windows, side tables); a prebuilt source passes through.
        storage_options: See :func:`stoker.open_store`.
        cache: The disk cache (``cache.dir``) shared by every dataset and side table.
        page_bytes: The disk cache's page when ``cache.page_bytes`` leaves it unset.
        tokens: How to cut token datasets into sequences: given, every dataset must be a
            token dataset, read as :class:`~stoker.pipeline.tokens.TokenSource` (several
            mixed by ``mix``); without it, a token dataset is refused.

    A single location without a packed dataset's ``index.json`` that holds class folders
    of images (bucket prefix or local directory) is streamed unpacked
    (:mod:`stoker.pipeline.folder`).

    Raises:
        ValueError: A prebuilt source with a disk cache (it carries its own); a token
            dataset without ``tokens`` or the other way round.
        FileNotFoundError: A location with neither an index nor images (the message says
            both ways on: pack it, or point at a folder of class folders).
    """
    if not isinstance(source, SourceConfig | str | os.PathLike | ShardDataset | Sequence):
        if cache is not None and cache.dir is not None:
            raise ValueError("a prebuilt source carries its own disk cache")
        return source
    config = source if isinstance(source, SourceConfig) else SourceConfig(source)
    location = config.location
    plain = config.mix is None and config.window is None and not config.side_tables
    node = cache.dir if cache is not None else None  # the index is fetched once per node
    if plain and isinstance(location, str | os.PathLike):
        try:
            packed = open_dataset(location, storage_options=storage_options, cache_dir=node)
        except BucketNotFoundError:
            raise
        except FileNotFoundError:  # no index: an image folder, or neither (said so)
            from stoker.pipeline.folder import open_folder  # only for unpacked folders

            return open_folder(
                str(location), storage_options=storage_options, cache=cache, page_bytes=page_bytes
            )
        location = packed
    inputs: list[str | os.PathLike[str] | ShardDataset] = (
        [location] if isinstance(location, str | os.PathLike | ShardDataset) else list(location)
    )
    datasets = [
        item
        if isinstance(item, ShardDataset)
        else open_dataset(item, storage_options=storage_options, cache_dir=node)
        for item in inputs
    ]
    disk: DiskCache | None = None
    if cache is not None and cache.dir is not None:
        data_bytes = sum(s.size for d in datasets for s in d.shards)
        disk = DiskCache.for_data(cache.dir, data_bytes=data_bytes, max_bytes=cache.max_bytes)
        datasets = [_cached(d, disk, cache.page_bytes or page_bytes) for d in datasets]
    if tokens is not None or any(d.index.tokens is not None for d in datasets):
        extras = config.window is not None or bool(config.side_tables)
        parts = token_sources(datasets, tokens, extras=extras)
        if config.mix is None:
            return parts[0]
        return MixedSource(parts, config.mix, [token_block_size(s.unit_bytes()) for s in parts])
    tables = {
        name: _open_table(url, storage_options, disk)
        for name, url in (config.side_tables or {}).items()
    }
    sources = [DatasetSource(d, tables if n == 0 else None) for n, d in enumerate(datasets)]
    if config.mix is not None:
        return MixedSource(sources, config.mix, [block_size_for(s.unit_bytes()) for s in sources])
    if config.window is not None:
        seed = datasets[0].index.packed_with.get("shuffle_seed")
        if seed is not None:
            raise ValueError(
                f"{datasets[0].url} was packed in a shuffled order (shuffle_seed={seed}), so "
                "its consecutive records are not consecutive frames: windows need the input's "
                "order; pack it again with `stoker pack --keep-order` "
                "(PackConfig(shuffle_seed=None))"
            )
        return WindowSource(sources[0], config.window)
    return sources[0]


def _cached(dataset: ShardDataset, disk: DiskCache, page_bytes: int) -> ShardDataset:
    cached = cache_reads(
        dataset.store,
        disk,
        page_bytes=page_bytes,
        objects={s.name: (f"sha256:{s.sha256}", s.size) for s in dataset.shards},
    )
    return ShardDataset(cached, dataset.index)


def _open_table(
    url: str, storage_options: Mapping[str, Any] | None, disk: DiskCache | None
) -> SideTable:
    parent, _, key = str(url).rstrip("/").rpartition("/")
    store = open_store(parent or ".", storage_options=storage_options)
    if disk is not None:
        store = cache_reads(store, disk)
    return open_side_table(store, key)
