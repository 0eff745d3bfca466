"""open_store: from a URL and options to a Store."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stoker.storage.base import Store
from stoker.storage.engine import IOEngine
from stoker.storage.memory import named_memory_store
from stoker.storage.options import StorageOptions
from stoker.storage.remote import ObstoreStore
from stoker.storage.s3 import build_native
from stoker.storage.url import parse_url


def open_store(
    url: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | StorageOptions | None = None,
    engine: IOEngine | None = None,
) -> Store:
    """Open the store rooted at ``url``.

    Args:
        url: ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``,
            ``file:///dir``, a plain local path, or ``memory://name`` (a process-wide
            in-memory store, for tests).
        storage_options: Endpoint, region, credentials and the rest; a dict with the field
            names of :class:`StorageOptions` (boto3 spellings are accepted too) or a
            ``StorageOptions``. Unset values fall back to the AWS variables and config files.
        engine: I/O engine to run requests on; the process's shared engine by default.

    Returns:
        A store whose keys are relative to ``url``.

    Example:
        >>> store = open_store("s3://my-bucket/train", storage_options={
        ...     "endpoint_url": "http://127.0.0.1:8333", "region": "us-east-1"})
        >>> store.head("class_a/img_0001.jpg").size  # doctest: +SKIP
    """
    parsed = parse_url(url)
    options = StorageOptions.from_mapping(storage_options)
    if parsed.scheme == "memory":
        if parsed.prefix:
            raise ValueError(f"memory:// URLs take a name only, got {str(parsed)!r}")
        return named_memory_store(parsed.bucket)
    return ObstoreStore(build_native(parsed, options), parsed, options=options, engine=engine)
