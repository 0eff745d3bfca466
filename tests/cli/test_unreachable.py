"""An unreachable endpoint (issue 15.8): retried 3 times, raised as EndpointError naming the
endpoint, and every command ends with one line on stderr: no traceback, no asyncio noise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.errors import EndpointError
from stoker.storage import open_store
from stoker.testing.netproxy import NetProxy
from stoker.testing.seaweed import free_ports

_NOISE = (
    "Traceback",
    "Task was destroyed",
    "Event loop is closed",
    "was never awaited",
    "Exception ignored",
    "I/O engine",
)


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stoker", *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


_ENV = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_REGION": "us-east-1"}
_ENV_OPTIONS = {"access_key_id": "a", "secret_access_key": "b"}


def test_a_refused_connection_is_tried_three_times() -> None:
    (port,) = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"
    store = open_store(
        "s3://bucket/p",
        storage_options={**_ENV_OPTIONS, "endpoint_url": endpoint},
    )
    with pytest.raises(EndpointError, match=f"cannot reach {endpoint} for GET s3://bucket/p/k"):
        store.get("k")
    assert store.counters.get("errors.connect") == 3
    assert store.counters.get("retries") == 2


def test_a_proxy_with_nothing_behind_it_is_an_endpoint_error() -> None:
    """The proxy accepts, then closes every connection unanswered (its upstream refuses)."""
    (dead,) = free_ports(1)
    fast = {"base_delay_s": 0.001, "max_delay_s": 0.01}
    with NetProxy("127.0.0.1", dead) as proxy:
        options = {**_ENV_OPTIONS, "endpoint_url": proxy.endpoint, "retry": fast}
        store = open_store("s3://bucket", storage_options=options)
        with pytest.raises(EndpointError, match=f"{proxy.endpoint} closed the connection"):
            list(store.list())


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "s3://bucket/p"],
        ["ls", "-r", "--json", "s3://bucket/p"],
        ["download", "s3://bucket/p", "{tmp}/out"],
        ["upload", "{tmp}/src", "s3://bucket/p"],
        ["show", "s3://bucket/p"],
        ["inspect", "s3://bucket/p"],
        ["verify", "s3://bucket/p"],
        ["bench", "s3://bucket/p"],
        ["doctor", "s3://bucket/p"],
        ["rm", "--yes", "s3://bucket/p"],
        ["pack", "{tmp}/src", "s3://bucket/p"],
    ],
    ids=lambda argv: "-".join(a for a in argv if "/" not in a),
)
def test_every_command_ends_with_one_line_naming_the_endpoint(tmp_path: Path, argv) -> None:
    (port,) = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.jpg").write_bytes(b"not really a jpeg")
    args = [a.format(tmp=tmp_path) for a in argv]
    done = _run(["--endpoint-url", endpoint, *args], _ENV)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"stoker: error: cannot reach {endpoint}"), done.stderr
    assert not any(noise in done.stderr for noise in _NOISE)


def test_other_errors_end_quietly_too(s3_bucket, tmp_path: Path) -> None:
    options = s3_bucket.options()
    env = {
        **_ENV,
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_ENDPOINT_URL": options["endpoint_url"],
    }
    for argv in (
        ["show", "s3://no-such-bucket-h15b/x"],
        ["ls", f"{s3_bucket.url}/missing"],
        ["inspect", f"{s3_bucket.url}/missing"],
        ["download", f"{s3_bucket.url}/missing", str(tmp_path / "out")],
    ):
        done = _run(argv, env)
        assert done.returncode == 1, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (argv, done.stderr)
        assert not any(noise in done.stderr for noise in _NOISE), (argv, done.stderr)
