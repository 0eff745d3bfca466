"""Request-rate shaping end to end: processes sharing one prefix behind a throttling proxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.profile.advice import format_diagnosis
from stoker.profile.doctor import diagnose
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import NetProxy, RateLimitConfig
from stoker.testing.throttled import put_objects, run_throttled_downloads, run_throttled_ranks

LIMIT_PER_S = 150.0
CHILD = Path(__file__).with_name("throttled_rank_child.py")


@pytest.mark.slow
def test_two_downloads_of_one_prefix_stay_under_its_limit(
    s3_bucket, s3_server, tmp_path: Path
) -> None:
    """Two `stoker download` processes, 900 objects each, one prefix limited to 150
    requests/s: at most 10 % of requests throttled (51 % without shaping), the shapers'
    rates adding up to at least half the limit, every file byte-exact."""
    put_objects(s3_server, s3_bucket.name, 900)
    run = run_throttled_downloads(
        s3_server, s3_bucket.name, tmp_path, objects=900, requests_per_s=LIMIT_PER_S
    )
    assert run.exit_codes == [0, 0], run.reports
    assert run.files_intact == 2 * 900
    assert run.requests >= 1800
    assert run.throttled_share <= 0.10, run.to_dict()
    rates = []
    for report in run.reports:
        counters = report["requests"]
        assert counters["throttles"] > 0  # the limit was found ...
        assert counters["shaping.rate_per_s"] > 0  # ... and the rate shaped to it
        rates.append(counters["shaping.rate_per_s"])
    # Shaped to the limit, not far under it: the two processes' rates (the shapers' own
    # settings at the end, not a measured time) add up to most of the prefix's limit.
    assert sum(rates) >= 0.5 * LIMIT_PER_S, (rates, run.to_dict())


@pytest.mark.slow
def test_eight_loader_ranks_on_one_node_read_exactly_once_under_the_limit(
    s3_bucket, s3_server, tmp_path: Path
) -> None:
    """Eight loader processes (ranks 0-7 of 8) read one epoch of a dataset in one prefix,
    one ranged read per sample, through a 150 requests/s limit: every sample delivered
    exactly once, and fewer than 10 % of the requests throttled."""
    samples = 1600
    write_image_folder(tmp_path / "src", files=samples, classes=8, width=32, height=24)
    url = f"{s3_bucket.url}/ds"
    pack(
        tmp_path / "src",
        url,
        config=PackConfig(samples_per_shard=4),
        storage_options=s3_bucket.options(),
    )
    run = run_throttled_ranks(
        s3_server, url, tmp_path, child=CHILD, samples=samples, requests_per_s=LIMIT_PER_S
    )
    assert run.exit_codes == [0] * 8, run.errors
    assert all(len(ids) == samples // 8 for ids in run.delivered)
    assert run.exactly_once
    assert run.throttled > 0  # the limit was reached ...
    assert run.throttled_share < 0.10, run.to_dict()  # ... and the ranks kept to it


@pytest.mark.slow
def test_the_doctor_reports_throttles_and_the_shaped_rate(
    s3_bucket, s3_server, tmp_path: Path
) -> None:
    write_image_folder(tmp_path / "src", files=96, classes=4, width=32, height=24)
    url = f"{s3_bucket.url}/ds"
    pack(
        tmp_path / "src",
        url,
        config=PackConfig(samples_per_shard=4),
        storage_options=s3_bucket.options(),
    )
    limit = RateLimitConfig(requests_per_s=40)
    with (
        NetProxy("127.0.0.1", s3_server.port, rate_limit=limit) as proxy,
        Loader(
            url,
            batch_size=8,
            transform=RandomResizedCrop(8),
            order=OrderConfig(mode="random"),
            storage_options=s3_bucket.options(proxy.endpoint),
        ) as loader,
    ):
        diagnosis = diagnose(loader, step_s=0.0, warmup_batches=0)
        throttled = proxy.stats().throttled
    report = format_diagnosis(diagnosis)
    assert throttled > 0
    assert diagnosis.requests["throttles"] > 0
    rate = diagnosis.request_rates[f"{s3_bucket.name}/ds"]
    assert 1 <= rate <= 200
    assert "Throttled: the store answered" in report
    assert f"{s3_bucket.name}/ds at" in report
    assert diagnosis.to_dict()["request_rates"] == {f"{s3_bucket.name}/ds": round(rate, 1)}
