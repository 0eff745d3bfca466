"""Windows of consecutive records as the unit of an epoch: pure functions of a few integers.

For datasets whose samples are ordered records (video frames, time steps, tokens), a
training example is a *window*: ``size`` records, ``stride`` apart, starting every
``shift`` records (``tf.data.Dataset.window`` semantics). Windows never cross a shard
boundary (unless ``cross_shards``) nor a sequence boundary (where a per-record sequence id
changes), and a window that would run past one is not made.

Windows are numbered in the order of their first record, so the windows of one shard have
consecutive ids and a run of consecutive window ids covers one contiguous range of records.
The epoch's order over window ids is therefore :func:`~stoker.pipeline.order.epoch_order`
applied to the number of windows starting in each shard: its blocks (runs of
``block_size`` consecutive windows) are one contiguous ranged read each, and
:func:`~stoker.pipeline.order.assign` and :func:`~stoker.pipeline.order.consumed` give the
same partition and resume guarantees for windows as for samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from stoker.pipeline.order import EpochOrder, OrderConfig, epoch_order


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowConfig:
    """How records form windows.

    Attributes:
        size: Records per window.
        shift: Records between the starts of consecutive windows (default: ``size``, so
            windows do not overlap; smaller values overlap them).
        stride: Records between consecutive records of one window (1: adjacent records).
        cross_shards: Let a window run from one shard into the next (sequence boundaries
            still hold).
        sequences: Where sequences end. ``None``: records form one sequence (only shards
            cut it). ``"dirname"``: a record's sequence is its key up to the last ``/``, so
            frames packed from ``clips/<clip>/<frame>.jpg`` keep to their clip. (Any other
            per-record ids: a :class:`~stoker.pipeline.sources.WindowSource` takes them.)
    """

    size: int
    shift: int | None = None
    stride: int = 1
    cross_shards: bool = False
    sequences: Literal["dirname"] | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        if self.shift is not None and self.shift < 1:
            raise ValueError(f"shift must be >= 1, got {self.shift}")
        if self.stride < 1:
            raise ValueError(f"stride must be >= 1, got {self.stride}")
        if self.sequences not in (None, "dirname"):
            raise ValueError(f"sequences must be None or 'dirname', got {self.sequences!r}")

    @property
    def step(self) -> int:
        """Records between the starts of consecutive windows."""
        return self.size if self.shift is None else self.shift

    @property
    def span(self) -> int:
        """Records from a window's first to its last, both included."""
        return (self.size - 1) * self.stride + 1


def window_starts(
    shard_sizes: Sequence[int],
    config: WindowConfig,
    sequence_ids: np.ndarray | Sequence[int] | None = None,
) -> np.ndarray:
    """First record of every window, in increasing order; window ``w`` starts at ``[w]``.

    Args:
        shard_sizes: Records in each shard, in index order.
        config: Window size, shift and stride.
        sequence_ids: One id per record; a sequence is a run of equal ids, and no window
            crosses from one sequence into the next.

    Returns:
        int64 record ids.

    Raises:
        ValueError: ``sequence_ids`` does not have one entry per record.
    """
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total = int(offsets[-1])
    cuts = [np.asarray([0, total], dtype=np.int64)]
    if not config.cross_shards:
        cuts.append(offsets)
    if sequence_ids is not None:
        ids = np.asarray(sequence_ids)
        if ids.shape != (total,):
            raise ValueError(f"sequence_ids has shape {ids.shape}; need ({total},), one per record")
        cuts.append(np.flatnonzero(ids[1:] != ids[:-1]).astype(np.int64) + 1)
    bounds = np.unique(np.concatenate(cuts))
    first, length = bounds[:-1], np.diff(bounds)
    counts = np.maximum(0, (length - config.span) // config.step + 1)
    before = np.cumsum(counts) - counts
    number = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(before, counts)
    starts: np.ndarray = np.repeat(first, counts) + number * config.step
    return starts


def dirname_sequence_ids(keys: Sequence[str]) -> np.ndarray:
    """One id per record: equal for records whose keys share the part before the last ``/``.

    Ids are numbered in order of first appearance; a sequence whose records are not
    adjacent is cut wherever another sequence's records come between.
    """
    first_seen: dict[str, int] = {}
    return np.fromiter(
        (first_seen.setdefault(key.rpartition("/")[0], len(first_seen)) for key in keys),
        dtype=np.int64,
        count=len(keys),
    )


def windows_per_shard(shard_sizes: Sequence[int], starts: np.ndarray) -> np.ndarray:
    """Number of windows whose first record lies in each shard."""
    offsets = np.cumsum(np.asarray(shard_sizes, dtype=np.int64))
    shard = np.searchsorted(offsets, starts, side="right")
    return np.bincount(shard, minlength=len(offsets)).astype(np.int64)


def window_epoch_order(
    shard_sizes: Sequence[int],
    starts: np.ndarray,
    *,
    order: OrderConfig,
    epoch: int,
) -> EpochOrder:
    """Return the order of one epoch over window ids.

    Args:
        shard_sizes: Records in each shard, in index order.
        starts: The windows, from :func:`window_starts`.
        order: Shuffle settings; ``block_size`` counts windows (one block is one ranged
            read of about ``(block_size - 1) * shift + span`` records).
        epoch: Zero-based epoch number.

    Returns:
        Every window id exactly once, cut into read groups. A pure function of its
        arguments.
    """
    counts = windows_per_shard(shard_sizes, starts).tolist()
    return epoch_order(counts, config=order, epoch=epoch)


def window_records(
    window_ids: np.ndarray | Sequence[int],
    starts: np.ndarray,
    config: WindowConfig,
) -> np.ndarray:
    """Record ids of windows: row ``i`` holds the records of ``window_ids[i]`` in order.

    Args:
        window_ids: Window ids (from an epoch order or a rank's share).
        starts: The windows, from :func:`window_starts`.
        config: The config the windows were made with.

    Returns:
        int64 array of shape ``(len(window_ids), config.size)``.
    """
    first = starts[np.asarray(window_ids, dtype=np.int64)]
    return first[:, None] + np.arange(config.size, dtype=np.int64)[None, :] * config.stride
