"""A start-up storm: many processes opening one dataset at once behind a throttling proxy.

`run_startup_storm` starts ``processes`` loader processes (ranks of one node); once all have
imported stoker, they are let go at once (as ranks leave a barrier) and each opens a packed
dataset and takes its first batch, through a
`~stoker.testing.netproxy.NetProxy` that admits ``requests_per_s`` per prefix and answers
``503 SlowDown`` beyond. The proxy records every request, so what the start cost is counted
at the server's side: the requests for the data (shards, or a folder's images) and the rest
(the index, HEADs, listings), throttled ones included.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.format.spec import ARRAYS_NAME, MANIFEST_NAME
from stoker.testing.children import failures, start_children, stderr_tails
from stoker.testing.netproxy import LinkConfig, NetProxy, RateLimitConfig
from stoker.testing.seaweed import SeaweedServer

__all__ = ["StormRun", "run_startup_storm"]

_INDEX = (MANIFEST_NAME, ARRAYS_NAME)


@dataclass(frozen=True, slots=True, kw_only=True)
class StormRun:
    """What the proxy and the processes of one storm saw.

    Attributes:
        processes: Loader processes started at once.
        limit_per_s: The proxy's limit per prefix.
        seen: Each request the proxy saw: (method, target, answer), in order.
        exit_codes: Each process's exit status.
        errors: Each failed process's last lines of stderr.
        reports: Each process's report (first batch ids, seconds from the launch to stoker
            imported, from the go to the first batch, counters); empty for a process that
            failed.
    """

    processes: int
    limit_per_s: float
    seen: list[tuple[str, str, str]]
    exit_codes: list[int]
    errors: list[str]
    reports: list[dict[str, Any]]

    @property
    def failures(self) -> int:
        """Processes that exited non-zero or delivered no batch."""
        return sum(
            code != 0 or not report
            for code, report in zip(self.exit_codes, self.reports, strict=True)
        )

    def count(self, method: str, name: str, *, answer: str | None = None) -> int:
        """Requests of ``method`` for an object whose key ends with ``/name`` (with
        ``answer``, only those answered so)."""
        return sum(
            m == method and t.split("?")[0].endswith(f"/{name}") and answer in (None, a)
            for m, t, a in self.seen
        )

    @property
    def data_requests(self) -> int:
        """GETs of the data (shards, or a folder's images; throttled ones included)."""
        return sum(m == "GET" and _is_data(t) for m, t, _ in self.seen)

    @property
    def data_heads(self) -> int:
        """HEADs of the data (the reader checks each shard's size with one before reading
        it; throttled ones included)."""
        return sum(m == "HEAD" and _is_data(t) for m, t, _ in self.seen)

    @property
    def other_requests(self) -> int:
        """Every request not for the data: the index, listings (throttled ones included)."""
        return len(self.seen) - self.data_requests - self.data_heads

    def lists(self, *, answer: str | None = None) -> int:
        """LIST requests (ListObjectsV2; with ``answer``, only those answered so)."""
        return sum("list-type=" in target and answer in (None, a) for _, target, a in self.seen)

    @property
    def throttled(self) -> int:
        """Requests answered ``503 SlowDown``."""
        return sum(answer == "503" for _, _, answer in self.seen)

    @property
    def max_first_batch_s(self) -> float:
        """The longest time from the go to a process's first batch (inf: one failed)."""
        times = [r.get("first_batch_s", float("inf")) for r in self.reports]
        return max(times) if times and self.failures == 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the requests counted, not listed)."""
        return {
            "processes": self.processes,
            "limit_per_s": self.limit_per_s,
            "failures": self.failures,
            "requests": len(self.seen),
            "throttled": self.throttled,
            "data_requests": self.data_requests,
            "other_requests": self.other_requests,
            "other_per_process": round(self.other_requests / self.processes, 3),
            "data_heads": self.data_heads,
            "data_heads_per_process": round(self.data_heads / self.processes, 3),
            "index_json_gets": self.count("GET", MANIFEST_NAME, answer="forwarded"),
            "index_bin_gets": self.count("GET", ARRAYS_NAME, answer="forwarded"),
            "index_heads": self.count("HEAD", MANIFEST_NAME),
            "lists": self.lists(),
            "max_first_batch_s": round(self.max_first_batch_s, 3),
            "max_imported_s": round(max(r.get("imported_s", 0.0) for r in self.reports), 3),
            "exit_codes": self.exit_codes,
        }


def _is_data(target: str) -> bool:
    path, _, query = target.partition("?")
    return "list-type=" not in query and path.rsplit("/", 1)[-1] not in _INDEX


def _let_go(
    work: Path, specs: list[dict[str, Any]], children: list[subprocess.Popen[str]], deadline: float
) -> None:
    """Wait until every child is ready (or has ended, or the deadline passed), then create
    the go file at once (written aside and renamed, so it is read whole)."""
    while time.monotonic() < deadline and not all(
        Path(spec["ready"]).is_file() or child.poll() is not None
        for spec, child in zip(specs, children, strict=True)
    ):
        time.sleep(0.005)
    aside = work / "go.tmp"
    aside.write_text(repr(time.time()))
    aside.rename(work / "go")


def run_startup_storm(
    server: SeaweedServer,
    dataset_url: str,
    work: Path,
    *,
    child: Path,
    processes: int = 16,
    requests_per_s: float = 100.0,
    batch_size: int = 8,
    cache_dir: Path | None = None,
    timeout_s: float = 300.0,
) -> StormRun:
    """Start ``processes`` copies of ``python CHILD SPEC_JSON``, ranks 0.. of as many; once
    each has created its spec's ``ready`` file, create the ``go`` file (holding the time),
    and each opens ``dataset_url`` through a proxy limiting its prefix to ``requests_per_s``
    and takes one batch; ``cache_dir`` is the node's disk cache (None: none). ``child``
    writes its report to the spec's ``out``. A process still running after ``timeout_s``
    is killed (and counted as a failure)."""
    limit = RateLimitConfig(requests_per_s=requests_per_s)
    link = LinkConfig(rtt_s=0.0, connect_rtts=0.0)
    work.mkdir(parents=True, exist_ok=True)
    with NetProxy(
        "127.0.0.1", server.port, link=link, rate_limit=limit, record_requests=True
    ) as proxy:
        launched_at = time.time()
        specs = [
            {
                "url": dataset_url,
                "options": server.storage_options(proxy.endpoint),
                "rank": rank,
                "world_size": processes,
                "batch_size": batch_size,
                "cache_dir": None if cache_dir is None else str(cache_dir),
                "launched_at": launched_at,
                "ready": str(work / f"rank{rank}.ready"),
                "go": str(work / "go"),
                "out": str(work / f"rank{rank}.json"),
            }
            for rank in range(processes)
        ]
        children = start_children(child, specs)
        deadline = time.monotonic() + timeout_s
        _let_go(work, specs, children, deadline)
        errors = stderr_tails(children, deadline=deadline)
        seen = proxy.requests_seen()
    outs = [work / f"rank{rank}.json" for rank in range(processes)]
    reports = [json.loads(out.read_text()) if out.is_file() else {} for out in outs]
    return StormRun(
        processes=processes,
        limit_per_s=requests_per_s,
        seen=seen,
        exit_codes=[process.returncode for process in children],
        errors=failures(children, errors),
        reports=reports,
    )
