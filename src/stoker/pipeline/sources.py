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
- :class:`~stoker.pipeline.mixed_source.MixedSource`: several sources (packed, Parquet
  or token) in set proportions (:mod:`stoker.pipeline.mixing`), each unit tagged with its
  ``source``;
- :class:`~stoker.pipeline.window_source.WindowSource`: windows of consecutive records
  (:mod:`stoker.pipeline.windows`); a unit holds its ``records`` in order, its labels as
  an array, and each side table's rows stacked per record;
- :class:`~stoker.pipeline.tokens.TokenSource`: sequences of a token dataset's stream.

Orders stay pure functions of (seed, epoch, sizes), so partition and resume work the same
for every source.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stoker.errors import BucketNotFoundError, SourceError
from stoker.format.foreign.walk import GLOB_CHARACTERS
from stoker.format.reader import ShardDataset, open_dataset
from stoker.format.sidetable import SideTable, open_side_table
from stoker.pipeline.config import BLOCK_PAGE_BYTES, CacheConfig, SourceConfig
from stoker.pipeline.dataset_source import LOADER_MAX_GAP_BYTES as LOADER_MAX_GAP_BYTES
from stoker.pipeline.dataset_source import DatasetSource as DatasetSource
from stoker.pipeline.mixed_source import MixedSource as MixedSource
from stoker.pipeline.mixed_source import MixPart
from stoker.pipeline.mixed_source import mix_parts as mix_parts
from stoker.pipeline.mixed_source import mixed_order as mixed_order
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.plan import block_size_for
from stoker.pipeline.source import Source as Source
from stoker.pipeline.tokens import token_block_size, token_sources
from stoker.pipeline.video_source import VideoSource as VideoSource
from stoker.pipeline.window_source import WindowSource as WindowSource
from stoker.pipeline.windows import (
    WindowConfig,
)
from stoker.storage.cache import DiskCache
from stoker.storage.cached import cache_reads
from stoker.storage.open import open_store

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
    plain = (
        config.mix is None and config.window is None and not config.side_tables
    ) and config.video is None
    node = cache.dir if cache is not None else None  # the index is fetched once per node
    if plain and isinstance(location, str | os.PathLike):
        # Files a pattern matches, or one local file (a .parquet): no index to look for.
        if GLOB_CHARACTERS & set(str(location)) or _local_file(location):
            return _in_place(str(location), config, storage_options, cache, page_bytes)
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
    if config.mix is not None:
        packed_parts: list[MixPart] = [_part(DatasetSource(d), config) for d in datasets]
        if in_place and config.video is not None:
            raise ValueError("a mix of video clips takes packed datasets of videos alone")
        sources = [in_place.get(n) or packed_parts.pop(0) for n in range(len(opened))]
        return MixedSource(sources, config.mix, [_block_size(s) for s in sources])
    first = DatasetSource(datasets[0], tables)  # no mix: one packed dataset (_open_part)
    if config.video is not None:
        return VideoSource(first, config.video)
    if config.window is not None:
        return _window_source(first, config.window)
    return first


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


def _part(source: DatasetSource, config: SourceConfig) -> MixPart:
    """A packed dataset as a part of a mix: its samples, or clips of its videos."""
    return source if config.video is None else VideoSource(source, config.video)


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


def _local_file(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a file on this machine (no dataset folder)."""
    text = str(location).removeprefix("file://")
    return "://" not in text and Path(text).is_file()


def _in_place(
    location: str,
    config: SourceConfig,
    storage_options: Mapping[str, Any] | None,
    cache: CacheConfig | None,
    page_bytes: int,
) -> Source:
    """What is read where it lies, with no index: Parquet (a ``.parquet`` location, a
    pattern such as ``train-*.parquet``, ``columns`` given, or a folder of Parquet files
    and no images) or an image folder."""
    from stoker.format.foreign.locations import LocationReader
    from stoker.format.foreign.parquet_files import PARQUET_SUFFIX, ParquetFiles
    from stoker.pipeline.folder import open_folder  # only for unpacked folders
    from stoker.pipeline.parquet_source import open_parquet

    def parquet() -> Source:
        cache_dir = cache.dir if cache is not None else None
        return open_parquet(
            location, storage_options=storage_options, columns=config.columns, cache_dir=cache_dir
        )

    pattern = GLOB_CHARACTERS & set(location)  # a pattern names files: Parquet's
    if location.lower().endswith(PARQUET_SUFFIX) or config.columns is not None or pattern:
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
