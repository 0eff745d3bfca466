"""Windows of consecutive records of one dataset as a Loader's source (see
:mod:`stoker.pipeline.sources`): the windows' order and records are
:mod:`stoker.pipeline.windows`'."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stoker.format.reader import ShardDataset
from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.batching import BatchAssembler
from stoker.pipeline.dataset_source import DatasetSource
from stoker.pipeline.order import EpochOrder, OrderConfig
from stoker.pipeline.windows import (
    WindowConfig,
    dirname_sequence_ids,
    window_epoch_order,
    window_records,
    window_starts,
)


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

    cut_first_batch = False
    row_fields = None
    one_get_per_unit = False

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        return order

    def make_batcher(self, settings: BatcherSettings) -> Batcher:
        # A unit is a window of `size` frames.
        return BatchAssembler.for_source(self, settings, unit_shape=(self.window.size,))

    def shard_of(self, unit: int) -> str | None:
        return self.source.shard_of(int(self.records([unit])[0][0]))

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
