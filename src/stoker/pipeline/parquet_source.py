"""Parquet read in place: a table's rows as a Loader's units, with no pack step.

Point the Loader at a ``.parquet`` file or a folder (or bucket prefix) of them, a Hugging
Face dataset's ``data/`` for one:

- each file is listed once and opened once per process, its footer read once
  (:class:`~stoker.format.foreign.parquet_files.ParquetFiles`); a bucket's file is read
  by ranged GETs of exactly the column chunks a row group needs, and with
  ``SourceConfig(url, columns=[...])`` the other columns' chunks are never fetched;
- rows are units and row groups are the blocks of the order: an epoch shuffles the row
  groups (the order is a pure function of the files' row groups, the seed and the epoch,
  so ranks and workers partition it with equal batches, and resume is exact, also onto
  another world size) and a mixing window shuffles rows across the row groups it holds,
  as for a pack written in its input's order. A block is a whole row group, so each row
  group is fetched and decoded by one rank, once an epoch;
- columns become sample fields by the rules a pack of the same file applies
  (:class:`~stoker.format.foreign.parquet.ParquetReader`): the Hugging Face image struct
  and image bytes are the sample's ``jpg``/``png`` (decoded and transformed as packed
  images are), text is ``txt``, an integer ``label`` column the label, lists of
  numbers ``.npy`` arrays; keys are the keys a pack gives (``data/train-00000-of-00002_
  00000041``), so nothing keyed by sample changes when the table is packed;
- a row that cannot become a sample is an error naming the file, row group, row and
  column, which ``DecodeConfig(on_error="skip")`` skips and counts like any bad sample.

Packing is still the way to many small ranged reads of shuffled samples; reading in
place saves the copy.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from stoker.errors import SourceError
from stoker.format.foreign.locations import is_remote
from stoker.format.foreign.parquet import ParquetReader
from stoker.format.reader import member_entry
from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.batching import BatchAssembler
from stoker.pipeline.order import EpochOrder, OrderConfig, epoch_order
from stoker.pipeline.plan import group_blocks_for
from stoker.pipeline.source import Source
from stoker.storage.base import Store
from stoker.storage.cache import DiskCache


class ParquetDataset:
    """A Parquet table's rows, opened for reading by row group.

    Offers what a Loader and its tools use of a packed dataset: ``url``, ``store``,
    ``class_names``, ``len()`` and :meth:`read_many`. Samples are dicts with ``"key"``,
    ``"label"`` and one entry per member of the row (see the module docstring).

    Args:
        reader: The table's reader (its files, columns and rules). No reference per row
            is made: a table of many rows costs its row groups and a label a row.
    """

    def __init__(self, reader: ParquetReader) -> None:
        self.reader = reader
        table = reader.table()
        #: The row groups, in file and row order.
        self.groups = table.groups
        #: Rows of each row group.
        self.group_rows = [group.rows for group in table.groups]
        self._starts = np.asarray([group.start for group in table.groups], dtype=np.int64)
        self._rows = sum(self.group_rows)
        self._labels = table.labels
        self._store = reader.store()
        fetched = np.asarray(
            [reader.chunk_bytes(g.location, g.group) for g in table.groups], dtype=np.float64
        )
        per_row = fetched / np.maximum(np.asarray(self.group_rows, dtype=np.float64), 1)
        #: Bytes fetched per row: its row group's chunks of the chosen columns, shared.
        self.row_bytes = np.repeat(per_row, self.group_rows)

    @property
    def url(self) -> str:
        """The file, folder or prefix read."""
        return self.reader.location

    @property
    def store(self) -> Store:
        """The store the files are read through (its counters count every request)."""
        return self._store

    @property
    def class_names(self) -> list[str]:
        """Names of the labels, indexed by label (the Hugging Face ``ClassLabel``'s, those
        given, or a string label column's values sorted)."""
        return list(self.reader.class_names)

    @property
    def keys(self) -> list[str]:
        """The rows' keys, as a pack of the table keys them."""
        return [group.key(row) for group in self.groups for row in range(group.rows)]

    def member_counts(self) -> dict[str, int] | None:
        """The members the chosen columns give, each counted for every row (a null value
        gives none for its row); None where an image or binary column is chosen (its
        members are named by their bytes)."""
        names = self.reader.member_names()
        return None if names is None else {name: len(self) for name in names}

    def __len__(self) -> int:
        return self._rows

    def __repr__(self) -> str:
        return f"ParquetDataset({self.url!r}, rows={len(self)}, row_groups={len(self.groups)})"

    def group_of(self, row: int) -> int:
        """The number of the row group row ``row`` is in."""
        return int(np.searchsorted(self._starts, row, side="right")) - 1

    def group_name(self, row: int) -> str:
        """The file and row group row ``row`` is read from, for messages."""
        group = self.groups[self.group_of(row)]
        return f"{group.location} row group {group.group}"

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Read rows by number, in the order given, their row groups at once.

        Raises:
            SourceError: A row that cannot become a sample (named).
        """
        samples = self._store.engine.run(self.read_many_async(indices))
        for sample in samples:
            if "error" in sample:
                raise sample["error"]
        return samples

    async def read_many_async(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Async form of :meth:`read_many`: each row group's rows decoded on a thread, the
        row groups at once; a row that cannot become a sample comes back as its sample
        with an ``"error"`` (a :class:`~stoker.errors.SourceError` naming it)."""
        by_group: dict[int, list[int]] = {}
        for i in dict.fromkeys(int(i) for i in indices):
            by_group.setdefault(self.group_of(i), []).append(i)
        parts = await asyncio.gather(
            *(asyncio.to_thread(self._read, g, rows) for g, rows in by_group.items())
        )
        found = {i: sample for part in parts for i, sample in part}
        return [found[int(i)] for i in indices]

    def _read(self, number: int, rows: Sequence[int]) -> list[tuple[int, dict[str, Any]]]:
        """Rows (by number in the table) of row group ``number``, which is fetched and
        decoded once for them."""
        group = self.groups[number]
        found_all = self.reader.read_rows(group, [i - group.start for i in rows])
        out = []
        for i, found in zip(rows, found_all, strict=True):
            if isinstance(found, SourceError):
                label = -1 if self._labels is None else int(self._labels[i])
                key = group.key(i - group.start)
                out.append((i, {"key": key, "label": label, "error": found}))
                continue
            fields = {member_entry(name): data for name, data in found.fields.items()}
            out.append((i, {"key": found.key, "label": found.label, **fields}))
        return out


class ParquetSource:
    """A Parquet table read in place as a Loader's source: one unit per row (see the
    module docstring).

    Args:
        dataset: The table.
    """

    def __init__(self, dataset: ParquetDataset) -> None:
        self.dataset = dataset

    @property
    def url(self) -> str:
        return self.dataset.url

    @property
    def datasets(self) -> list[ParquetDataset]:
        return [self.dataset]

    @property
    def extra_fields(self) -> tuple[str, ...]:
        return ()

    cut_first_batch = False  # a read group is a row group or two: a first batch comes from it
    row_fields = None  # every array of a batch has one row per sample
    one_get_per_unit = False

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        """Blocks of a whole row group (unless ``block_size`` is given): a row group's
        chunks are fetched and decoded at once, so a block of part of one would make
        every rank that reads a part fetch and decode all of it. Read groups of as many
        row groups as make about the bytes the Loader aims a group at (one row group of
        images is often 10 MB or more), so the first batch waits for one or two."""
        if order.block_size is not None:
            return order
        block = max(self.dataset.group_rows)
        groups = order.group_blocks or group_blocks_for(block, units=units, unit_bytes=unit_bytes)
        return replace(order, block_size=block, group_blocks=groups)

    def make_batcher(self, settings: BatcherSettings) -> Batcher:
        return BatchAssembler.for_source(self, settings)

    @property
    def shard_sizes(self) -> list[int]:
        """Rows in each row group: the shards of the order."""
        return self.dataset.group_rows

    def mix_batcher(
        self, mix: Source, parts: Sequence[object], settings: BatcherSettings
    ) -> Batcher:
        """The batcher of ``mix``, a mix of this table and ``parts`` (samples all)."""
        return BatchAssembler.for_source(mix, settings)

    def shard_of(self, unit: int) -> str | None:
        return self.dataset.group_name(unit)

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        return epoch_order(self.shard_sizes, config=config, epoch=epoch)

    def units(self) -> int:
        return len(self.dataset)

    def unit_bytes(self) -> float:
        row_bytes = self.dataset.row_bytes
        return float(row_bytes.mean()) if len(row_bytes) else 1.0

    def shuffled(self) -> bool:
        return False  # rows in the table's order: the Loader mixes them in a window

    def nbytes(self, ids: Sequence[int]) -> int:
        return int(self.dataset.row_bytes[np.asarray(ids, dtype=np.int64)].sum())

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        return await self.dataset.read_many_async(ids)


def open_parquet(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None,
    columns: Sequence[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ParquetSource:
    """Open a Parquet file, or a folder or bucket prefix of them, as a Loader's source.

    Args:
        url: The file, folder or prefix.
        storage_options: See :func:`stoker.open_store`.
        columns: Read only these columns; None reads every column.
        cache_dir: The node's disk cache (``CacheConfig.dir``): a bucket's listing and
            footers are read by one process of the node and kept there for the others.

    Raises:
        SourceError: No Parquet files; a file that cannot be read, claims more rows than
            it could hold or has other columns than the first; a column asked for that
            the files do not have (each named).
        ImportError: pyarrow is not installed (``pip install 'stoker[parquet]'``).
    """
    footers = None
    if cache_dir is not None and is_remote(str(url)):
        footers = DiskCache(cache_dir, max_bytes=1 << 62)  # listing and footers: small
    reader = ParquetReader(
        str(url),
        storage_options=storage_options,
        cache_bytes=None,  # a block is a whole row group, read at once: none kept
        columns=columns,
        footer_cache=footers,
    )
    return ParquetSource(ParquetDataset(reader))
