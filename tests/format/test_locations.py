"""LocationReader, shared by the threads of a foreign reader: one store per bucket, whoever
asks first, so every request lands in the counters it reports."""

from __future__ import annotations

import threading
from typing import Any

from stoker.format.foreign.locations import LocationReader
from stoker.storage import open_store

THREADS = 16


def _read_at_once(reader: LocationReader) -> tuple[list[Any], list[BaseException]]:
    """THREADS threads each open the bucket's store, read an object and sum the counters,
    all at once; the stores they got and what they raised."""
    start = threading.Barrier(THREADS)
    stores: list[Any] = []
    errors: list[BaseException] = []

    def read() -> None:
        start.wait()
        try:
            stores.append(reader.store_at("s3://locations"))
            assert reader.read("s3://locations/a.bin") == b"abc"
            reader.requests()  # while others may be opening the store
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return stores, errors


def test_threads_opening_a_bucket_at_once_share_one_store_and_its_counters(
    s3_server: Any,
) -> None:
    s3_server.create_bucket("locations")
    options = s3_server.storage_options()
    open_store("s3://locations", storage_options=options).put("a.bin", b"abc")
    for attempt in range(5):  # a race: each attempt starts the threads anew
        reader = LocationReader(options)
        stores, errors = _read_at_once(reader)
        assert errors == []
        assert len({id(store) for store in stores}) == 1, f"attempt {attempt}"
        assert reader.requests()["requests.get"] == THREADS
