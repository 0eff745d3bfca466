"""How well an epoch order shuffles, and what it costs to read: measured, not assumed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stoker.pipeline.order import EpochOrder, OrderConfig, assign, epoch_order


def _rounded(report: Any, digits: int) -> dict[str, Any]:
    """A report dataclass as a JSON-ready dict, its floats rounded to ``digits``."""
    return {k: round(v, digits) if isinstance(v, float) else v for k, v in asdict(report).items()}


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
        return _rounded(self, 4)


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
    samples = assign(order, rank=0, world_size=1).samples  # one rank's stream, mixed
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


@dataclass(frozen=True, slots=True)
class LabelMix:
    """How well an order's batches mix labels, against a uniform random permutation.

    Only full batches count. Under a uniform permutation a batch is a draw without
    replacement from the dataset, so its expected count of distinct labels is exact:
    ``sum over labels of 1 - C(N - n_label, B) / C(N, B)``.

    Attributes:
        batches: Full batches measured.
        mean_distinct_labels: Distinct labels in a batch, averaged over batches.
        uniform_distinct_labels: Its expectation under a uniform random permutation.
        distinct_ratio: ``mean_distinct_labels / uniform_distinct_labels`` (1.0: as mixed
            as a true shuffle; a class-sorted order without mixing gives about
            ``1 / uniform_distinct_labels``).
        mean_tv_distance: Total-variation distance of each batch's label histogram from
            the dataset's, averaged (0: every batch has the dataset's label proportions).
        uniform_tv_distance: The same for seeded uniform permutations of the dataset (the
            floor a batch of this size can reach).
    """

    batches: int
    mean_distinct_labels: float
    uniform_distinct_labels: float
    distinct_ratio: float
    mean_tv_distance: float
    uniform_tv_distance: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return _rounded(self, 4)


def uniform_distinct_labels(counts: Sequence[int], batch_size: int) -> float:
    """Expected distinct labels in a batch drawn without replacement (``counts`` per label)."""
    total = int(sum(counts))
    size = min(batch_size, total)

    def log_choose(n: int, k: int) -> float:
        return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)

    expected = 0.0
    for count in counts:
        rest = total - int(count)
        absent = 0.0 if rest < size else math.exp(log_choose(rest, size) - log_choose(total, size))
        expected += 1.0 - absent
    return expected


def label_mix(
    labels: np.ndarray, streams: Sequence[np.ndarray], *, batch_size: int, seed: int = 0
) -> LabelMix:
    """Measure how well the batches of ``streams`` mix ``labels``.

    Args:
        labels: The label of each sample of the dataset.
        streams: Sample ids in delivery order, one stream per rank (or one for all).
        batch_size: Samples per batch.
        seed: Seed of the uniform permutations the TV distance is compared with.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if len(labels) == 0:
        return LabelMix(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    values, dense = np.unique(labels, return_inverse=True)
    counts = np.bincount(dense, minlength=len(values))
    share = counts / counts.sum()

    def measure(batches: list[np.ndarray]) -> tuple[float, float]:
        if not batches:
            return 0.0, 0.0
        distinct = [len(np.unique(dense[b])) for b in batches]
        tv = [
            0.5 * float(np.abs(np.bincount(dense[b], minlength=len(values)) / len(b) - share).sum())
            for b in batches
        ]
        return float(np.mean(distinct)), float(np.mean(tv))

    batches = [
        stream[i : i + batch_size]
        for stream in streams
        for i in range(0, len(stream) - batch_size + 1, batch_size)
    ]
    mean_distinct, mean_tv = measure(batches)
    rng = np.random.default_rng(seed)
    uniform = [
        permuted[i : i + batch_size]
        for permuted in (rng.permutation(len(labels)) for _ in range(4))
        for i in range(0, len(labels) - batch_size + 1, batch_size)
    ]
    expected = uniform_distinct_labels(counts.tolist(), batch_size)
    return LabelMix(
        batches=len(batches),
        mean_distinct_labels=mean_distinct,
        uniform_distinct_labels=expected,
        distinct_ratio=mean_distinct / expected if expected else 0.0,
        mean_tv_distance=mean_tv,
        uniform_tv_distance=measure(uniform)[1],
    )


@dataclass(frozen=True, slots=True)
class ReadCost:
    """What one rank's epoch of an order costs to read (a single rank, one loader worker).

    Attributes:
        requests: Ranged GETs of the epoch: one per run of consecutive samples that a read
            group takes from one shard (a block, or a part of one at a rank's ends).
        median_read_bytes: Median bytes of those reads.
        epoch_bytes: Bytes the epoch reads (each sample once: the shards' bytes).
        window_groups: Read groups mixed together (``OrderConfig.window``).
        window_bytes: About what the window holds in memory (its groups' bytes).
    """

    requests: int
    median_read_bytes: float
    epoch_bytes: int
    window_groups: int
    window_bytes: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return _rounded(self, 1)


def read_cost(
    lengths: np.ndarray,
    shard_sizes: Sequence[int],
    *,
    order: EpochOrder,
    config: OrderConfig,
    world_size: int = 1,
) -> ReadCost:
    """Count the ranged reads of ``order``, as the Loader fetches them (one loader worker
    per rank), over all ``world_size`` ranks.

    Args:
        lengths: Bytes of each sample (the index's ``length``).
        shard_sizes: Samples in each shard.
        order: The epoch's order.
        config: The resolved order settings (block and group sizes, window).
        world_size: Ranks sharing the epoch.
    """
    shard_of = np.repeat(np.arange(len(shard_sizes)), np.asarray(shard_sizes, dtype=np.int64))
    reads: list[int] = []
    for rank in range(world_size):
        share = assign(order, rank=rank, world_size=world_size)
        for group in np.unique(share.groups).tolist():
            ids = np.unique(share.samples[share.groups == group])
            # A new read wherever the next sample is not the next one of the same shard.
            breaks = np.flatnonzero((np.diff(ids) != 1) | (np.diff(shard_of[ids]) != 0)) + 1
            reads += [int(lengths[run].sum()) for run in np.split(ids, breaks)]
    group_bytes = config.group_samples * (float(lengths.mean()) if len(lengths) else 0.0)
    # A window can hold no more groups than the epoch has (a small dataset's window is all
    # of it): the default window counts groups of a 256 MB target.
    window = min(config.windows, order.groups)
    return ReadCost(
        requests=len(reads),
        median_read_bytes=float(np.median(reads)) if reads else 0.0,
        epoch_bytes=int(lengths.sum()),
        window_groups=window,
        window_bytes=min(window * group_bytes, float(lengths.sum())),
    )
