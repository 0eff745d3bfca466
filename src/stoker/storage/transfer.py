"""Parallel download and upload between a store and a local directory, with resume.

Both directions keep ``workers`` files in flight on the store's I/O engine; large files move
as concurrent parts. A file is written under a temporary name beside its destination and
renamed only once complete and verified, so an interrupted run never leaves a partial file
under a final name, and a rerun skips what is already there:

* download skips a local file whose size matches and whose modification time equals the
  object's (stoker sets it after each download) or whose MD5 matches the object's ETag;
* upload skips an object whose size matches and whose ETag matches the local file's MD5.

Failed objects do not stop the others; the run ends with :class:`~stoker.errors.TransferError`
listing each of them. A full disk does stop a download: no new file is started, the partial
files are removed, and the error says so.

Downloads start while the bucket is still being listed, and the listing runs at most
``list_ahead`` objects ahead of them, so memory stays bounded however many objects there are.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import fnmatch
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from stoker.errors import StokerError, TransferError
from stoker.storage.base import ObjectMeta, Store
from stoker.storage.checksum import etag_matches, md5_file, md5_hex
from stoker.storage.engine import IOEngine

PARTIAL_SUFFIX = ".stoker-partial"
DEFAULT_WORKERS = 64
DEFAULT_LIST_AHEAD = 10_000
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class ProgressSink(Protocol):
    """Receives progress from a transfer (a progress bar, a logger, a test)."""

    def start(self, *, files: int, total_bytes: int) -> None:
        """Called once, when the work is known: before any `advance`, except for a download
        whose listing is longer than ``list_ahead``, where it comes when the listing ends
        (the advances before it are then reported together, just after it)."""

    def advance(self, *, files: int, nbytes: int) -> None:
        """Called as files finish (or are skipped)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferConfig:
    """How a download or upload runs.

    Attributes:
        workers: Files in flight at once. The default hides a 20 ms round trip on small
            files; large files also move several parts at once.
        include: Glob patterns (on the key relative to the source root); a file must match
            one of them if any are given.
        exclude: Glob patterns; a file that matches one is left out.
        resume: Skip files that are already complete at the destination.
        verify: Check each downloaded file against the object's ETag where it is an MD5
            (single-part uploads). A multipart ETag is not checked: it depends on a part
            size the listing does not say, and a wrong guess would fail a good file.
        list_ahead: Most objects a download lists ahead of the files it has started; bounds
            its memory on buckets of millions of objects.
    """

    workers: int = DEFAULT_WORKERS
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    resume: bool = True
    verify: bool = True
    list_ahead: int = DEFAULT_LIST_AHEAD

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.list_ahead < 1:
            raise ValueError(f"list_ahead must be >= 1, got {self.list_ahead}")

    def selects(self, key: str) -> bool:
        """Whether ``key`` passes the include and exclude patterns."""
        if self.include and not any(fnmatch.fnmatchcase(key, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(key, p) for p in self.exclude)


@dataclass(slots=True, kw_only=True)
class TransferReport:
    """What a download or upload did.

    Attributes:
        direction: ``"download"`` or ``"upload"``.
        source: Source URL or directory.
        destination: Destination URL or directory.
        files_total: Files selected for transfer (skipped ones included).
        files_transferred: Files moved in this run.
        files_skipped: Files already complete at the destination.
        bytes_transferred: Bytes moved in this run.
        seconds: Wall time of the run, listing included.
        failures: ``(key, reason)`` for every file that failed.
        requests: The store's request counters after the run.
    """

    direction: Literal["download", "upload"]
    source: str
    destination: str
    files_total: int = 0
    files_transferred: int = 0
    files_skipped: int = 0
    bytes_transferred: int = 0
    seconds: float = 0.0
    failures: builtins.list[tuple[str, str]] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)

    @property
    def files_per_s(self) -> float:
        """Transferred files per second of wall time."""
        return self.files_transferred / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        """Transferred bytes per second of wall time."""
        return self.bytes_transferred / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "direction": self.direction,
            "source": self.source,
            "destination": self.destination,
            "files_total": self.files_total,
            "files_transferred": self.files_transferred,
            "files_skipped": self.files_skipped,
            "files_failed": len(self.failures),
            "bytes_transferred": self.bytes_transferred,
            "seconds": round(self.seconds, 3),
            "files_per_s": round(self.files_per_s, 1),
            "bytes_per_s": round(self.bytes_per_s, 1),
            "failures": [{"key": k, "error": e} for k, e in self.failures],
            "requests": self.requests,
        }


class _NoProgress:
    def start(self, *, files: int, total_bytes: int) -> None:
        pass

    def advance(self, *, files: int, nbytes: int) -> None:
        pass


def safe_local_path(root: Path, key: str) -> Path:
    """Map an object key to a path under ``root``, refusing keys that would escape it.

    Raises:
        ValueError: The key is absolute, has ``.``, ``..`` or empty segments, or contains a
            NUL byte.
    """
    parts = key.split("/")
    if (
        not key
        or "\x00" in key
        or any(p in ("", ".", "..") for p in parts)
        or (os.sep != "/" and os.sep in key)
    ):
        raise ValueError(f"object key {key!r} cannot be a local file name (unsafe path)")
    return root.joinpath(*parts)


def _partial_path(path: Path) -> Path:
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}")


def _local_is_current(path: Path, meta: ObjectMeta, *, part_size_bytes: int) -> bool:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return False
    if stat.st_size != meta.size:
        return False
    if meta.last_modified is not None and int(stat.st_mtime) == int(meta.last_modified.timestamp()):
        return True
    return bool(etag_matches(path, meta.etag, part_size_bytes=part_size_bytes))


def _part_size(store: Store) -> tuple[int, int]:
    return store.options.part_size_bytes, store.options.multipart_threshold_bytes


async def _run_pool(items: Iterable[Any], workers: int, job: Any) -> None:
    iterator: Iterator[Any] = iter(items)

    async def worker() -> None:
        for item in iterator:
            await job(item)

    await asyncio.gather(*(worker() for _ in range(workers)))


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, StokerError | OSError | ValueError):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


class _LateProgress:
    """Holds advances back until `start` has been called, then passes everything on."""

    def __init__(self, sink: ProgressSink) -> None:
        self._sink = sink
        self._started = False
        self._files = self._bytes = 0

    def start(self, *, files: int, total_bytes: int) -> None:
        self._sink.start(files=files, total_bytes=total_bytes)
        self._started = True
        if self._files:
            self._sink.advance(files=self._files, nbytes=self._bytes)

    def advance(self, *, files: int, nbytes: int) -> None:
        if self._started:
            self._sink.advance(files=files, nbytes=nbytes)
        else:
            self._files += files
            self._bytes += nbytes


class _DiskFullError(OSError):
    """The destination filled up: the download stops."""


async def _selected(store: Store, config: TransferConfig) -> AsyncIterator[ObjectMeta]:
    pages: AsyncIterator[builtins.list[ObjectMeta]] = store.list_async("")
    async for page in pages:
        for meta in page:
            if not meta.key.endswith("/") and config.selects(meta.key):
                yield meta


async def _download(
    store: Store,
    dst: Path,
    config: TransferConfig,
    progress: ProgressSink,
    report: TransferReport,
) -> None:
    part_size, threshold = _part_size(store)
    sink = _LateProgress(progress)
    listing = _selected(store, config)
    # Up to list_ahead objects are listed first: a listing that ends there is known exactly
    # before any download starts; a longer one is streamed through a bounded queue.
    first: builtins.list[ObjectMeta] = []
    async for meta in listing:
        first.append(meta)
        if len(first) >= config.list_ahead:
            break
    else:
        sink.start(files=len(first), total_bytes=sum(m.size for m in first))
    report.files_total = len(first)
    listed_all = len(first) < config.list_ahead
    queue: asyncio.Queue[ObjectMeta | None] = asyncio.Queue(config.list_ahead)
    full: builtins.list[BaseException] = []  # the disk-full error that stopped the run
    list_error: builtins.list[BaseException] = []

    async def produce() -> None:
        nonlocal listed_all
        try:
            total_bytes = sum(m.size for m in first)
            for meta in first:
                await queue.put(meta)
            if not listed_all:
                first.clear()
                async for meta in listing:
                    if full:
                        break
                    report.files_total += 1
                    total_bytes += meta.size
                    await queue.put(meta)
                else:
                    listed_all = True
                    sink.start(files=report.files_total, total_bytes=total_bytes)
        except Exception as exc:  # raised once the files already listed are done
            list_error.append(exc)
        finally:
            for _ in range(config.workers):
                await queue.put(None)

    async def fetch(meta: ObjectMeta) -> None:
        partial: Path | None = None
        try:
            target = safe_local_path(dst, meta.key)
            if config.resume and await _local_is_current_async(target, meta, part_size):
                report.files_skipped += 1
                sink.advance(files=1, nbytes=meta.size)
                return
            partial = _partial_path(target)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                # Only a single-part ETag (an MD5) is checked: a multipart one depends on a
                # part size that the uploader chose and the listing does not say.
                check = config.verify and meta.etag is not None and len(meta.etag) == 32
                if meta.size >= threshold:
                    await _download_parts(store, meta, partial, part_size)
                    if check:
                        await _check_file(meta, partial)
                else:
                    data = await store.get_async(meta.key)
                    if check:
                        _check_md5(meta, data)
                    _write_file(partial, data)
                if meta.last_modified is not None:
                    stamp = meta.last_modified.timestamp()
                    os.utime(partial, (stamp, stamp))
                partial.replace(target)
            except OSError as exc:
                if exc.errno in _DISK_FULL:
                    raise _DiskFullError(
                        f"no space left on device writing {target} ({meta.size} bytes)"
                    ) from exc
                raise
            partial = None
            report.files_transferred += 1
            report.bytes_transferred += meta.size
            sink.advance(files=1, nbytes=meta.size)
        except Exception as exc:  # one failed object must not stop the others
            report.failures.append((meta.key, _error_text(exc)))
            sink.advance(files=1, nbytes=0)
            if isinstance(exc, _DiskFullError) and not full:
                full.append(exc)
        finally:
            if partial is not None:  # never leave a partial file behind
                _remove_quietly(partial)

    async def worker() -> None:
        while (meta := await queue.get()) is not None:
            if not full:
                await fetch(meta)

    await asyncio.gather(produce(), *(worker() for _ in range(config.workers)))
    if full:
        done = report.files_transferred + report.files_skipped
        of = f"{report.files_total}" if listed_all else f"at least {report.files_total}"
        raise TransferError(
            f"download stopped: {full[0]}; {done} of {of} files are complete in {dst} and no "
            f"partial file is left; free some space, then rerun to resume",
            sorted(report.failures),
        ) from full[0].__cause__
    if list_error:
        raise list_error[0]


async def _local_is_current_async(path: Path, meta: ObjectMeta, part_size: int) -> bool:
    if meta.size < 4 * 1024 * 1024:
        return _local_is_current(path, meta, part_size_bytes=part_size)
    # A large file may need its MD5 computed: off the I/O loop.
    return await asyncio.to_thread(_local_is_current, path, meta, part_size_bytes=part_size)


def _write_file(path: Path, data: memoryview) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _check_md5(meta: ObjectMeta, data: memoryview) -> None:
    if len(data) != meta.size:
        raise ValueError(f"size mismatch: got {len(data)} bytes, listing says {meta.size}")
    if meta.etag and md5_hex(data) != meta.etag.lower():
        raise ValueError(f"checksum mismatch: MD5 of the bytes received != ETag {meta.etag}")


async def _check_file(meta: ObjectMeta, path: Path) -> None:
    digest = await asyncio.to_thread(md5_file, path)
    if meta.etag and digest != meta.etag.lower():
        raise ValueError(f"checksum mismatch: MD5 of the bytes received != ETag {meta.etag}")


async def _download_parts(store: Store, meta: ObjectMeta, partial: Path, part_size: int) -> None:
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _reserve(fd, meta.size)
        failed: builtins.list[BaseException] = []

        async def part(start: int) -> None:
            if failed:  # one part failed: the file fails, start no more parts
                return
            end = min(start + part_size, meta.size)
            try:
                data = await store.get_range_async(meta.key, start=start, end=end)
                await asyncio.to_thread(_pwrite_all, fd, data, start)
            except Exception as exc:
                failed.append(exc)

        # Every part is awaited before the descriptor is closed, even after a failure: a
        # write still running could otherwise land in a file that reused the number.
        await asyncio.gather(*(part(s) for s in range(0, meta.size, part_size)))
        if failed:
            raise failed[0]
    finally:
        os.close(fd)


def _reserve(fd: int, size: int) -> None:
    """Give the file its size, allocating the blocks where the file system can (so that a
    full disk fails here, before any byte is downloaded)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise
        os.ftruncate(fd, size)  # no fallocate on this file system: a sparse file


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def download(
    store: Store,
    dst_dir: str | os.PathLike[str],
    *,
    config: TransferConfig | None = None,
    progress: ProgressSink | None = None,
    engine: IOEngine | None = None,
) -> TransferReport:
    """Download every object under the store's root into ``dst_dir``, in parallel.

    Keys become relative paths under ``dst_dir``; keys that would escape it (``..``,
    absolute) fail rather than write elsewhere.

    Args:
        store: Source; its root (bucket and prefix) maps to ``dst_dir``.
        dst_dir: Local directory, created if missing.
        config: Workers, filters, resume and verification.
        progress: Receives progress updates.
        engine: Unused, kept so that existing calls still work: the run goes on
            ``store.engine``, the one engine the store's requests may run on.

    Returns:
        What was transferred, skipped and how fast.

    Raises:
        TransferError: Some objects failed; the others were downloaded. ``failures`` names
            each with its reason. Or the disk filled up: the download stopped, saying so,
            with no partial file left behind.
        FileNotFoundError: The bucket does not exist.
    """
    config = config or TransferConfig()
    dst = Path(dst_dir).expanduser().resolve()
    dst.mkdir(parents=True, exist_ok=True)
    report = TransferReport(direction="download", source=store.url, destination=str(dst))
    started = time.perf_counter()
    store.engine.run(_download(store, dst, config, progress or _NoProgress(), report))
    report.seconds = time.perf_counter() - started
    report.requests = store.counters.snapshot()
    _raise_failures(report)
    return report


def _raise_failures(report: TransferReport) -> None:
    if report.failures:
        report.failures.sort()
        shown = "\n".join(f"  {key}: {reason}" for key, reason in report.failures[:20])
        more = len(report.failures) - 20
        tail = f"\n  ... and {more} more" if more > 0 else ""
        raise TransferError(
            f"{len(report.failures)} of {report.files_total} files failed to "
            f"{report.direction}:\n{shown}{tail}",
            report.failures,
        )


def _walk(src: Path, config: TransferConfig) -> builtins.list[tuple[str, Path, int]]:
    found = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(PARTIAL_SUFFIX):
                continue
            path = Path(dirpath, name)
            key = path.relative_to(src).as_posix()
            if config.selects(key):
                found.append((key, path, path.stat().st_size))
    return found


async def _upload(
    store: Store,
    files: builtins.list[tuple[str, Path, int]],
    config: TransferConfig,
    progress: ProgressSink,
    report: TransferReport,
) -> None:
    existing: dict[str, ObjectMeta] = {}
    if config.resume:
        async for page in store.list_async(""):
            existing.update((m.key, m) for m in page)
    progress.start(files=len(files), total_bytes=sum(size for _, _, size in files))
    part_size, threshold = _part_size(store)

    async def send(item: tuple[str, Path, int]) -> None:
        key, path, size = item
        try:
            remote = existing.get(key)
            if (
                remote is not None
                and remote.size == size
                and etag_matches(path, remote.etag, part_size_bytes=part_size)
            ):
                report.files_skipped += 1
                progress.advance(files=1, nbytes=size)
                return
            if size >= threshold:
                meta = await store.put_async(key, path)
            else:
                data = path.read_bytes()
                meta = await store.put_async(key, data)
                plain_etag = meta.etag is not None and len(meta.etag) == 32
                if config.verify and plain_etag and meta.etag != md5_hex(data):
                    raise ValueError(f"checksum mismatch: store reports ETag {meta.etag}")
            report.files_transferred += 1
            report.bytes_transferred += size
            progress.advance(files=1, nbytes=size)
        except Exception as exc:  # one failed file must not stop the others
            report.failures.append((key, _error_text(exc)))
            progress.advance(files=1, nbytes=0)

    await _run_pool(files, config.workers, send)


def upload(
    src_dir: str | os.PathLike[str],
    store: Store,
    *,
    config: TransferConfig | None = None,
    progress: ProgressSink | None = None,
    engine: IOEngine | None = None,
) -> TransferReport:
    """Upload every file under ``src_dir`` to the store, in parallel.

    Relative paths (with ``/``) become keys under the store's root. Large files go up as
    multipart uploads.

    Args:
        src_dir: Local directory to upload.
        store: Destination.
        config: Workers, filters, resume and verification.
        progress: Receives progress updates.
        engine: Unused, kept so that existing calls still work: the run goes on
            ``store.engine``, the one engine the store's requests may run on.

    Returns:
        What was transferred, skipped and how fast.

    Raises:
        NotADirectoryError: ``src_dir`` is not a directory.
        TransferError: Some files failed; the others were uploaded.
    """
    config = config or TransferConfig()
    src = Path(src_dir).expanduser().resolve()
    if not src.is_dir():
        raise NotADirectoryError(f"{src}: not a directory")
    report = TransferReport(direction="upload", source=str(src), destination=store.url)
    started = time.perf_counter()
    files = _walk(src, config)
    report.files_total = len(files)
    store.engine.run(_upload(store, files, config, progress or _NoProgress(), report))
    report.seconds = time.perf_counter() - started
    report.requests = store.counters.snapshot()
    _raise_failures(report)
    return report
