"""The test servers' ports can be pinned: SeaweedServer(port=...), and for the test session
STOKER_TEST_S3_PORT and STOKER_TEST_PROXY_PORT (read by tests/conftest.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.storage import open_store
from stoker.testing.netproxy import NetProxy
from stoker.testing.seaweed import SeaweedServer, ServerError, free_ports

ROOT = Path(__file__).resolve().parents[2]


def test_seaweed_serves_s3_on_the_port_given() -> None:
    (port,) = free_ports(1)
    with SeaweedServer(install=True, port=port) as server:
        assert server.port == port
        assert server.endpoint == f"http://127.0.0.1:{port}"
        server.create_bucket("pinned")
        store = open_store("s3://pinned", storage_options=server.storage_options())
        store.put("object", b"here")
        assert bytes(store.get("object")) == b"here"


def test_seaweed_names_a_port_it_cannot_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = SeaweedServer(install=True, port=port)
        with pytest.raises(ServerError, match=f"cannot serve S3 on 127.0.0.1:{port}"):
            server.start()
        assert server.pid is None  # nothing started, nothing left behind
    with pytest.raises(ValueError, match=r"port must be in 1\.\.65535, got 70000"):
        SeaweedServer(port=70000)


@pytest.mark.skipif(
    not os.environ.get("STOKER_TEST_S3_PORT"), reason="runs with STOKER_TEST_S3_PORT set"
)
def test_session_servers_listen_where_the_variables_say(
    s3_server: SeaweedServer, proxy: NetProxy
) -> None:
    assert s3_server.port == int(os.environ["STOKER_TEST_S3_PORT"])
    if os.environ.get("STOKER_TEST_PROXY_PORT"):
        assert proxy.port == int(os.environ["STOKER_TEST_PROXY_PORT"])


def test_a_test_session_takes_its_ports_from_the_environment() -> None:
    s3_port, proxy_port = free_ports(2)
    env = {
        **os.environ,
        "STOKER_TEST_S3_PORT": str(s3_port),
        "STOKER_TEST_PROXY_PORT": str(proxy_port),
    }
    name = (
        f"{Path(__file__).relative_to(ROOT)}::test_session_servers_listen_where_the_variables_say"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", name, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "pytest", name, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env={**env, "STOKER_TEST_S3_PORT": "http"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0
    assert "STOKER_TEST_S3_PORT='http': give a TCP port in 1..65535" in bad.stdout
