"""Mixed epochs: counts, proportions in every stretch of the stream, exactly-once, resume."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from stoker.pipeline.mixing import MixConfig, MixedOrder, mixed_epoch_order, source_counts
from stoker.pipeline.order import OrderConfig, Segment, assign, consumed

shard_layouts = st.lists(st.integers(0, 200), min_size=1, max_size=4)
order_configs = st.builds(
    OrderConfig,
    mode=st.sampled_from(["blocks", "blocks", "random", "none"]),
    seed=st.integers(0, 2**32),
    block_size=st.integers(1, 32),
    group_blocks=st.integers(1, 8),
)


@st.composite
def mixes(draw: st.DrawFn) -> tuple[list[list[int]], list[OrderConfig], MixConfig]:
    """Sources, their order configs and a valid mix (weights or counts)."""
    n = draw(st.integers(1, 4))
    layouts = [draw(shard_layouts) for _ in range(n)]
    orders = [draw(order_configs) for _ in range(n)]
    totals = [sum(s) for s in layouts]
    replacement = draw(st.booleans())
    if draw(st.booleans()):
        weights = [draw(st.floats(0, 10)) if t else 0.0 for t in totals]
        assume(sum(weights) > 0.01)
        epoch_size = draw(st.none() | st.integers(0, 600)) if replacement else None
        mix = MixConfig(weights=tuple(weights), epoch_size=epoch_size, replacement=replacement)
    else:
        limit = 400 if replacement else None
        counts = [draw(st.integers(0, limit if limit and t else t)) for t in totals]
        mix = MixConfig(samples_per_epoch=tuple(counts), replacement=replacement)
    return layouts, orders, mix


def _prefix_counts(mixed: MixedOrder) -> np.ndarray:
    """(sources, len + 1): samples of each source among the first n of the stream."""
    sources, _ = mixed.locate(mixed.order.samples)
    onehot = np.zeros((len(mixed.shares), len(sources)), dtype=np.int64)
    onehot[sources, np.arange(len(sources))] = 1
    return np.concatenate([np.zeros((len(mixed.shares), 1), np.int64), onehot.cumsum(1)], 1)


@settings(max_examples=120, deadline=None)
@given(case=mixes(), epoch=st.integers(0, 4))
def test_counts_are_exact_and_ids_distinct(case, epoch) -> None:
    layouts, orders, mix = case
    mixed = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=epoch)
    totals = [sum(s) for s in layouts]
    counts = source_counts(totals, mix)
    samples = mixed.order.samples
    assert len(np.unique(samples)) == len(samples)  # resume can tell repeats apart
    assert mixed.count(samples).tolist() == counts
    assert [s.samples for s in mixed.shares] == counts
    assert mixed.order.group_starts[0] == 0
    assert mixed.order.group_starts[-1] == len(samples)
    sources, local = mixed.locate(samples)
    for k, total in enumerate(totals):
        mine = local[sources == k]
        assert ((mine >= 0) & (mine < total)).all()
        if counts[k] <= total:  # without repeats: each sample at most once
            assert len(np.unique(mine)) == len(mine)
        else:  # upsampled: whole passes, so every sample floor or ceil(count / size) times
            times = np.bincount(mine, minlength=total)
            assert times.min() == counts[k] // total
            assert times.max() == -(-counts[k] // total)
    again = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=epoch)
    assert np.array_equal(again.order.samples, samples)
    assert np.array_equal(again.order.group_starts, mixed.order.group_starts)


@settings(max_examples=120, deadline=None)
@given(case=mixes())
def test_weights_give_their_share(case) -> None:
    layouts, _orders, mix = case
    assume(mix.weights is not None)
    totals = [sum(s) for s in layouts]
    counts = source_counts(totals, mix)
    total = sum(counts)
    weights = np.asarray(mix.weights) / sum(mix.weights or ())
    assert np.abs(np.asarray(counts) - weights * total).max() < 1  # largest remainders
    if mix.epoch_size is not None:
        assert total == mix.epoch_size
    elif not mix.replacement:
        # The epoch ends when the first source would run out.
        assert all(c <= t for c, t in zip(counts, totals, strict=True))
        assert any((total + 1) * w > t + 1e-9 for t, w in zip(totals, weights, strict=True))


@settings(max_examples=120, deadline=None)
@given(case=mixes(), epoch=st.integers(0, 3))
def test_proportions_hold_in_every_stretch_of_the_stream(case, epoch) -> None:
    layouts, orders, mix = case
    mixed = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=epoch)
    n = len(mixed.order.samples)
    assume(n > 0)
    prefix = _prefix_counts(mixed)
    share = np.asarray([s.fraction for s in mixed.shares])
    groups = np.asarray([s.group_samples for s in mixed.shares], dtype=np.float64)
    # A prefix's count is off its share by at most half a group of the source, its share
    # of half a group of every source, and rounding inside a round.
    bound = groups / 2 + share * groups.sum() / 2 + (len(share) + 1) / 2
    deviation = prefix - share[:, None] * np.arange(n + 1)[None, :]
    assert (np.abs(deviation).max(axis=1) <= bound + 1e-9).all()
    # So any window is off by at most twice that, whatever its length.
    for width in {w for w in (1, 7, 64, n // 3) if 0 < w <= n}:
        window = prefix[:, width:] - prefix[:, :-width]
        assert (np.abs(window - share[:, None] * width).max(axis=1) <= 2 * bound + 1e-9).all()


def test_proportions_in_batches_of_a_large_mix() -> None:
    layouts = [[5000] * 8, [4000] * 2, [1000]]
    orders = [OrderConfig(block_size=32, group_blocks=16, seed=5)] * 3
    mix = MixConfig(weights=(0.6, 0.3, 0.1))
    mixed = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=2)
    assert [s.samples for s in mixed.shares] == [6000, 3000, 1000]
    sources, _ = mixed.locate(mixed.order.samples)
    batches = sources[: len(sources) // 256 * 256].reshape(-1, 256)
    per_batch = np.stack([(batches == k).sum(1) for k in range(3)], 1) / 256
    # Every batch of 256 is near 60/30/10, never one source at a time: off by a few points
    # on average, and at most about one group of the small source (96 samples in a round
    # of 864) where a round has none of it.
    off = np.abs(per_batch - [0.6, 0.3, 0.1])
    assert off.mean() < 0.02
    assert off.max() < 0.11
    # Groups were balanced: the small source reads one block at a time, the large ones more.
    assert [s.group_samples for s in mixed.shares] == [512, 256, 96]


@settings(max_examples=80, deadline=None)
@given(case=mixes(), world=st.integers(1, 6), drop_last=st.booleans())
def test_every_sample_exactly_once_across_ranks(case, world, drop_last) -> None:
    layouts, orders, mix = case
    mixed = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=1)
    everything = np.sort(mixed.order.samples)
    shares = [
        assign(mixed.order, rank=r, world_size=world, drop_last=drop_last) for r in range(world)
    ]
    assert len({len(s.samples) for s in shares}) == 1
    fresh = np.concatenate([s.samples[: len(s.samples) - s.padded] for s in shares])
    assert len(np.unique(fresh)) == len(fresh)
    assert len(fresh) + shares[0].dropped == len(everything)
    if not drop_last:  # the same set of samples whatever the world size
        assert np.array_equal(np.sort(fresh), everything)


@settings(max_examples=80, deadline=None)
@given(
    case=mixes(),
    before=st.integers(1, 5),
    after=st.integers(1, 5),
    fraction=st.floats(0, 1),
)
def test_resume_with_new_world_size_repeats_and_skips_nothing(
    case, before, after, fraction
) -> None:
    layouts, orders, mix = case
    mixed = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=3)
    first = [assign(mixed.order, rank=r, world_size=before) for r in range(before)]
    done = int(len(first[0].samples) * fraction)
    # The order is recomputed from scratch on resume: a pure function of its arguments.
    again = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=3)
    seen = consumed(again.order, [Segment(before, done)])
    assert np.array_equal(seen, np.unique(np.concatenate([s.samples[:done] for s in first])))
    rest = [assign(again.order, rank=r, world_size=after, exclude=seen) for r in range(after)]
    fresh = np.concatenate([s.samples[: len(s.samples) - s.padded] for s in rest])
    assert not np.intersect1d(fresh, seen).size
    assert np.array_equal(np.sort(np.concatenate([seen, fresh])), np.sort(mixed.order.samples))
    # Per source, the resumed run delivers exactly the counts of an uninterrupted one.
    delivered = mixed.count(np.concatenate([seen, fresh]))
    assert delivered.tolist() == [s.samples for s in mixed.shares]


def test_rounds_keep_each_sources_read_groups_whole() -> None:
    # With packed order, a source's read group is a run of consecutive samples: inside a
    # round, each source's samples must be one such run, in order.
    layouts = [[300, 200], [90], [1000]]
    orders = [OrderConfig(mode="none", block_size=10, group_blocks=4)] * 3
    mixed = mixed_epoch_order(
        layouts, orders=orders, mix=MixConfig(samples_per_epoch=(500, 90, 700)), epoch=0
    )
    starts = mixed.order.group_starts
    for g in range(mixed.order.groups):
        sources, local = mixed.locate(mixed.order.samples[starts[g] : starts[g + 1]])
        for k in np.unique(sources):
            run = local[sources == k]
            assert np.array_equal(run, np.arange(run[0], run[0] + len(run)))
            assert len(run) <= mixed.shares[k].group_samples


def test_upsampling_repeats_whole_passes_in_new_orders() -> None:
    layouts, orders = [[50], [400]], [OrderConfig(block_size=5, seed=3)] * 2
    mix = MixConfig(samples_per_epoch=(120, 400), replacement=True)
    mixed = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=0)
    small = mixed.shares[0]
    assert (small.passes, small.repeated) == (3, 70)
    sources, local = mixed.locate(mixed.order.samples)
    passes = mixed.order.samples[sources == 0] // int(mixed.offsets[-1])
    assert np.bincount(passes).tolist() == [50, 50, 20]
    ordered = [local[sources == 0][passes == j] for j in range(3)]
    assert not np.array_equal(ordered[0], ordered[1])  # each pass reshuffled


def test_sources_with_equal_settings_get_unrelated_orders() -> None:
    mixed = mixed_epoch_order(
        [[100], [100]],
        orders=[OrderConfig(seed=1, block_size=4)] * 2,
        mix=MixConfig(weights=(1, 1)),
        epoch=0,
    )
    sources, local = mixed.locate(mixed.order.samples)
    assert not np.array_equal(local[sources == 0], local[sources == 1])


def test_epochs_differ_and_subsets_change_between_epochs() -> None:
    layouts, orders = [[1000], [100]], [OrderConfig(block_size=10)] * 2
    mix = MixConfig(weights=(1, 1))  # 100 of each: the large source is subsampled
    a = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=0)
    b = mixed_epoch_order(layouts, orders=orders, mix=mix, epoch=1)
    assert [s.samples for s in a.shares] == [100, 100]
    assert not np.array_equal(a.order.samples, b.order.samples)
    assert not np.array_equal(np.sort(a.order.samples[:100]), np.sort(b.order.samples[:100]))


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        MixConfig()
    with pytest.raises(ValueError, match="exactly one"):
        MixConfig(weights=(1,), samples_per_epoch=(1,))
    with pytest.raises(ValueError, match=">= 0"):
        MixConfig(weights=(1, -1))
    with pytest.raises(ValueError, match="> 0"):
        MixConfig(weights=(0, 0))
    with pytest.raises(ValueError, match="finite"):
        MixConfig(weights=(float("nan"),))
    with pytest.raises(ValueError, match="epoch_size"):
        MixConfig(samples_per_epoch=(1,), epoch_size=3)
    with pytest.raises(ValueError, match="replacement=True"):
        source_counts([10, 5], MixConfig(samples_per_epoch=(10, 6)))
    with pytest.raises(ValueError, match="replacement=True"):
        source_counts([10, 5], MixConfig(weights=(1, 1), epoch_size=20))
    with pytest.raises(ValueError, match="empty"):
        source_counts([10, 0], MixConfig(weights=(1, 1), replacement=True))
    with pytest.raises(ValueError, match="2 sources"):
        source_counts([10, 5, 1], MixConfig(weights=(1, 1)))
    with pytest.raises(ValueError, match="order configs"):
        mixed_epoch_order(
            [[1], [2]], orders=[OrderConfig()], mix=MixConfig(weights=(1, 1)), epoch=0
        )
    assert MixConfig(weights=[1, 2]).weights == (1.0, 2.0)  # lists are frozen to tuples


def test_an_empty_epoch_is_well_formed() -> None:
    mixed = mixed_epoch_order(
        [[10], [0]], orders=[OrderConfig()] * 2, mix=MixConfig(samples_per_epoch=(0, 0)), epoch=0
    )
    assert len(mixed.order.samples) == 0
    assert mixed.order.group_starts.tolist() == [0]
    assert assign(mixed.order, rank=0, world_size=2).samples.tolist() == []
