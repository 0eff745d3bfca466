"""A store that throttles every GET (issue 22.9): say so once, give up within the budget.

The proxy in front of the real SeaweedFS server answers every GET of an object with
``503 SlowDown`` (the listing passes). A download of 200 files went on for 450 s before
failing and printed nothing without ``-v``; now the first throttle is a warning with the
rate reached, and the download stops after ``max_throttled_s`` of nothing but throttles,
with no partial file left. A store that throttles some requests and serves others (a rate
limit) never trips the budget.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stoker.errors import RetriesExhaustedError
from stoker.storage import open_store
from stoker.storage.engine import IOEngine
from stoker.storage.transfer import TransferConfig, download
from stoker.testing.netproxy import FaultConfig, NetProxy, RateLimitConfig

WARNING = "the store is throttling requests to"


def _put_files(s3_bucket: Any, count: int) -> None:
    store = s3_bucket.store("data")
    for i in range(count):
        store.put(f"f{i:03d}", f"file {i}".encode() * 50)


def _throttle_every_get(proxy: NetProxy, bucket: str) -> None:
    # Object GETs only: the listing (GET /bucket?list-type=2...) is served.
    proxy.set_faults(
        FaultConfig(
            fault_rate=1.0,
            kinds=("503",),
            fault_methods=frozenset({"GET"}),
            fault_paths=f"/{bucket}/data/",
        )
    )


@pytest.fixture
def engine() -> Iterator[IOEngine]:
    """An engine of the test's own, so that its shapers have seen no earlier throttle."""
    fresh = IOEngine()
    try:
        yield fresh
    finally:
        fresh.close()


def test_cli_download_says_the_store_throttles_and_gives_up_in_time(
    s3_bucket: Any, proxy: NetProxy, tmp_path: Path
) -> None:
    _put_files(s3_bucket, 30)
    _throttle_every_get(proxy, s3_bucket.name)
    options = s3_bucket.options()
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": proxy.endpoint,
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": options["region"],
    }
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "stoker",
        "download",
        "--no-progress",
        "--max-throttled-s",
        "2",
        f"{s3_bucket.url}/data",
        str(out),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr  # it gave up (the timeout guards a hang)
    lines = done.stderr.splitlines()
    warnings = [line for line in lines if line.startswith(WARNING)]
    assert warnings == [
        f"{WARNING} {s3_bucket.name}/data (503 SlowDown or 429) at "
        f"{warnings[0].split(' at ')[1].split(' ')[0]} requests/s; backing off"
    ], done.stderr
    assert (
        "stoker: error: the store is throttling: it answered every request with 503 SlowDown "
        "or 429 for 2 s and served none (max_throttled_s, --max-throttled-s); download of "
        f"{s3_bucket.url}/data stopped: 0 of 30 files listed so far are complete"
    ) in done.stderr
    assert [p for p in out.rglob("*") if p.is_file()] == []  # no partial file left


def test_download_gives_up_within_max_throttled_s(
    s3_bucket: Any, proxy: NetProxy, tmp_path: Path, engine: IOEngine, caplog: Any
) -> None:
    _put_files(s3_bucket, 40)
    _throttle_every_get(proxy, s3_bucket.name)
    store = open_store(
        f"{s3_bucket.url}/data", storage_options=s3_bucket.options(proxy.endpoint), engine=engine
    )
    # It gives up (rather than retrying for ever), saying why: no elapsed time asserted.
    with caplog.at_level(logging.WARNING), pytest.raises(RetriesExhaustedError) as info:
        download(store, tmp_path / "out", config=TransferConfig(max_throttled_s=1.5, workers=8))
    assert "the store is throttling" in str(info.value)
    assert "0 of 40 files listed so far are complete" in str(info.value)
    assert [r.getMessage() for r in caplog.records if WARNING in r.getMessage()] == [
        caplog.records[0].getMessage()
    ]
    assert [p for p in (tmp_path / "out").rglob("*") if p.is_file()] == []


def test_the_first_throttle_is_a_warning_and_only_the_first(
    s3_bucket: Any, proxy: NetProxy, engine: IOEngine, caplog: Any
) -> None:
    """Without -v a user hears that the store throttles (it printed nothing)."""
    _put_files(s3_bucket, 2)
    _throttle_every_get(proxy, s3_bucket.name)
    fast = {"max_attempts": 2, "base_delay_s": 0.001, "throttle_base_delay_s": 0.001}
    store = open_store(
        f"{s3_bucket.url}/data",
        storage_options=s3_bucket.options(proxy.endpoint, retry=fast),
        engine=engine,
    )
    with caplog.at_level(logging.WARNING):
        for key in ("f000", "f001"):
            with pytest.raises(RetriesExhaustedError, match="SlowDown"):
                store.get(key)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1
    assert warned[0].getMessage().startswith(f"{WARNING} {s3_bucket.name}/data (503 SlowDown")
    assert warned[0].getMessage().endswith("requests/s; backing off")


def test_a_rate_limit_slows_a_download_but_never_stops_it(
    s3_bucket: Any, proxy: NetProxy, tmp_path: Path, engine: IOEngine
) -> None:
    _put_files(s3_bucket, 60)
    proxy.set_rate_limit(RateLimitConfig(requests_per_s=25))
    store = open_store(
        f"{s3_bucket.url}/data", storage_options=s3_bucket.options(proxy.endpoint), engine=engine
    )
    report = download(store, tmp_path / "out", config=TransferConfig(max_throttled_s=1.0))
    assert report.files_transferred == 60
    assert report.requests.get("throttles", 0) > 0  # it was throttled, and went on
    assert (tmp_path / "out" / "f059").read_bytes() == b"file 59" * 50
