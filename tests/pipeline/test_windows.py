"""Windows of consecutive records: boundaries, exactly-once across ranks, resume."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.pipeline.order import OrderConfig, Segment, assign, consumed
from stoker.pipeline.windows import (
    WindowConfig,
    window_epoch_order,
    window_records,
    window_starts,
    windows_per_shard,
)

layouts = st.lists(st.integers(0, 120), min_size=1, max_size=6)
window_configs = st.builds(
    WindowConfig,
    size=st.integers(1, 12),
    shift=st.none() | st.integers(1, 12),
    stride=st.integers(1, 3),
    cross_shards=st.booleans(),
)
order_configs = st.builds(
    OrderConfig,
    mode=st.sampled_from(["blocks", "blocks", "random", "none"]),
    seed=st.integers(0, 2**32),
    block_size=st.integers(1, 16),
    group_blocks=st.integers(1, 6),
)


@st.composite
def datasets(draw: st.DrawFn) -> tuple[list[int], np.ndarray | None]:
    """Shard sizes and, half the time, per-record sequence ids (runs of equal ids)."""
    sizes = draw(layouts)
    total = sum(sizes)
    if total == 0 or draw(st.booleans()):
        return sizes, None
    cuts = draw(st.lists(st.integers(1, max(1, total - 1)), max_size=8))
    ids = np.zeros(total, dtype=np.int64)
    for cut in cuts:
        ids[cut:] += 1
    return sizes, ids


def _brute_force_starts(sizes, config, sequence_ids) -> list[int]:
    total = sum(sizes)
    shard = np.repeat(np.arange(len(sizes)), sizes)
    found = []
    segment_first = 0
    for r in range(total):
        if r and (
            (not config.cross_shards and shard[r] != shard[r - 1])
            or (sequence_ids is not None and sequence_ids[r] != sequence_ids[r - 1])
        ):
            segment_first = r
        if (r - segment_first) % config.step:
            continue
        last = r + config.span - 1
        if last >= total:
            continue
        inside = np.arange(r, last + 1)
        if not config.cross_shards and len(set(shard[inside])) > 1:
            continue
        if sequence_ids is not None and len(set(sequence_ids[inside])) > 1:
            continue
        found.append(r)
    return found


@settings(max_examples=150, deadline=None)
@given(data=datasets(), config=window_configs)
def test_every_window_is_consecutive_records_within_its_boundaries(data, config) -> None:
    sizes, sequence_ids = data
    starts = window_starts(sizes, config, sequence_ids)
    assert starts.tolist() == _brute_force_starts(sizes, config, sequence_ids)
    records = window_records(np.arange(len(starts)), starts, config)
    assert records.shape == (len(starts), config.size)
    if not len(starts):
        return
    assert (np.diff(records, axis=1) == config.stride).all()  # consecutive (at stride)
    assert records.max() < sum(sizes)
    shard = np.repeat(np.arange(len(sizes)), sizes)
    if not config.cross_shards:
        assert (shard[records] == shard[records[:, :1]]).all()
    if sequence_ids is not None:
        assert (sequence_ids[records] == sequence_ids[records[:, :1]]).all()
    assert windows_per_shard(sizes, starts).sum() == len(starts)


@settings(max_examples=150, deadline=None)
@given(
    data=datasets(),
    config=window_configs,
    order=order_configs,
    epoch=st.integers(0, 5),
    world=st.integers(1, 6),
    drop_last=st.booleans(),
)
def test_each_window_once_per_epoch_across_ranks(
    data, config, order, epoch, world, drop_last
) -> None:
    sizes, sequence_ids = data
    starts = window_starts(sizes, config, sequence_ids)
    epoch_windows = window_epoch_order(sizes, starts, order=order, epoch=epoch)
    assert sorted(epoch_windows.samples.tolist()) == list(range(len(starts)))
    again = window_epoch_order(sizes, starts, order=order, epoch=epoch)
    assert np.array_equal(again.samples, epoch_windows.samples)
    shares = [
        assign(epoch_windows, rank=r, world_size=world, drop_last=drop_last) for r in range(world)
    ]
    assert len({len(s.samples) for s in shares}) == 1
    fresh = np.concatenate([s.samples[: len(s.samples) - s.padded] for s in shares])
    assert len(np.unique(fresh)) == len(fresh)
    assert len(fresh) + shares[0].dropped == len(starts)


@settings(max_examples=150, deadline=None)
@given(
    data=datasets(),
    config=window_configs,
    order=order_configs,
    before=st.integers(1, 5),
    after=st.integers(1, 5),
    fraction=st.floats(0, 1),
)
def test_resume_is_exact(data, config, order, before, after, fraction) -> None:
    sizes, sequence_ids = data
    starts = window_starts(sizes, config, sequence_ids)
    epoch_windows = window_epoch_order(sizes, starts, order=order, epoch=2)
    first = [assign(epoch_windows, rank=r, world_size=before) for r in range(before)]
    done = int(len(first[0].samples) * fraction)
    # Same world size: the recomputed order continues exactly where the run stopped.
    restarted = window_epoch_order(
        sizes, window_starts(sizes, config, sequence_ids), order=order, epoch=2
    )
    for r in range(before):
        assert np.array_equal(
            assign(restarted, rank=r, world_size=before).samples[done:], first[r].samples[done:]
        )
    # New world size: nothing repeated, nothing skipped.
    seen = consumed(restarted, [Segment(before, done)])
    rest = [assign(restarted, rank=r, world_size=after, exclude=seen) for r in range(after)]
    fresh = np.concatenate([s.samples[: len(s.samples) - s.padded] for s in rest])
    assert not np.intersect1d(fresh, seen).size
    assert sorted(np.concatenate([seen, fresh]).tolist()) == list(range(len(starts)))


def test_blocks_of_windows_read_contiguous_records() -> None:
    sizes = [1000] * 6
    config = WindowConfig(size=16, shift=8)
    starts = window_starts(sizes, config)
    assert windows_per_shard(sizes, starts).tolist() == [124] * 6  # (1000 - 16) // 8 + 1
    order = OrderConfig(block_size=10, group_blocks=4, seed=7)
    epoch_windows = window_epoch_order(sizes, starts, order=order, epoch=0)
    group = epoch_windows.samples[epoch_windows.group_starts[0] : epoch_windows.group_starts[1]]
    records = np.unique(window_records(group, starts, config))
    # Four blocks of ten overlapping windows: four runs of 9 * 8 + 16 = 88 records each.
    runs = np.split(records, np.flatnonzero(np.diff(records) != 1) + 1)
    assert sorted(len(r) for r in runs) == [88] * 4
    assert all(len({int(x) // 1000 for x in r}) == 1 for r in runs)  # each in one shard
    other = window_epoch_order(sizes, starts, order=order, epoch=1)
    assert not np.array_equal(epoch_windows.samples, other.samples)


def test_sequences_and_shards_bound_windows() -> None:
    sequence_ids = np.array([0] * 5 + [1] * 7 + [2] * 3)
    starts = window_starts([10, 5], WindowConfig(size=3), sequence_ids)
    # Sequence 0: 0-2; sequence 1 inside shard 0 is 5-9, then 10-11 in shard 1 (too short);
    # sequence 2: 12-14.
    assert starts.tolist() == [0, 5, 12]
    crossing = window_starts([10, 5], WindowConfig(size=3, cross_shards=True), sequence_ids)
    assert crossing.tolist() == [0, 5, 8, 12]
    strided = window_starts([20], WindowConfig(size=3, shift=4, stride=5))
    assert strided.tolist() == [0, 4, 8]  # spans of 11 records
    assert window_records([2], strided, WindowConfig(size=3, shift=4, stride=5)).tolist() == [
        [8, 13, 18]
    ]


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="size"):
        WindowConfig(size=0)
    with pytest.raises(ValueError, match="shift"):
        WindowConfig(size=2, shift=0)
    with pytest.raises(ValueError, match="stride"):
        WindowConfig(size=2, stride=0)
    with pytest.raises(ValueError, match="one per record"):
        window_starts([3, 4], WindowConfig(size=2), np.zeros(6))
    assert window_starts([], WindowConfig(size=2)).tolist() == []
    assert window_starts([0, 1], WindowConfig(size=2)).tolist() == []
