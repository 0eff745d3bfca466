"""An in-memory Store for unit tests and for datasets built on the fly."""

from __future__ import annotations

import builtins
import hashlib
import threading
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from stoker.core.metrics import Counters
from stoker.core.perprocess import PerProcess
from stoker.errors import ObjectNotFoundError
from stoker.storage.base import Listing, ObjectMeta, PutData, check_range, check_ranges
from stoker.storage.blocking import BlockingForms
from stoker.storage.cache import DiskCache
from stoker.storage.engine import IOEngine, default_engine
from stoker.storage.options import StorageOptions

_LIST_PAGE = 1000


class MemoryStore(BlockingForms):
    """A thread-safe dict of objects that behaves like a bucket.

    ETags are the hex MD5 of the bytes, as S3 gives for single-part uploads.

    Args:
        name: Shown in URLs and error messages (``memory://NAME``).
        engine: I/O engine to run on; the process's shared engine by default.
    """

    def __init__(self, name: str = "memory", *, engine: IOEngine | None = None) -> None:
        self._name = name
        self._objects: dict[str, tuple[bytes, ObjectMeta]] = {}
        self._lock = PerProcess(threading.Lock)  # a forked child's own (objects are copied)
        self._counters = Counters()
        self._engine = engine
        self._options = StorageOptions()

    @property
    def url(self) -> str:
        return f"memory://{self._name}"

    def __len__(self) -> int:
        return len(self._objects)

    @property
    def counters(self) -> Counters:
        return self._counters

    @property
    def engine(self) -> IOEngine:
        # Resolved on each use: in a forked child, the child's own engine.
        return self._engine if self._engine is not None else default_engine()

    @property
    def cache(self) -> DiskCache | None:
        return None

    @property
    def options(self) -> StorageOptions:
        return self._options

    def __repr__(self) -> str:
        return f"MemoryStore({self._name!r}, objects={len(self._objects)})"

    def _lookup(self, path: str) -> tuple[bytes, ObjectMeta]:
        with self._lock.get():
            found = self._objects.get(path)
        if found is None:
            self._counters.add("errors.not_found")
            raise ObjectNotFoundError(f"{self.url}/{path}: no such object")
        return found

    async def get_async(self, path: str) -> memoryview:
        self._counters.add("requests.get")
        data, _ = self._lookup(path)
        self._counters.add("bytes.read", len(data))
        return memoryview(data)

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        return self._get_range(path, start, end)

    def _get_range(self, path: str, start: int, end: int) -> memoryview:
        check_range(path, start, end)
        self._counters.add("requests.get")
        data, _ = self._lookup(path)
        if end > len(data):
            raise ValueError(
                f"{self.url}/{path}: range [{start}, {end}) ends past the object "
                f"({len(data)} bytes)"
            )
        self._counters.add("bytes.read", end - start)
        return memoryview(data)[start:end]

    async def get_ranges_async(
        self, path: str, *, starts: Sequence[int], ends: Sequence[int]
    ) -> builtins.list[memoryview]:
        check_ranges(path, starts, ends)
        return [self._get_range(path, s, e) for s, e in zip(starts, ends, strict=True)]

    async def head_async(self, path: str) -> ObjectMeta:
        self._counters.add("requests.head")
        return self._lookup(path)[1]

    async def list_async(self, prefix: str = "") -> AsyncIterator[builtins.list[ObjectMeta]]:
        with self._lock.get():
            keys = sorted(k for k in self._objects if _under(k, prefix))
            metas = [self._objects[k][1] for k in keys]
        for i in range(0, max(len(metas), 1), _LIST_PAGE):
            self._counters.add("requests.list")
            yield metas[i : i + _LIST_PAGE]

    async def list_dir_async(self, prefix: str = "") -> Listing:
        self._counters.add("requests.list")
        base = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        prefixes: set[str] = set()
        objects: builtins.list[ObjectMeta] = []
        with self._lock.get():
            items = sorted(self._objects.items())
        for key, (_, meta) in items:
            if not key.startswith(base):
                continue
            rest = key[len(base) :]
            if "/" in rest:
                prefixes.add(base + rest.split("/", 1)[0])
            else:
                objects.append(meta)
        return Listing(prefixes=sorted(prefixes), objects=objects)

    async def put_async(self, path: str, data: PutData) -> ObjectMeta:
        if not path or path.endswith("/"):
            raise ValueError(f"{self.url}: invalid object key {path!r}")
        payload = Path(data).read_bytes() if isinstance(data, Path) else bytes(data)
        self._counters.add("requests.put")
        self._counters.add("bytes.written", len(payload))
        meta = ObjectMeta(
            key=path,
            size=len(payload),
            etag=hashlib.md5(payload, usedforsecurity=False).hexdigest(),
            last_modified=datetime.now(UTC),
        )
        with self._lock.get():
            self._objects[path] = (payload, meta)
        return meta

    async def delete_async(self, path: str) -> None:
        self._counters.add("requests.delete")
        with self._lock.get():
            self._objects.pop(path, None)


def _under(key: str, prefix: str) -> bool:
    # Prefixes match whole path segments, as obstore's listing does.
    prefix = prefix.strip("/")
    return not prefix or key == prefix or key.startswith(prefix + "/")


_NAMED: dict[str, MemoryStore] = {}
_NAMED_LOCK = PerProcess(threading.Lock)  # one held at a fork would stay held in the child


def named_memory_store(name: str) -> MemoryStore:
    """Return the process-wide MemoryStore called ``name`` (what ``memory://NAME`` opens)."""
    with _NAMED_LOCK.get():
        store = _NAMED.get(name)
        if store is None:
            store = _NAMED[name] = MemoryStore(name)
        return store
