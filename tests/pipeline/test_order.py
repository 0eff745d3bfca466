"""Order, partition and resume: properties over generated shard layouts and worlds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from stoker.pipeline.order import (
    WINDOW_START_DIVISOR,
    WINDOW_START_GROUPS,
    OrderConfig,
    Segment,
    assign,
    consumed,
    epoch_order,
)

layouts = st.lists(st.integers(0, 300), min_size=1, max_size=12)
configs = st.builds(
    OrderConfig,
    mode=st.sampled_from(["blocks", "random", "none"]),
    seed=st.integers(0, 2**32),
    block_size=st.integers(1, 50),
    group_blocks=st.integers(1, 8),
    window=st.sampled_from([None, 1, 2, 5, 16, 40]),
    window_start=st.sampled_from([None, 1, 3, 40]),
)


@settings(max_examples=150, deadline=None)
@given(sizes=layouts, config=configs, epoch=st.integers(0, 5))
def test_epoch_order_is_a_deterministic_permutation(sizes, config, epoch) -> None:
    order = epoch_order(sizes, config=config, epoch=epoch)
    assert sorted(order.samples.tolist()) == list(range(sum(sizes)))
    again = epoch_order(sizes, config=config, epoch=epoch)
    assert np.array_equal(order.samples, again.samples)
    assert order.group_starts[0] == 0
    assert order.group_starts[-1] == sum(sizes)


@settings(max_examples=150, deadline=None)
@given(sizes=layouts, config=configs, world=st.integers(1, 7), drop_last=st.booleans())
def test_every_sample_exactly_once_across_ranks(sizes, config, world, drop_last) -> None:
    order = epoch_order(sizes, config=config, epoch=0)
    shares = [assign(order, rank=r, world_size=world, drop_last=drop_last) for r in range(world)]
    assert len({len(s.samples) for s in shares}) == 1  # equal steps on every rank
    total = sum(sizes)
    if drop_last:
        delivered = np.concatenate([s.samples for s in shares])
        assert len(np.unique(delivered)) == len(delivered)  # nothing twice
        assert len(delivered) + shares[0].dropped == total
    else:
        unique = [s.samples[: len(s.samples) - s.padded] for s in shares]
        delivered = np.concatenate(unique) if unique else np.zeros(0)
        assert sorted(delivered.tolist()) == list(range(total))  # each exactly once
        assert sum(s.padded for s in shares) == len(shares[0].samples) * world - total


@settings(max_examples=150, deadline=None)
@given(sizes=layouts, config=configs, world=st.integers(1, 9), drop_last=st.booleans())
def test_evening_out_ranks_costs_fewer_samples_than_ranks(sizes, config, world, drop_last):
    order = epoch_order(sizes, config=config, epoch=1)
    shares = [assign(order, rank=r, world_size=world, drop_last=drop_last) for r in range(world)]
    total = sum(sizes)
    repeated = sum(s.padded for s in shares)
    assert repeated == shares[0].epoch_padded <= world - 1
    assert shares[0].dropped <= world - 1
    assert len(shares[0].samples) * world == total + repeated - shares[0].dropped
    # Ranks' pieces follow one another in the epoch's stream, each read group in its place
    # (a group cut by two ranks is only laid out anew inside itself): reads stay long.
    # With a window, each rank mixes its piece: the piece, not each group, keeps its place.
    fresh = np.concatenate([s.samples[: len(s.samples) - s.padded] for s in shares])
    starts = order.group_starts if order.window == 1 else []
    for begin, end in itertools.pairwise(starts):
        if end <= len(fresh):
            assert sorted(fresh[begin:end]) == sorted(order.samples[begin:end])
    if order.window > 1:  # each rank holds a run of whole groups, cut only at its two ends
        group_of = np.empty(total, dtype=np.int64)
        for g, (begin, end) in enumerate(itertools.pairwise(order.group_starts.tolist())):
            group_of[order.samples[begin:end]] = g
        sizes_of = np.diff(order.group_starts)
        for share in shares:
            own = share.samples[: len(share.samples) - share.padded]
            if not len(own):
                continue
            held, counts = np.unique(group_of[own], return_counts=True)
            assert held.tolist() == list(range(held[0], held[-1] + 1))
            assert np.array_equal(counts[1:-1], sizes_of[held[1:-1]])


@settings(max_examples=150, deadline=None)
@given(sizes=layouts, config=configs, world=st.integers(2, 9), drop_last=st.booleans())
def test_a_block_cut_by_two_ranks_is_one_range_on_each_side(
    sizes, config, world, drop_last
) -> None:
    assume(config.mode != "random")  # one ranged read per sample: there are no blocks
    order = epoch_order(sizes, config=config, epoch=2)
    for rank in range(world):
        share = assign(order, rank=rank, world_size=world, drop_last=drop_last)
        own = len(share.samples) - share.padded  # repeats (< world) come from anywhere
        # Inside each read group of the share, each block is one range of consecutive ids.
        for group in np.unique(share.groups[:own]).tolist():
            ids = np.sort(share.samples[:own][share.groups[:own] == group])
            breaks = np.flatnonzero(np.diff(ids) != 1) + 1
            # No block appears in two separate runs of consecutive ids of this group.
            seen: set[tuple[int, int]] = set()
            for run in np.split(ids, breaks):
                blocks = {_block_of(int(i), sizes, config) for i in run}
                assert not blocks & seen
                seen |= blocks


def _block_of(sample: int, sizes: list[int], config: OrderConfig) -> tuple[int, int]:
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    shard = int(np.searchsorted(offsets, sample, side="right") - 1)
    return shard, (sample - int(offsets[shard])) // config.blocks


@settings(max_examples=150, deadline=None)
@given(
    sizes=layouts,
    config=configs,
    before=st.integers(1, 6),
    after=st.integers(1, 6),
    fraction=st.floats(0, 1),
)
def test_resume_with_new_world_size_repeats_and_skips_nothing(
    sizes, config, before, after, fraction
) -> None:
    order = epoch_order(sizes, config=config, epoch=3)
    first = [assign(order, rank=r, world_size=before) for r in range(before)]
    length = len(first[0].samples)
    done = int(length * fraction)
    seen = consumed(order, [Segment(before, done)])
    expected_seen = np.unique(np.concatenate([s.samples[:done] for s in first]))
    assert np.array_equal(seen, expected_seen)
    rest = [assign(order, rank=r, world_size=after, exclude=seen) for r in range(after)]
    assert len({len(s.samples) for s in rest}) == 1
    fresh = np.concatenate([s.samples[: len(s.samples) - s.padded] for s in rest])
    assert not np.intersect1d(fresh, seen).size  # nothing repeated
    assert sorted(np.concatenate([seen, fresh]).tolist()) == list(range(sum(sizes)))


def test_blocks_keep_reads_contiguous_and_mix_shards() -> None:
    sizes = [1000] * 20
    config = OrderConfig(block_size=50, group_blocks=8, seed=1)
    order = epoch_order(sizes, config=config, epoch=0)
    first_group = order.samples[order.group_starts[0] : order.group_starts[1]]
    assert len(first_group) == 400
    # 8 blocks of 50 consecutive samples each.
    blocks = {int(s) // 50 for s in first_group}
    assert len(blocks) == 8
    # A batch of 64 from the group touches several shards.
    assert len({int(s) // 1000 for s in first_group[:64]}) >= 4
    # Different epochs differ.
    other = epoch_order(sizes, config=config, epoch=1)
    assert not np.array_equal(order.samples, other.samples)


def test_shuffle_quality_orders_the_modes() -> None:
    from stoker.pipeline.quality import shuffle_quality

    sizes = [500] * 40
    none = shuffle_quality(sizes, config=OrderConfig(mode="none"), batch_size=256)
    blocks = shuffle_quality(sizes, config=OrderConfig(block_size=32), batch_size=256)
    full = shuffle_quality(sizes, config=OrderConfig(mode="random"), batch_size=256)
    assert none.mean_neighbour_distance < 0.001
    assert 0.2 < blocks.mean_neighbour_distance < 0.45
    assert 0.3 < full.mean_neighbour_distance < 0.37  # about 1/3 for a random permutation
    assert none.mean_shards_per_batch <= 2
    assert blocks.mean_shards_per_batch >= 10
    assert full.mean_shards_per_batch > 30
    # Block mode reads 32 samples per request; random mode one.
    assert blocks.requests_per_sample == pytest.approx(1 / 32, rel=0.05)
    assert full.requests_per_sample == 1


def test_a_window_starts_narrow_so_the_first_batch_waits_for_few_groups() -> None:
    # 100 read groups of 20 samples, mixed through a window of 16: the first batch needs
    # the window's first groups only (a 256 MB window read whole took 3 s before a batch).
    sizes = [200] * 10
    config = OrderConfig(block_size=5, group_blocks=4, window=16, seed=3)
    order = epoch_order(sizes, config=config, epoch=0)
    share = assign(order, rank=0, world_size=1)
    start = config.window_starts
    assert start == max(WINDOW_START_GROUPS, -(-16 // WINDOW_START_DIVISOR)) == 2
    # Groups are numbered in the order they are first needed: a first batch of up to
    # `start` groups' samples draws from those groups only (the groups widening the window
    # start after them), so it waits for `start` groups.
    assert set(share.groups[: start * 20].tolist()) == set(range(start))
    assert set(share.groups[:16].tolist()) <= set(range(start))
    # The window widens to 16 groups: past the ramp, a batch of 64 draws from about 16.
    past_ramp = share.groups[40 * 20 : 40 * 20 + 64]
    assert len(set(past_ramp.tolist())) >= 12
    # And every group is held (first to last use) by at most about `window` groups' time.
    first_use = np.array([np.argmax(share.groups == g) for g in range(order.groups)])
    last_use = np.array(
        [len(share.groups) - np.argmax(share.groups[::-1] == g) - 1 for g in range(order.groups)]
    )
    assert np.all(last_use - first_use <= 17 * 20)
    # The same inputs give the same order.
    again = assign(epoch_order(sizes, config=config, epoch=0), rank=0, world_size=1)
    assert np.array_equal(share.samples, again.samples)


def test_a_window_started_whole_mixes_the_first_batch_through_all_of_it() -> None:
    sizes = [200] * 10
    config = OrderConfig(block_size=5, group_blocks=4, window=16, window_start=16, seed=3)
    share = assign(epoch_order(sizes, config=config, epoch=0), rank=0, world_size=1)
    assert len(set(share.groups[:16].tolist())) >= 7  # 16 draws from all 16 groups (not 2)
    assert config.window_starts == 16
    assert OrderConfig(window=64).window_starts == 2
    assert OrderConfig(window=4, window_start=9).window_starts == 4  # at most the window


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_first_batch_larger_than_a_group_waits_for_the_windows_start_only(
    world_size: int,
) -> None:
    # Issue 23's pairs, indexed in place: 8,000 records in 27 tars, blocks of 20, read
    # groups of 7 blocks (140 records, 15.5 MB), a window of 17 groups, batches of 256.
    # From one starting group, the groups joining the widening window made the first batch
    # wait for three groups (406 records, 45 MB); it now waits for the two it draws from.
    sizes = [296] * 26 + [8000 - 296 * 26]
    config = OrderConfig(block_size=20, group_blocks=7, window=17, seed=0)
    assert config.window_starts == 2
    order = epoch_order(sizes, config=config, epoch=0)
    for rank in range(world_size):
        share = assign(order, rank=rank, world_size=world_size)
        first_two = int(np.isin(share.groups, [0, 1]).sum())  # a rank's piece may cut one
        assert set(share.groups[:first_two].tolist()) == {0, 1}
        if world_size == 1:
            assert 256 <= first_two <= 280  # two groups (a shard's last block is short)
            assert set(share.groups[:256].tolist()) == {0, 1}  # the first batch: 2 groups
            # The groups after them join a few at a time: the second batch needs 6 groups
            # in all, as it did before (all joining at once, 7).
            assert int(share.groups[:512].max()) + 1 <= 6
    # The window still mixes: past its start, a batch of 256 draws from many groups.
    share = assign(order, rank=0, world_size=1)
    assert len(set(share.groups[2000:2256].tolist())) >= 10
