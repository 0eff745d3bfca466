"""What a Loader reads: one dataset, a mix of datasets, or windows of records.

A *source* (:class:`~stoker.pipeline.source.Source`) gives the loader the order of an
epoch over its *units* (samples, mixed samples or windows), the bytes of a unit (to size
reads and budgets), the units themselves for a list of ids, read concurrently on the I/O
engine, and what its kind of unit needs (the batcher that assembles them, ...). Each unit is a dict
with its fields (``jpg``, ...), ``key`` and ``label``, plus the source's extra arrays; a
sample that fails its checks (CRC-32, malformed members) is a dict with ``key``, ``label``
and its ``error``, which the loader raises or skips like an undecodable image:

- :class:`~stoker.pipeline.dataset_source.DatasetSource`: samples of one packed dataset,
  with rows of side tables (``.npy`` arrays in the bucket, read by ranged GETs; see
  :mod:`stoker.format.sidetable`) attached under their names;
- :class:`MixedSource`: several dataset (or token) sources in set proportions
  (:mod:`stoker.pipeline.mixing`), each unit tagged with its ``source``;
- :class:`~stoker.pipeline.window_source.WindowSource`: windows of consecutive records
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

from stoker.errors import BucketNotFoundError, SourceError
from stoker.format.reader import ShardDataset, open_dataset
from stoker.format.sidetable import SideTable, open_side_table
from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.config import BLOCK_PAGE_BYTES, CacheConfig, SourceConfig
from stoker.pipeline.dataset_source import LOADER_MAX_GAP_BYTES as LOADER_MAX_GAP_BYTES
from stoker.pipeline.dataset_source import DatasetSource as DatasetSource
from stoker.pipeline.mixing import MixConfig, MixedOrder, mixed_epoch_order, source_counts
from stoker.pipeline.order import EpochOrder, OrderConfig
from stoker.pipeline.plan import block_size_for
from stoker.pipeline.source import Source as Source
from stoker.pipeline.source import SourceDataset
from stoker.pipeline.tokens import token_block_size, token_sources
from stoker.pipeline.window_source import WindowSource as WindowSource
from stoker.pipeline.windows import (
    WindowConfig,
)
from stoker.storage.cache import DiskCache
from stoker.storage.cached import cache_reads
from stoker.storage.open import open_store


class MixPart(Source, Protocol):
    """A source a mix can take: its units in shards (blocks never cross them), and the
    batcher of a mix of it and others of its kind."""

    @property
    def shard_sizes(self) -> list[int]:
        """Units in each shard (a Parquet table's row groups)."""
        ...

    def mix_batcher(
        self, mix: Source, parts: Sequence[object], settings: BatcherSettings
    ) -> Batcher:
        """The batcher of ``mix``, a mix of this source and ``parts``."""
        ...


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
        sources: Sequence[MixPart],
        mix: MixConfig,
        block_sizes: Sequence[int],
    ) -> None:
        if mix.sources != len(sources):
            raise ValueError(f"mix is for {mix.sources} sources, but {len(sources)} were given")
        if len({s.row_fields is None for s in sources}) > 1:  # token rows, or samples
            raise ValueError("a mix's sources must have units of one kind (samples or tokens)")
        self.sources: list[MixPart] = list(sources)
        self.mix = mix
        self.block_sizes = list(block_sizes)
        sizes = [s.units() for s in self.sources]
        self._offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self._last: tuple[tuple[OrderConfig, int], MixedOrder] | None = None

    @property
    def url(self) -> str:
        return " + ".join(s.url for s in self.sources)

    @property
    def datasets(self) -> list[SourceDataset]:
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

    @property
    def cut_first_batch(self) -> bool:
        return self.sources[0].cut_first_batch

    @property
    def row_fields(self) -> tuple[str, ...] | None:
        fields = self.sources[0].row_fields
        return None if fields is None else (*fields, "source")

    one_get_per_unit = False

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        return self.sources[0].order_defaults(order, units=units, unit_bytes=unit_bytes)

    def make_batcher(self, settings: BatcherSettings) -> Batcher:
        return self.sources[0].mix_batcher(self, self.sources, settings)

    def shard_of(self, unit: int) -> str | None:
        which, local = self._locate([unit])
        return self.sources[int(which[0])].shard_of(int(local[0]))

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
) -> Source:
    """Open what a Loader reads: datasets (through a disk cache), side tables, a mix.

    Args:
        source: Dataset URL(s) or opened datasets, or a :class:`SourceConfig` (a mix,
            windows, side tables, token sequences: with ``tokens`` every dataset must be a
            token dataset, read as :class:`~stoker.pipeline.tokens.TokenSource`, several
            mixed by ``mix``; without it a token dataset is refused); a prebuilt source
            passes through.
        storage_options: See :func:`stoker.open_store`.
        cache: The disk cache (``cache.dir``) shared by every dataset and side table.
        page_bytes: The disk cache's page when ``cache.page_bytes`` leaves it unset.

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
        except FileNotFoundError:  # no index: Parquet, an image folder, or neither (said so)
            return _in_place(str(location), config, storage_options, cache, page_bytes)
        if config.columns is not None:
            raise ValueError(f"{packed.url}: a packed dataset; columns= are for Parquet")
        location = packed
    inputs: list[str | os.PathLike[str] | ShardDataset] = (
        [location] if isinstance(location, str | os.PathLike | ShardDataset) else list(location)
    )
    opened = [_open_part(item, config, storage_options, cache, node) for item in inputs]
    in_place = {n: part for n, part in enumerate(opened) if not isinstance(part, ShardDataset)}
    datasets = [part for part in opened if isinstance(part, ShardDataset)]
    if config.tokens is not None:
        page_bytes = BLOCK_PAGE_BYTES  # sequences are read in runs of blocks, never alone
    datasets, disk = _through_cache(datasets, cache, page_bytes)
    if config.tokens is not None or any(d.index.tokens is not None for d in datasets):
        return _token_source(datasets, config)
    tables = {
        name: _open_table(url, storage_options, disk)
        for name, url in (config.side_tables or {}).items()
    }
    packed_parts: list[MixPart] = [
        DatasetSource(d, tables if n == 0 else None) for n, d in enumerate(datasets)
    ]
    sources = [in_place.get(n) or packed_parts.pop(0) for n in range(len(opened))]
    if config.mix is not None:
        return MixedSource(sources, config.mix, [_block_size(s) for s in sources])
    if not isinstance(sources[0], DatasetSource):  # only a mix reaches here with one
        raise ValueError(f"{sources[0].url}: windows and side tables need a packed dataset")
    if config.window is not None:
        return _window_source(sources[0], config.window)
    return sources[0]


def _open_part(
    item: str | os.PathLike[str] | ShardDataset,
    config: SourceConfig,
    storage_options: Mapping[str, Any] | None,
    cache: CacheConfig | None,
    node: str | os.PathLike[str] | None,
) -> ShardDataset | MixPart:
    """One location of a mix (or windows, side tables): a packed dataset, or in a mix
    a Parquet table read in place."""
    if isinstance(item, ShardDataset):
        return item
    try:
        return open_dataset(item, storage_options=storage_options, cache_dir=node)
    except FileNotFoundError:
        if config.mix is None or config.tokens is not None:
            raise
    from stoker.pipeline.parquet_source import open_parquet  # only for Parquet parts

    return open_parquet(str(item), storage_options=storage_options, cache_dir=node)


def _block_size(source: MixPart) -> int:
    """A part's units per block: its own default (a Parquet table's row group), else
    about the bytes the Loader aims a block at."""
    order = source.order_defaults(
        OrderConfig(), units=source.units(), unit_bytes=source.unit_bytes()
    )
    return order.block_size or block_size_for(source.unit_bytes())


def _through_cache(
    datasets: list[ShardDataset], cache: CacheConfig | None, page_bytes: int
) -> tuple[list[ShardDataset], DiskCache | None]:
    """``datasets`` read through the disk cache of ``cache.dir``, bounded by their data
    (or ``cache.max_bytes``), and that cache; as they are, and None, without one."""
    if cache is None or cache.dir is None:
        return datasets, None
    data_bytes = sum(s.size for d in datasets for s in d.shards)
    disk = DiskCache.for_data(cache.dir, data_bytes=data_bytes, max_bytes=cache.max_bytes)
    return [_cached(d, disk, cache.page_bytes or page_bytes) for d in datasets], disk


def _token_source(datasets: list[ShardDataset], config: SourceConfig) -> Source:
    """Token datasets as sequences: one, or several mixed by ``config.mix``."""
    extras = config.window is not None or bool(config.side_tables)
    parts = token_sources(datasets, config.tokens, extras=extras)
    if config.mix is None:
        return parts[0]
    return MixedSource(parts, config.mix, [token_block_size(s.unit_bytes()) for s in parts])


def _window_source(source: DatasetSource, window: WindowConfig) -> WindowSource:
    """Windows of consecutive records, refused for a dataset packed in a shuffled order."""
    dataset = source.dataset
    seed = dataset.index.packed_with.get("shuffle_seed")
    if seed is not None:
        raise ValueError(
            f"{dataset.url} was packed in a shuffled order (shuffle_seed={seed}), so "
            "its consecutive records are not consecutive frames: windows need the input's "
            "order; pack it again with `stoker pack --keep-order` "
            "(PackConfig(shuffle_seed=None))"
        )
    return WindowSource(source, window)


def mixed_order(source: Source, config: OrderConfig, epoch: int) -> MixedOrder:
    """The mixed epoch of ``source`` (see :class:`MixedOrder`).

    Raises:
        ValueError: ``source`` is no mix.
    """
    if not isinstance(source, MixedSource):
        raise ValueError("mix_shares() needs a loader over several datasets with mix=")
    return source.mixed_order(config, epoch)


def mix_parts(source: Source) -> list[Source]:
    """The sources ``source`` mixes, or ``[source]`` for one that mixes none."""
    return list(source.sources) if isinstance(source, MixedSource) else [source]


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


def _in_place(
    location: str,
    config: SourceConfig,
    storage_options: Mapping[str, Any] | None,
    cache: CacheConfig | None,
    page_bytes: int,
) -> Source:
    """What is read where it lies, with no index: Parquet (a ``.parquet`` location, or
    ``columns`` given, or a folder of Parquet files and no images) or an image folder."""
    from stoker.format.foreign.locations import LocationReader
    from stoker.format.foreign.parquet_files import PARQUET_SUFFIX, ParquetFiles
    from stoker.pipeline.folder import open_folder  # only for unpacked folders
    from stoker.pipeline.parquet_source import open_parquet

    def parquet() -> Source:
        cache_dir = cache.dir if cache is not None else None
        return open_parquet(
            location, storage_options=storage_options, columns=config.columns, cache_dir=cache_dir
        )

    if location.lower().endswith(PARQUET_SUFFIX) or config.columns is not None:
        return parquet()
    try:
        return open_folder(
            location, storage_options=storage_options, cache=cache, page_bytes=page_bytes
        )
    except FileNotFoundError as no_images:
        try:
            ParquetFiles(location, LocationReader(storage_options)).listed()
        except SourceError:  # no Parquet either: the folder's own message says the way on
            raise no_images from None
    return parquet()
