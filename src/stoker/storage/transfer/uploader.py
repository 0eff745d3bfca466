"""Upload: every file under a local directory to a store, in parallel."""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from stoker.storage.base import ObjectMeta, Store
from stoker.storage.checksum import etag_matches, md5_hex
from stoker.storage.engine import IOEngine
from stoker.storage.transfer.config import (
    NoProgress,
    ProgressSink,
    TransferConfig,
    TransferReport,
    error_text,
    raise_failures,
)
from stoker.storage.transfer.local import walk
from stoker.storage.url import StorageUrl, parse_url

logger = logging.getLogger(__name__)


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
        ValueError: The store is ``src_dir`` or a folder inside it (the copy would grow
            with each run).
        TransferError: Some files failed; the others were uploaded.
    """
    config = config or TransferConfig()
    src = Path(src_dir).expanduser().resolve()
    if not src.is_dir():
        raise NotADirectoryError(f"{src}: not a directory")
    _refuse_destination_in_source(src, store)
    report = TransferReport(direction="upload", source=str(src), destination=store.url)
    started = time.perf_counter()
    files, others = walk(src, config)
    for key, what in others:
        if what == "a dangling symbolic link":
            report.failures.append((key, what))  # one failure, not an abort
        else:
            logger.warning("%s: skipped, it is %s, not a regular file", src / key, what)
            report.not_regular.append((key, what))
    report.files_total = len(files)
    store.engine.run(_upload(store, files, config, progress or NoProgress(), report))
    report.seconds = time.perf_counter() - started
    report.requests = store.counters.snapshot()
    raise_failures(report)
    return report


def _refuse_destination_in_source(src: Path, store: Store) -> None:
    """Refuse a destination inside the folder being uploaded (or the folder itself): its
    files would be copied into it, and each rerun would copy the copies again.

    Raises:
        ValueError: Naming both.
    """
    destination = parse_url(store.url)
    if StorageUrl("file", "", str(src)).contains(destination):
        raise ValueError(
            f"destination {destination} is inside the source folder {src}: uploading that "
            "folder would copy it into itself, again on each rerun; upload to a folder "
            "outside it"
        )


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
    part_size = store.options.part_size_bytes
    threshold = store.options.multipart_threshold_bytes

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
            report.failures.append((key, error_text(exc)))
            progress.advance(files=1, nbytes=0)

    await _run_pool(files, config.workers, send)


async def _run_pool(items: Iterable[Any], workers: int, job: Any) -> None:
    iterator: Iterator[Any] = iter(items)

    async def worker() -> None:
        for item in iterator:
            await job(item)

    await asyncio.gather(*(worker() for _ in range(workers)))
