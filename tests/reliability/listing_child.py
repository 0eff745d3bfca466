"""Run by test_million_listing.py: consume a simulated listing of a million objects and report
how much the process's peak memory (RSS) grew meanwhile.

Usage: python listing_child.py MODE OBJECTS DST, MODE being

* ``list``: ``Store.list`` of an S3 store whose listing is simulated: obstore's ``list`` is
  replaced by a generator of pages of 1,000 entries (what S3's ListObjectsV2 would return),
  so the real ObstoreStore paging and retry wrapper run on it.
* ``ls``: ``stoker ls -r --json`` on the same simulated store, its output going to a sink
  that counts lines (slow: the CLI formats a million JSON lines).
* ``download``: ``download`` from a Store that makes its listing up page by page, with an
  include pattern that selects one object in 10,000 (writing a million files would take
  minutes); every listed object still passes through the listing stage.

Prints one JSON object: objects seen, RSS growth in MB, seconds.
"""

from __future__ import annotations

import builtins
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import obstore

from stoker.core.metrics import Counters
from stoker.storage.base import Listing, ObjectMeta, PutData
from stoker.storage.cache import DiskCache
from stoker.storage.engine import IOEngine, default_engine
from stoker.storage.options import StorageOptions

WHEN = datetime(2024, 1, 1, tzinfo=UTC)
PAGE = 1000


def _key(i: int) -> str:
    return f"part{i // 1000:04d}/obj{i:07d}.bin"


class _FakeListStream:
    """What ``obstore.list(...)`` returns, for a bucket of ``objects`` keys."""

    def __init__(self, objects: int, offset: str | None, chunk_size: int) -> None:
        self.objects, self.chunk = objects, chunk_size
        self.next = 0 if offset is None else int(offset[-11:-4]) + 1

    def __aiter__(self) -> _FakeListStream:
        return self

    async def __anext__(self) -> list[dict[str, Any]]:
        if self.next >= self.objects:
            raise StopAsyncIteration
        end = min(self.objects, self.next + self.chunk)
        page = [
            {
                "path": _key(i),
                "size": 1000 + i % 1000,
                "e_tag": '"0123456789abcdef0123456789abcdef"',
                "last_modified": WHEN,
                "version": None,
            }
            for i in range(self.next, end)
        ]
        self.next = end
        return page


class _Counter:
    """A stdout that counts lines and keeps nothing."""

    def __init__(self) -> None:
        self.lines = 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        return len(text)

    def flush(self) -> None:
        pass


class _GeneratedBucket:
    """A Store whose listing of ``objects`` keys is generated page by page."""

    def __init__(self, objects: int) -> None:
        self.objects = objects
        self._counters = Counters()

    @property
    def url(self) -> str:
        return "memory://generated"

    @property
    def counters(self) -> Counters:
        return self._counters

    @property
    def engine(self) -> IOEngine:
        return default_engine()

    @property
    def cache(self) -> DiskCache | None:
        return None

    @property
    def options(self) -> StorageOptions:
        return StorageOptions()

    async def list_async(self, prefix: str = "") -> AsyncIterator[builtins.list[ObjectMeta]]:
        for start in range(0, self.objects, PAGE):
            stop = min(self.objects, start + PAGE)
            yield [ObjectMeta(_key(i), 8, None, WHEN) for i in range(start, stop)]

    async def get_async(self, path: str) -> memoryview:
        return memoryview(path[-8:].encode())

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        raise NotImplementedError

    def get(self, path: str) -> memoryview:
        raise NotImplementedError

    def get_range(self, path: str, *, start: int, end: int) -> memoryview:
        raise NotImplementedError

    def get_ranges(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        raise NotImplementedError

    def head(self, path: str) -> ObjectMeta:
        raise NotImplementedError

    def list_dir(self, prefix: str = "") -> Listing:
        raise NotImplementedError

    def put(self, path: str, data: PutData) -> ObjectMeta:
        raise NotImplementedError

    def delete(self, path: str) -> None:
        raise NotImplementedError

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        raise NotImplementedError

    async def get_ranges_async(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        raise NotImplementedError

    async def head_async(self, path: str) -> ObjectMeta:
        raise NotImplementedError

    async def list_dir_async(self, prefix: str = "") -> Listing:
        raise NotImplementedError

    async def put_async(self, path: str, data: PutData) -> ObjectMeta:
        raise NotImplementedError

    async def delete_async(self, path: str) -> None:
        raise NotImplementedError


def _peak_mb() -> float:
    # VmHWM, the peak RSS of this process's address space. Not getrusage's ru_maxrss: it
    # starts at the parent's RSS (execve keeps the high-water mark), which would hide growth.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise SystemExit("no VmHWM in /proc/self/status (this test needs Linux)")


def _simulate_listing(objects: int) -> None:
    def fake_list(store: Any, prefix: str | None = None, **kwargs: Any) -> _FakeListStream:
        return _FakeListStream(objects, kwargs.get("offset"), kwargs.get("chunk_size", 50))

    obstore.list = fake_list  # type: ignore[assignment]  # the simulated bucket


def run_list(objects: int) -> int:
    from stoker.storage import open_store

    _simulate_listing(objects)
    return sum(1 for _ in open_store("s3://simulated").list(""))


def run_ls(objects: int) -> int:
    from stoker.cli.main import cli

    _simulate_listing(objects)
    sink, stdout = _Counter(), sys.stdout
    sys.stdout = sink  # type: ignore[assignment]
    try:
        cli.main(["ls", "-r", "--json", "s3://simulated"], standalone_mode=False)
    finally:
        sys.stdout = stdout
    return sink.lines


def run_download(objects: int, dst: str) -> int:
    from stoker.storage.transfer import TransferConfig, download

    config = TransferConfig(include=("*/obj???0000.bin",), workers=8)
    report = download(_GeneratedBucket(objects), dst, config=config)
    if report.files_transferred != -(-objects // 10_000):
        raise SystemExit(f"downloaded {report.files_transferred} files")
    return objects


def main() -> None:
    mode, objects, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    before = _peak_mb()
    started = time.perf_counter()
    if mode == "download":
        seen = run_download(objects, dst)
    else:
        seen = run_ls(objects) if mode == "ls" else run_list(objects)
    growth = _peak_mb() - before
    print(
        json.dumps(
            {"objects": seen, "rss_growth_mb": growth, "seconds": time.perf_counter() - started}
        )
    )


if __name__ == "__main__":
    main()
