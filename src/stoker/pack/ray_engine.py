"""Packing with Ray: each task writes whole shards (``--engine ray``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from stoker.format.foreign.base import SampleReader, SampleRef
from stoker.storage import open_store

if TYPE_CHECKING:
    from stoker.pack.packer import PackConfig


def _write_task(
    reader: SampleReader,
    refs: list[SampleRef],
    number: int,
    url: str,
    storage_options: Mapping[str, Any] | None,
    config: PackConfig,
) -> tuple[int, bytes, int, int]:
    # Runs in a Ray worker: opens its own store, reads with its own thread pool.
    from stoker.pack.packer import write_one_shard

    store = open_store(url, storage_options=storage_options)
    payload = write_one_shard(reader, refs, number, store, config)
    return number, payload, len(refs), sum(max(r.size, 0) for r in refs)


def write_shards_with_ray(
    reader: SampleReader,
    shard_refs: dict[int, list[SampleRef]],
    url: str,
    storage_options: Mapping[str, Any] | None,
    config: PackConfig,
    progress: Callable[[int, int], None],
) -> dict[int, bytes]:
    """Write each shard in a Ray task; returns each shard's record JSON by number.

    Uses the Ray cluster the caller connected to (``ray.init(address=...)``), or starts a
    local one. Storage options travel to the workers with the task, so credentials given
    as options reach them; credentials from the environment must exist on the workers.

    Raises:
        ImportError: Ray is not installed (``pip install 'stoker[ray]'``).
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError("--engine ray needs Ray: pip install 'stoker[ray]'") from exc
    if not ray.is_initialized():
        ray.init(include_dashboard=False, logging_level=logging.WARNING)
    task = ray.remote(_write_task)
    reader_ref = ray.put(reader)
    pending = [
        task.remote(reader_ref, refs, number, url, storage_options, config)
        for number, refs in shard_refs.items()
    ]
    payloads: dict[int, bytes] = {}
    while pending:
        finished, pending = ray.wait(pending, num_returns=1)
        number, payload, samples, nbytes = ray.get(finished[0])
        payloads[number] = payload
        progress(samples, nbytes)
    return payloads
