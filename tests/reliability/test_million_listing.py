"""Listing a bucket of a million objects keeps memory bounded.

The listing is simulated (see listing_child.py): a real bucket of a million objects takes
minutes to fill. Each run is a child process, so that its peak RSS, which includes obstore's
native memory, measures that run alone. A million ObjectMeta held at once would take about
250 MB; streamed, the peak grows by a few MB. ``stoker ls -r`` is a loop over ``Store.list``;
run at a million objects it takes 20 s here (formatting the lines), so benchmarks/reliability.py
measures it instead of this test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("listing_child.py")
OBJECTS = 1_000_000
BOUND_MB = 100


@pytest.mark.parametrize("mode", ["list", "download"])
def test_a_million_object_listing_streams(mode: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        # Never contacted: the listing is simulated. They only let the S3 store be built.
        "AWS_ACCESS_KEY_ID": "simulated",
        "AWS_SECRET_ACCESS_KEY": "simulated",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_REGION": "us-east-1",
    }
    child = subprocess.run(
        [sys.executable, str(CHILD), mode, str(OBJECTS), str(tmp_path / "dst")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["objects"] == OBJECTS
    assert result["rss_growth_mb"] < BOUND_MB, result
