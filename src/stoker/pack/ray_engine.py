"""Packing with Ray: each task writes whole shards (``--engine ray``).

The packer hands over the function that writes one shard, so this module needs nothing
from it and runs whatever it is given in the workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from stoker.format.foreign.base import SampleReader, SampleRef
from stoker.storage import Store, open_store

Config = TypeVar("Config")

#: ``write_shard(reader, refs, number, store, config)`` writes shard ``number`` and its
#: record to ``store`` and returns the record's JSON (the packer's ``write_one_shard``).
ShardWriterFunction = Callable[[SampleReader, list[SampleRef], int, Store, Config], bytes]


def _write_task(
    write_shard: ShardWriterFunction[Any],
    reader: SampleReader,
    refs: list[SampleRef],
    number: int,
    url: str,
    storage_options: Mapping[str, Any] | None,
    config: Any,  # write_shard's config; write_shards_with_ray checks that the two match
) -> tuple[int, bytes, int, int]:
    # Runs in a Ray worker: opens its own store, reads with its own thread pool.
    store = open_store(url, storage_options=storage_options)
    payload = write_shard(reader, refs, number, store, config)
    return number, payload, len(refs), sum(max(r.size, 0) for r in refs)


def write_shards_with_ray(
    reader: SampleReader,
    shard_refs: dict[int, list[SampleRef]],
    url: str,
    storage_options: Mapping[str, Any] | None,
    config: Config,
    progress: Callable[[int, int], None],
    *,
    write_shard: ShardWriterFunction[Config],
) -> dict[int, bytes]:
    """Write each shard in a Ray task with ``write_shard``; returns the records' JSON by number.

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
        task.remote(write_shard, reader_ref, refs, number, url, storage_options, config)
        for number, refs in shard_refs.items()
    ]
    payloads: dict[int, bytes] = {}
    while pending:
        finished, pending = ray.wait(pending, num_returns=1)
        number, payload, samples, nbytes = ray.get(finished[0])
        payloads[number] = payload
        progress(samples, nbytes)
    return payloads
