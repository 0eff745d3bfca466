"""Processes sharing one prefix behind a throttling proxy: the rate-shaping scenarios.

Both run against a local S3 server through a `~stoker.testing.netproxy.NetProxy` that admits
``requests_per_s`` per prefix and answers ``503 SlowDown`` beyond:

* `run_throttled_downloads`: ``objects`` small objects under one prefix, and ``processes``
  concurrent ``stoker download`` commands each copying all of them;
* `run_throttled_ranks`: a packed dataset under one prefix, and ``ranks`` loader processes
  on one node each reading its share of one epoch.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.storage import open_store
from stoker.testing.children import failures, start_children, stderr_tails
from stoker.testing.netproxy import LinkConfig, NetProxy, RateLimitConfig
from stoker.testing.seaweed import SeaweedServer

__all__ = [
    "RanksRun",
    "ThrottledRun",
    "object_bytes",
    "put_objects",
    "run_throttled_downloads",
    "run_throttled_ranks",
]

PREFIX = "dl"


def object_bytes(i: int) -> bytes:
    """The deterministic content of object ``i`` (1 to 2 KB)."""
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * 64)[: 1000 + (i * 37) % 1000]


def put_objects(server: SeaweedServer, bucket: str, objects: int) -> None:
    """Write ``objects`` objects ``PREFIX/obj-NNNNN`` straight to the server."""
    store = open_store(f"s3://{bucket}/{PREFIX}", storage_options=server.storage_options())

    async def put_all() -> None:
        slots = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with slots:
                await store.put_async(f"obj-{i:05d}", object_bytes(i))

        await asyncio.gather(*(one(i) for i in range(objects)))

    store.engine.run(put_all())


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyRun:
    """What the rate-limiting proxy saw of a run.

    Attributes:
        limit_per_s: The proxy's limit per prefix.
        requests: Requests the proxy saw.
        bytes_down: Bytes the proxy sent back (response heads included).
        throttled: Of those, answered 503 SlowDown.
        admitted_per_s: Requests admitted per second, from the prefix's first request at
            the proxy to its last.
        seconds: Wall time from starting the processes to the last one's exit.
    """

    limit_per_s: float
    requests: int
    bytes_down: int
    throttled: int
    admitted_per_s: float
    seconds: float

    @property
    def throttled_share(self) -> float:
        """Throttled requests as a share of all requests."""
        return self.throttled / self.requests if self.requests else 0.0

    def proxy_dict(self) -> dict[str, Any]:
        """The proxy's counts, JSON-ready."""
        return {
            "limit_per_s": self.limit_per_s,
            "requests": self.requests,
            "bytes_down": self.bytes_down,
            "throttled": self.throttled,
            "throttled_share": round(self.throttled_share, 4),
            "admitted_per_s": round(self.admitted_per_s, 1),
            "admitted_vs_limit": round(self.admitted_per_s / self.limit_per_s, 3),
            "seconds": round(self.seconds, 2),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ThrottledRun(ProxyRun):
    """What the proxy (:class:`ProxyRun`) and the downloads saw.

    Attributes:
        processes: Download processes.
        objects: Objects each downloaded.
        files_intact: Files downloaded byte-exact, over all processes.
        exit_codes: Each process's exit status.
        reports: Each process's ``--json`` report.
    """

    processes: int
    objects: int
    files_intact: int
    exit_codes: list[int]
    reports: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the reports' request counters kept, their lists left out)."""
        return {
            "processes": self.processes,
            "objects_each": self.objects,
            **self.proxy_dict(),
            "files_intact": self.files_intact,
            "exit_codes": self.exit_codes,
            "requests_by_process": [r.get("requests", {}) for r in self.reports],
        }


def run_throttled_downloads(
    server: SeaweedServer,
    bucket: str,
    work: Path,
    *,
    objects: int,
    processes: int = 2,
    requests_per_s: float = 150.0,
    extra_args: tuple[str, ...] = (),
) -> ThrottledRun:
    """Run ``processes`` ``stoker download`` commands of the objects `put_objects` wrote.

    Args:
        server: The S3 server holding the bucket.
        bucket: The bucket.
        work: A directory for the downloads.
        objects: How many objects `put_objects` wrote.
        processes: Concurrent downloads, each of every object.
        requests_per_s: The proxy's limit per prefix.
        extra_args: Further `stoker` arguments, before the command.
    """
    limit = RateLimitConfig(requests_per_s=requests_per_s)
    link = LinkConfig(rtt_s=0.0, connect_rtts=0.0)
    with NetProxy("127.0.0.1", server.port, link=link, rate_limit=limit) as proxy:
        env = _client_env(server, proxy.endpoint)
        started = time.monotonic()
        children = [
            _start_download(f"s3://{bucket}/{PREFIX}", work / f"d{n}", env, extra_args)
            for n in range(processes)
        ]
        outputs = [child.communicate() for child in children]
        seconds = time.monotonic() - started
        stats = proxy.stats()
        counts = proxy.prefix_counts().get(f"{bucket}/{PREFIX}")
    reports = [_report(out, err) for out, err in outputs]
    intact = sum(_intact(work / f"d{n}", i) for n in range(processes) for i in range(objects))
    return ThrottledRun(
        processes=processes,
        objects=objects,
        limit_per_s=requests_per_s,
        requests=stats.requests,
        bytes_down=stats.bytes_down,
        throttled=stats.throttled,
        admitted_per_s=counts.admitted_per_s if counts else 0.0,
        seconds=seconds,
        files_intact=intact,
        exit_codes=[child.returncode for child in children],
        reports=reports,
    )


def _client_env(server: SeaweedServer, endpoint: str) -> dict[str, str]:
    """This process's environment with the server's credentials, reached at ``endpoint``."""
    options = server.storage_options(endpoint)
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": options["region"],
    }


def _start_download(
    url: str, into: Path, env: Mapping[str, str], extra_args: tuple[str, ...]
) -> subprocess.Popen[str]:
    """``stoker download URL INTO --json`` in a process of its own (output kept)."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "stoker", *extra_args),
            *("download", url, str(into), "--no-progress", "--json"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _report(out: str, err: str) -> dict[str, Any]:
    """A download's JSON report, or the end of its stderr when it gave none."""
    try:
        report: dict[str, Any] = json.loads(out)
    except ValueError:
        return {"stderr": err[-2000:]}
    return report


def _intact(folder: Path, i: int) -> bool:
    """Whether object ``i`` was downloaded into ``folder`` whole."""
    path = folder / f"obj-{i:05d}"
    return path.is_file() and path.read_bytes() == object_bytes(i)


@dataclass(frozen=True, slots=True, kw_only=True)
class RanksRun(ProxyRun):
    """What the proxy (:class:`ProxyRun`) and the ranks saw.

    Attributes:
        ranks: Loader processes.
        samples: Samples in the dataset.
        delivered: Sample ids each rank delivered, in order.
        exit_codes: Each process's exit status.
        errors: Each failed process's last lines of stderr.
    """

    ranks: int
    samples: int
    delivered: list[list[int]]
    exit_codes: list[int]
    errors: list[str]

    @property
    def exactly_once(self) -> bool:
        """Whether the ranks together delivered every sample exactly once."""
        return sorted(i for ids in self.delivered for i in ids) == list(range(self.samples))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the delivered ids left out)."""
        return {
            "ranks": self.ranks,
            "samples": self.samples,
            **self.proxy_dict(),
            "exactly_once": self.exactly_once,
            "exit_codes": self.exit_codes,
        }


def run_throttled_ranks(
    server: SeaweedServer,
    dataset_url: str,
    work: Path,
    *,
    child: Path,
    samples: int,
    ranks: int = 8,
    requests_per_s: float = 150.0,
    batch_size: int = 20,
    extra_options: Mapping[str, Any] | None = None,
) -> RanksRun:
    """Run ``ranks`` loader processes (``python CHILD SPEC_JSON``), one epoch each, of the
    dataset at ``dataset_url`` (one prefix) through a proxy limiting it to
    ``requests_per_s``. ``child`` writes ``{"ids": [...]}`` to the spec's ``out``;
    ``extra_options`` join the storage options it is handed."""
    limit = RateLimitConfig(requests_per_s=requests_per_s)
    link = LinkConfig(rtt_s=0.0, connect_rtts=0.0)
    with NetProxy("127.0.0.1", server.port, link=link, rate_limit=limit) as proxy:
        specs = [
            {
                "url": dataset_url,
                "options": {**server.storage_options(proxy.endpoint), **(extra_options or {})},
                "rank": rank,
                "world_size": ranks,
                "batch_size": batch_size,
                "out": str(work / f"rank{rank}.json"),
            }
            for rank in range(ranks)
        ]
        started = time.monotonic()
        children = start_children(child, specs)
        errors = stderr_tails(children)
        seconds = time.monotonic() - started
        stats = proxy.stats()
        counts = list(proxy.prefix_counts().values())
    outs = [work / f"rank{rank}.json" for rank in range(ranks)]
    delivered = [json.loads(out.read_text())["ids"] if out.is_file() else [] for out in outs]
    return RanksRun(
        ranks=ranks,
        samples=samples,
        limit_per_s=requests_per_s,
        requests=stats.requests,
        bytes_down=stats.bytes_down,
        throttled=stats.throttled,
        admitted_per_s=max((c.admitted_per_s for c in counts), default=0.0),
        seconds=seconds,
        delivered=delivered,
        exit_codes=[child.returncode for child in children],
        errors=failures(children, errors),
    )
