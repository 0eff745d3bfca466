"""The test server itself: it must not run out of room before the disk does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stoker.storage import open_store
from stoker.testing.seaweed import SeaweedServer


def test_more_buckets_than_the_disk_has_auto_volumes(
    small_tmpfs: Callable[[str], Path],
) -> None:
    # On a 1 GiB disk ``weed mini`` sizes itself to 15 volumes of 64 MiB; each bucket takes
    # one, so the 15th bucket's PUTs answered HTTP 500 before MAX_VOLUMES was set.
    buckets = 24
    with SeaweedServer(data_dir=small_tmpfs("1g")) as server:
        options = {**server.storage_options(), "retry": {"max_attempts": 1}}
        for number in range(buckets):
            name = f"bucket-{number:02d}"
            server.create_bucket(name)
            store = open_store(f"s3://{name}", storage_options=options)
            store.put("object", name.encode())
            assert bytes(store.get("object")) == name.encode()
