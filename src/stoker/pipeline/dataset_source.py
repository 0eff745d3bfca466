"""DatasetSource: the samples of one packed dataset as a Loader's source.

Each unit is a sample: a dict with its members (``jpg``, ...), ``key`` and ``label``, and
a row of each side table (``.npy`` arrays in the bucket, read by ranged GETs; see
:mod:`stoker.format.sidetable`) under the table's name. A sample that fails its checks
(CRC-32, malformed members) is a dict with ``key``, ``label`` and its ``error``, which the
loader raises or skips like an undecodable image. Mixes and windows of these samples are
in :mod:`stoker.pipeline.sources`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stoker.format.reader import ShardDataset
from stoker.format.sidetable import SideTable
from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.batching import BatchAssembler
from stoker.pipeline.order import EpochOrder, OrderConfig, epoch_order
from stoker.pipeline.source import Source
from stoker.storage.cached import CachedStore

#: The Loader reads only the samples it delivers: a ranged read joins adjacent samples, never
#: a gap. A gap is usually another block, read with its own group; reading it through too
#: made an epoch read 1.4-1.8x its shards' bytes.
LOADER_MAX_GAP_BYTES = 0


def max_gap_bytes(dataset: ShardDataset) -> int:
    """The gap a Loader reads through to join two samples of ``dataset`` into one request:
    :data:`LOADER_MAX_GAP_BYTES` from the store; through a disk cache, anything shorter
    than a page. A gap under a page holds no whole page, so the joined run touches the
    pages the two runs touch and no other, and fetches them with one ranged GET where
    apart they took two: loader workers, each reading its own samples of a block (the
    rest are another worker's), fetch the block's pages with one request, as one process
    reads the block (cached pages give only the samples' bytes, whatever the run)."""
    store = dataset.store
    if isinstance(store, CachedStore):
        return store.page_bytes - 1
    return LOADER_MAX_GAP_BYTES


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
        self._max_gap_bytes = max_gap_bytes(dataset)
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

    cut_first_batch = False  # a read group holds a few batches
    row_fields = None  # every array of a batch: image, label, index, stacked fields
    one_get_per_unit = False

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        return order  # resolve_order's, sized by the samples' bytes

    def make_batcher(self, settings: BatcherSettings) -> Batcher:
        return BatchAssembler.for_source(self, settings)

    def mix_batcher(
        self, mix: Source, parts: Sequence[object], settings: BatcherSettings
    ) -> Batcher:
        """The batcher of ``mix``, a mix of this source and ``parts``."""
        return BatchAssembler.for_source(mix, settings)

    def shard_of(self, unit: int) -> str | None:
        index = self.dataset.index
        return index.shards[int(index.shard[unit])].name

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
                unique, return_errors=True, max_gap_bytes=self._max_gap_bytes
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


def packed_dataset(source: Source) -> ShardDataset | None:
    """The packed dataset ``source`` reads as it is (no side tables, windows or mix)."""
    if isinstance(source, DatasetSource) and not source.side_tables:
        return source.dataset
    return None
