"""Download: every object under a store's root into a local directory, in parallel."""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from stoker.errors import ObjectNotFoundError, TransferError
from stoker.storage.base import ObjectMeta, Store
from stoker.storage.engine import IOEngine
from stoker.storage.transfer.config import (
    LateProgress,
    NoProgress,
    ProgressSink,
    TransferConfig,
    TransferReport,
    error_text,
    raise_failures,
)
from stoker.storage.transfer.local import (
    DISK_FULL,
    DiskFullError,
    check_file,
    check_md5,
    local_is_current_async,
    partial_path,
    pwrite_all,
    refuse_partial_name,
    remove_quietly,
    reserve,
    safe_local_path,
    write_file,
)
from stoker.storage.transfer.throttle import within_throttle_budget


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
        RetriesExhaustedError: The store answered every request with a throttle for
            ``config.max_throttled_s``: the download stopped, saying so, with no partial
            file left behind.
        FileNotFoundError: The bucket does not exist, or nothing is under its prefix (or
            the local folder) at all; ``dst_dir`` is then left alone.
    """
    config = config or TransferConfig()
    dst = Path(dst_dir).expanduser().resolve()
    report = TransferReport(direction="download", source=store.url, destination=str(dst))
    started = time.perf_counter()
    sink = progress or NoProgress()

    def stopped() -> str:
        done = report.files_transferred + report.files_skipped
        return (
            f"download of {store.url} stopped: {done} of {report.files_total} files listed so "
            f"far are complete in {dst} and no partial file is left; rerun later to resume"
        )

    store.engine.run(
        within_throttle_budget(
            _download(store, dst, config, sink, report),
            shapers=store.engine.shapers,
            budget_s=config.max_throttled_s,
            stopped=stopped,
        )
    )
    report.seconds = time.perf_counter() - started
    report.requests = store.counters.snapshot()
    raise_failures(report)
    return report


async def _selected(
    store: Store, config: TransferConfig, listed: builtins.list[int]
) -> AsyncIterator[ObjectMeta]:
    pages: AsyncIterator[builtins.list[ObjectMeta]] = store.list_async("")
    async for page in pages:
        listed[0] += len(page)
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
    sink = LateProgress(progress)
    listed = [0]  # objects listed, before the filters
    listing = _selected(store, config, listed)
    # Up to list_ahead objects are listed first: a listing that ends there is known exactly
    # before any download starts; a longer one is streamed through a bounded queue.
    first: builtins.list[ObjectMeta] = []
    async for meta in listing:
        first.append(meta)
        if len(first) >= config.list_ahead:
            break
    else:
        if listed[0] == 0:  # a mistyped source: say so, and create no destination
            raise ObjectNotFoundError(f"nothing to download: no object under {store.url}")
        sink.start(files=len(first), total_bytes=sum(m.size for m in first))
    dst.mkdir(parents=True, exist_ok=True)
    report.files_total = len(first)
    listed_all = len(first) < config.list_ahead
    queue: asyncio.Queue[ObjectMeta | None] = asyncio.Queue(config.list_ahead)
    full: builtins.list[BaseException] = []  # the disk-full error that stopped the run
    list_error: builtins.list[BaseException] = []

    async def produce() -> None:
        # Cancelled (the transfer stops), it leaves no sentinel: the workers stop too.
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
        for _ in range(config.workers):
            await queue.put(None)

    async def worker() -> None:
        while (meta := await queue.get()) is not None:
            if not full:
                await _fetch(store, dst, meta, config, sink, report, full)

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


async def _fetch(
    store: Store,
    dst: Path,
    meta: ObjectMeta,
    config: TransferConfig,
    sink: ProgressSink,
    report: TransferReport,
    full: builtins.list[BaseException],
) -> None:
    """Download one object (or skip it, when current), counted in ``report``; a failure is
    recorded there, and a full disk also in ``full`` (which stops the run)."""
    partial: Path | None = None
    try:
        target = safe_local_path(dst, meta.key)
        refuse_partial_name(meta.key, target)
        part_size = store.options.part_size_bytes
        if config.resume and await local_is_current_async(target, meta, part_size):
            report.files_skipped += 1
            sink.advance(files=1, nbytes=meta.size)
            return
        partial = partial_path(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            await _write(store, meta, partial, verify=config.verify)
            partial.replace(target)
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise DiskFullError(
                    f"no space left on device writing {target} ({meta.size} bytes)"
                ) from exc
            raise
        partial = None
        report.files_transferred += 1
        report.bytes_transferred += meta.size
        sink.advance(files=1, nbytes=meta.size)
    except Exception as exc:  # one failed object must not stop the others
        report.failures.append((meta.key, error_text(exc)))
        sink.advance(files=1, nbytes=0)
        if isinstance(exc, DiskFullError) and not full:
            full.append(exc)
    finally:
        if partial is not None:  # never leave a partial file behind
            remove_quietly(partial)


async def _write(store: Store, meta: ObjectMeta, partial: Path, *, verify: bool) -> None:
    """Write the object into ``partial`` (in parts if large), checked against its ETag when
    ``verify`` and it can be, with the object's modification time."""
    # Only a single-part ETag (an MD5) is checked: a multipart one depends on a part size
    # that the uploader chose and the listing does not say.
    check = verify and meta.etag is not None and len(meta.etag) == 32
    if meta.size >= store.options.multipart_threshold_bytes:
        await _download_parts(store, meta, partial, store.options.part_size_bytes)
        if check:
            await check_file(meta, partial)
    else:
        data = await store.get_async(meta.key)
        if check:
            check_md5(meta, data)
        write_file(partial, data)
    if meta.last_modified is not None:
        stamp = meta.last_modified.timestamp()
        os.utime(partial, (stamp, stamp))


async def _download_parts(store: Store, meta: ObjectMeta, partial: Path, part_size: int) -> None:
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        reserve(fd, meta.size)
        failed: builtins.list[BaseException] = []
        writes: builtins.list[asyncio.Future[None]] = []

        async def part(start: int) -> None:
            if failed:  # one part failed: the file fails, start no more parts
                return
            end = min(start + part_size, meta.size)
            try:
                data = await store.get_range_async(meta.key, start=start, end=end)
                writes.append(asyncio.ensure_future(asyncio.to_thread(pwrite_all, fd, data, start)))
                await asyncio.shield(writes[-1])  # cancelled, the write still ends (below)
            except Exception as exc:
                failed.append(exc)

        await asyncio.gather(*(part(s) for s in range(0, meta.size, part_size)))
        if failed:
            raise failed[0]
    finally:
        # Every write ends before the descriptor is closed, even after a failure or a
        # cancellation: one still running could otherwise land in a file that reused it.
        if writes:
            await asyncio.wait(writes)
        os.close(fd)
