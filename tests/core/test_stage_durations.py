"""Each stage's runs counted by duration (the latency histogram live metrics serve): the
bucket a run falls in, and the counts through LoaderStats' differences and sums, as
TorchLoader's workers and epochs combine them."""

from __future__ import annotations

from stoker.core.metrics import DURATION_BUCKETS_S, Stages, duration_bucket
from stoker.pipeline.stats import LoaderStats, one_after_another, side_by_side

N = len(DURATION_BUCKETS_S) + 1


def counts(**at: int) -> tuple[int, ...]:
    """Bucket counts with ``b<index>=count``."""
    out = [0] * N
    for name, n in at.items():
        out[int(name[1:])] = n
    return tuple(out)


def test_a_run_counts_in_the_first_bucket_whose_bound_it_does_not_pass() -> None:
    assert duration_bucket(0.0) == 0
    assert duration_bucket(0.001) == 0  # a bound holds runs up to and including it
    assert duration_bucket(0.0011) == 1
    assert duration_bucket(60.0) == N - 2
    assert duration_bucket(61.0) == N - 1  # past the last bound: the +Inf bucket


def test_stages_count_their_runs_by_duration() -> None:
    stages = Stages()
    for seconds in (0.0005, 0.003, 0.003, 2.0, 100.0):  # given, not measured
        stages.record("fetch", seconds)
    stages.record("decode", 0.02)
    snapshot = stages.snapshot()
    fetch = snapshot["fetch"]
    assert fetch.durations == counts(b0=1, b2=2, b10=1, b15=1)
    assert sum(fetch.durations) == fetch.calls == 5
    assert snapshot["decode"].durations == counts(b4=1)


def _stats(stages: Stages, samples: int) -> LoaderStats:
    return LoaderStats(samples=samples, stages=stages.snapshot())


def test_durations_follow_the_stats_through_differences_and_sums() -> None:
    stages = Stages()
    stages.record("consumer.wait", 0.003)
    before = _stats(stages, 1)
    stages.record("consumer.wait", 0.3)
    stages.record("consumer.wait", 0.004)
    after = _stats(stages, 3)
    assert after.since(before).stages["consumer.wait"].durations == counts(b2=1, b8=1)
    other = Stages()
    other.record("consumer.wait", 20.0)
    other.record("fetch", 0.05)
    worker = _stats(other, 1)
    both = side_by_side([after, worker])
    assert both.stages["consumer.wait"].durations == counts(b2=2, b8=1, b13=1)
    assert both.stages["fetch"].durations == counts(b5=1)
    later = one_after_another(after, worker)
    assert later.stages["consumer.wait"].durations == both.stages["consumer.wait"].durations
    assert LoaderStats().since(LoaderStats()).stages == {}
