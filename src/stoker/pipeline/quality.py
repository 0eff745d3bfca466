"""How well an epoch order shuffles, and what it costs to read: measured, not assumed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stoker.pipeline.order import EpochOrder, OrderConfig, epoch_order


@dataclass(frozen=True, slots=True)
class ShuffleQuality:
    """Shuffle quality and read cost of one epoch's order.

    Attributes:
        mean_neighbour_distance: Mean ``|a - b|`` of the original positions of consecutive
            samples in the stream, as a fraction of the dataset size (a uniform random
            permutation gives about 1/3; packed order gives about 0).
        mean_shards_per_batch: Distinct shards in a batch, averaged over batches.
        requests_per_epoch: Ranged GETs needed to read the epoch (one per block, or one per
            sample in random mode).
        requests_per_sample: ``requests_per_epoch`` over the number of samples.
    """

    mean_neighbour_distance: float
    mean_shards_per_batch: float
    requests_per_epoch: int
    requests_per_sample: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def shuffle_quality(
    shard_sizes: Sequence[int],
    *,
    config: OrderConfig,
    batch_size: int,
    epoch: int = 0,
    order: EpochOrder | None = None,
) -> ShuffleQuality:
    """Measure the order of ``epoch`` for ``shard_sizes`` under ``config``."""
    order = order or epoch_order(shard_sizes, config=config, epoch=epoch)
    samples = order.samples
    total = len(samples)
    if total < 2:
        return ShuffleQuality(0.0, 1.0 if total else 0.0, total, float(total > 0))
    distance = float(np.abs(np.diff(samples)).mean()) / total
    shard_of = np.repeat(np.arange(len(shard_sizes)), np.asarray(shard_sizes, dtype=np.int64))
    shards = shard_of[samples]
    per_batch = [len(np.unique(shards[i : i + batch_size])) for i in range(0, total, batch_size)]
    if config.mode == "random":
        requests = total
    else:
        # One request per block: blocks are block_size runs inside each shard.
        requests = sum(-(-int(size) // config.blocks) for size in shard_sizes)
    return ShuffleQuality(distance, float(np.mean(per_batch)), requests, requests / total)
