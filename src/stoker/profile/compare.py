"""The seed comparison on a user's own bucket of small files.

Four ways to train on a folder of small images in a bucket (class folders of JPEGs), each
timed to its first batch and to the end of one epoch:

(a) download the files one by one, then train from local disk;
(b) download them in parallel, then train from local disk;
(c) stream the small files directly: one GET per sample from a pool of workers, as a
    DataLoader over per-object reads does;
(d) pack them into indexed shards (:func:`stoker.pack`), then stream the shards with the
    :class:`~stoker.pipeline.loader.Loader`.

Every method decodes with the same decoder and transform (``RandomResizedCrop(size)`` with
flips), so the differences are in the data access. The one-by-one download is timed on its
first ``sequential_limit`` files and scaled to the rest (marked as an estimate); the local
epoch of (a) and (b) is the same work on the same files, so it is timed once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker import DecodeConfig
from stoker.format.foreign.base import SampleRef
from stoker.format.foreign.imagefolder import ImageFolderReader
from stoker.pack.packer import pack
from stoker.pack.resume import refuse_occupied
from stoker.pipeline.autotune import default_threads
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.profile.baselines import download_one_by_one, download_parallel, timed_epoch
from stoker.profile.bench import bench_loader
from stoker.profile.comparison import CompareRow, Comparison, format_comparison
from stoker.storage import open_store, parse_url
from stoker.storage.transfer import safe_local_path

__all__ = [
    "CompareConfig",
    "CompareRow",
    "Comparison",
    "compare_methods",
    "default_pack_to",
    "format_comparison",
    "sample_refs",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareConfig:
    """How the comparison runs.

    Attributes:
        limit: Files used (an evenly spaced sample when the folder holds more).
        batch_size: Samples per batch.
        size: Output side of the ``RandomResizedCrop``.
        threads: Decode threads of the local epochs and of the loader (default: one per CPU).
        download_workers: Files in flight for the parallel download.
        stream_workers: Workers of the per-object stream, each doing GET then decode.
        sequential_limit: Files the one-by-one download is timed on.
        seed: Seed of the crops.
    """

    limit: int = 1000
    batch_size: int = 64
    size: int = 224
    threads: int | None = None
    download_workers: int = 64
    stream_workers: int = 16
    sequential_limit: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "limit",
            "batch_size",
            "size",
            "download_workers",
            "stream_workers",
            "sequential_limit",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


def sample_refs(refs: Sequence[SampleRef], limit: int) -> list[SampleRef]:
    """At most ``limit`` refs, evenly spaced (so every class folder is represented)."""
    if len(refs) <= limit:
        return list(refs)
    return [refs[(i * len(refs)) // limit] for i in range(limit)]


def _delete_all(url: str, storage_options: Mapping[str, Any] | None) -> None:
    """Delete every object under ``url`` (and, for a local path, the emptied directories)."""
    store = open_store(url, storage_options=storage_options)
    for meta in list(store.list("")):
        store.delete(meta.key)
    parsed = parse_url(url)
    if parsed.scheme == "file" and Path(parsed.prefix).is_dir():
        root = Path(parsed.prefix)
        for directory in sorted((d for d in root.rglob("*") if d.is_dir()), reverse=True):
            with contextlib.suppress(OSError):  # not empty: someone else's
                directory.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


def default_pack_to(url: str) -> str:
    """Where the comparison packs by default: beside ``url``, as ``URL-stoker-compare``.

    Raises:
        ValueError: ``url`` is a bucket's root, which has no beside.
    """
    parsed = parse_url(url)
    if not parsed.prefix or parsed.prefix == "/":
        raise ValueError(f"{url}: a bucket root; say where to pack with pack_to (--pack-to)")
    return f"{str(parsed).rstrip('/')}-stoker-compare"


def compare_methods(
    url: str,
    *,
    pack_to: str,
    storage_options: Mapping[str, Any] | None = None,
    config: CompareConfig | None = None,
    workdir: str | os.PathLike[str] | None = None,
    keep_packed: bool = False,
    log: Callable[[str], None] | None = None,
) -> Comparison:
    """Time the four ways to train on the small files under ``url`` (see the module).

    Args:
        url: A folder of images (class folders of JPEGs), in a bucket or local.
        pack_to: Where (d) writes the packed dataset; must be empty. Put it in the same
            store as ``url`` for a fair comparison.
        storage_options: For ``url`` and ``pack_to`` (see :func:`stoker.open_store`).
        config: Sample size, batch size, transform size, parallelism.
        workdir: Local directory for the downloads (default: a temporary one, removed).
        keep_packed: Keep the packed dataset (else its objects are deleted at the end).
        log: Receives one line per step.

    Raises:
        ValueError: ``pack_to`` is not empty (the message names what is there).
        SourceError: ``url`` holds no images.
    """
    config = config or CompareConfig()
    say = log or (lambda _line: None)
    threads = config.threads or default_threads()
    refuse_occupied(open_store(pack_to, storage_options=storage_options))
    reader = ImageFolderReader(url, storage_options=storage_options)
    everything = reader.refs()
    refs = sample_refs(everything, config.limit)
    scratch = Path(tempfile.mkdtemp(prefix="stoker-compare-", dir=workdir))
    try:
        rows = _run_methods(
            url,
            refs,
            reader.class_names,
            scratch,
            pack_to=pack_to,
            whole=len(refs) == len(everything),
            storage_options=storage_options,
            config=config,
            threads=threads,
            say=say,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not keep_packed:
            _delete_all(pack_to, storage_options)
    return Comparison(
        url=url,
        files=len(refs),
        bytes=sum(ref.size for ref in refs),
        batch_size=config.batch_size,
        threads=threads,
        rows=rows,
        packed=pack_to if keep_packed else None,
    )


def _run_methods(
    url: str,
    refs: Sequence[SampleRef],
    class_names: Sequence[str],
    scratch: Path,
    *,
    pack_to: str,
    whole: bool,
    storage_options: Mapping[str, Any] | None,
    config: CompareConfig,
    threads: int,
    say: Callable[[str], None],
) -> list[CompareRow]:
    root = url.rstrip("/")
    keys = [ref.location[len(root) + 1 :] for ref in refs]
    store = open_store(url, storage_options=storage_options)
    transform = RandomResizedCrop(config.size, flip=True)
    epoch_options: dict[str, Any] = {
        "batch_size": config.batch_size,
        "transform": transform,
        "seed": config.seed,
    }
    part = keys[: config.sequential_limit]
    seconds = download_one_by_one(store, part, scratch / "one-by-one")
    sequential_s = seconds * len(keys) / len(part)
    say(f"(a) one GET at a time: {len(part)} files in {seconds:.1f} s")
    parallel_s = download_parallel(
        store, keys, scratch / "parallel", config.download_workers, whole=whole
    )
    say(f"(b) parallel download: {len(keys)} files in {parallel_s:.1f} s")
    paths = [safe_local_path(scratch / "parallel", key) for key in keys]
    first, epoch = timed_epoch(
        lambda i: paths[i].read_bytes(), len(paths), workers=threads, **epoch_options
    )
    say(f"    an epoch from local disk: {epoch:.1f} s")
    rows = [
        CompareRow(
            method="(a) download one by one, then train",
            setup_s=sequential_s,
            first_batch_s=sequential_s + first,
            epoch_s=epoch,
            images=len(keys),
            estimated=len(part) < len(keys),
        ),
        CompareRow(
            method="(b) download in parallel, then train",
            setup_s=parallel_s,
            first_batch_s=parallel_s + first,
            epoch_s=epoch,
            images=len(keys),
        ),
    ]
    gets_before = store.counters.get("requests.get")
    first, epoch = timed_epoch(
        lambda i: store.get(keys[i]), len(keys), workers=config.stream_workers, **epoch_options
    )
    say(f"(c) one GET per sample, {config.stream_workers} workers: epoch {epoch:.1f} s")
    rows.append(
        CompareRow(
            method="(c) stream the small files (GET each)",
            setup_s=0.0,
            first_batch_s=first,
            epoch_s=epoch,
            images=len(keys),
            requests_per_epoch=store.counters.get("requests.get") - gets_before,
        )
    )
    rows.append(
        _pack_and_stream(refs, class_names, scratch, pack_to, storage_options, config, threads, say)
    )
    return rows


def _pack_and_stream(
    refs: Sequence[SampleRef],
    class_names: Sequence[str],
    scratch: Path,
    pack_to: str,
    storage_options: Mapping[str, Any] | None,
    config: CompareConfig,
    threads: int,
    say: Callable[[str], None],
) -> CompareRow:
    listing = scratch / "sample.jsonl"
    with listing.open("w", encoding="utf-8") as out:
        for ref in refs:
            label = class_names[ref.label] if 0 <= ref.label < len(class_names) else None
            out.write(json.dumps({"path": ref.location, "label": label}) + "\n")
    started = time.perf_counter()
    # The list is ours, naming the objects of the compared folder: outside its own folder.
    pack(
        listing,
        pack_to,
        source_format="list",
        storage_options=storage_options,
        allow_outside_list=True,
    )
    pack_s = time.perf_counter() - started
    say(f"(d) packed into {pack_to} in {pack_s:.1f} s")
    started = time.perf_counter()  # opening the dataset (two GETs) counts
    with Loader(
        pack_to,
        batch_size=config.batch_size,
        seed=config.seed,
        transform=RandomResizedCrop(config.size, flip=True),
        storage_options=storage_options,
        decode=DecodeConfig(threads=threads),
    ) as loader:
        open_s = time.perf_counter() - started
        result = bench_loader(loader)  # GETs counted after the index was read
    first, epoch = open_s + result.first_batch_s, open_s + result.seconds
    images, gets = result.samples, result.requests
    say(f"    stoker Loader epoch: {epoch:.1f} s")
    return CompareRow(
        method="(d) pack, then stream the shards",
        setup_s=pack_s,
        first_batch_s=pack_s + first,
        epoch_s=epoch,
        images=images,
        requests_per_epoch=gets,
    )
