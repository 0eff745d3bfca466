"""Ctrl-C stops any command at once, even with a request stuck, and exits 130 quietly.

Each command runs as a real process through the fault proxy, which stalls the requests it
is told to (the response's head arrives, its body never does: the client would wait for its
30 s timeout). Once the proxy holds a stalled request, the test sends SIGINT and expects the
process to be gone well before that timeout, with status 130 and one line on stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import stoker
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import FaultConfig, NetProxy

# The stalled request would hold a command for the client's 30 s timeout; an interrupted
# command is given a third of that, so this is a hang guard and not a speed measure.
_EXIT_WITHIN_S = 10.0
# Noise that must never reach the user after Ctrl-C.
_NOISE = ("Traceback", "Task was destroyed", "Event loop is closed", "Aborted", "Exception")


@pytest.fixture
def dataset(s3_bucket, tmp_path: Path) -> dict[str, str]:
    write_image_folder(tmp_path / "imgs", files=12, classes=2, width=32, height=24)
    stoker.pack(str(tmp_path / "imgs"), f"{s3_bucket.url}/ds", storage_options=s3_bucket.options())
    raw = s3_bucket.store("raw")
    for i in range(3):
        raw.put(f"f{i}", b"x" * 10_000)
    options = s3_bucket.options()
    return {
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
        "TMP": str(tmp_path),
        "BUCKET": s3_bucket.url,
    }


# (requests to stall: a substring of the request target, or None for every request; argv)
COMMANDS = [
    (None, ["ls", "-r", "{BUCKET}/raw"]),
    (None, ["download", "{BUCKET}/raw", "{TMP}/dl"]),
    ("raw/f1", ["download", "{BUCKET}/raw", "{TMP}/dl"]),
    (None, ["upload", "{TMP}/imgs", "{BUCKET}/up"]),
    (None, ["show", "{BUCKET}/ds"]),
    ("shard", ["show", "{BUCKET}/ds"]),
    ("shard", ["bench", "{BUCKET}/ds"]),
    ("shard", ["verify", "{BUCKET}/ds"]),
    ("shard", ["doctor", "{BUCKET}/ds"]),
    (".tar", ["pack", "{TMP}/imgs", "{BUCKET}/packed"]),
]


@pytest.mark.parametrize(("stall", "argv"), COMMANDS, ids=[f"{c[1][0]}-{c[0]}" for c in COMMANDS])
def test_ctrl_c_stops_a_command_with_a_request_stuck(
    s3_server, dataset: dict[str, str], stall: str | None, argv: list[str]
) -> None:
    env = {**os.environ, **{k: v for k, v in dataset.items() if k.startswith("AWS_")}}
    args = [a.format(**dataset) for a in argv]
    faults = FaultConfig(fault_rate=1.0, kinds=("stall",), fault_paths=stall)
    with NetProxy("127.0.0.1", s3_server.port, faults=faults) as proxy:
        child = subprocess.Popen(
            [sys.executable, "-m", "stoker", "--endpoint-url", proxy.endpoint, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # Wait (event, not time) for the proxy to hold a stalled request.
            while proxy.stats().faults["stall"] == 0 and child.poll() is None:
                time.sleep(0.05)
            assert child.poll() is None, f"{args} ended before a request stalled"
            child.send_signal(signal.SIGINT)
            _, stderr = child.communicate(timeout=_EXIT_WITHIN_S)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
    assert child.returncode == 130, stderr
    assert stderr.strip() == "stoker: interrupted", stderr
    assert not any(noise in stderr for noise in _NOISE)
