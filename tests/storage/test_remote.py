"""ObstoreStore never hands a caller fewer bytes than it asked for."""

from __future__ import annotations

from typing import Any

import obstore
import pytest

from stoker.errors import RetriesExhaustedError

FAST_RETRY = {"base_delay_s": 0.001, "max_delay_s": 0.01}
MiB = 1024 * 1024


class _Short:
    """A GET result whose body lost its last byte (a server or proxy bug HTTP cannot see:
    the Content-Length was consistent with the short body)."""

    def __init__(self, result: Any) -> None:
        self._result = result
        self.meta = result.meta
        self.range = result.range

    async def bytes_async(self) -> bytes:
        return bytes(await self._result.bytes_async())[:-1]


@pytest.fixture
def shorten(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the next N GETs come back one byte short; N is the list's single element."""
    budget = [0]
    real = obstore.get_async

    async def get_async(store: Any, path: str, *, options: Any = None) -> Any:
        result = await real(store, path, options=options)
        if budget[0] > 0:
            budget[0] -= 1
            return _Short(result)
        return result

    monkeypatch.setattr(obstore, "get_async", get_async)
    return budget


def test_short_bodies_are_retried_never_returned(s3_bucket, shorten: list[int]) -> None:
    data = bytes(range(256)) * (11 * MiB // 256)  # three parts of 5 MiB
    store = s3_bucket.store(
        retry=FAST_RETRY, part_size_bytes=5 * MiB, multipart_threshold_bytes=5 * MiB
    )
    store.put("small", data[:1000])
    store.put("large", data)
    shorten[0] = 1
    assert bytes(store.get("small")) == data[:1000]
    shorten[0] = 1
    assert bytes(store.get_range("large", start=7, end=3 * MiB)) == data[7 : 3 * MiB]
    shorten[0] = 3  # the next three GETs, whichever parts they fetch
    assert bytes(store.get("large")) == data
    counters = store.counters.snapshot()
    assert counters["errors.short_body"] == counters["retries"] == 5


def test_always_short_gives_up(s3_bucket, shorten: list[int]) -> None:
    store = s3_bucket.store(retry={**FAST_RETRY, "max_attempts": 3})
    store.put("k", b"0123456789")
    shorten[0] = 100
    with pytest.raises(RetriesExhaustedError, match="got 9 of 10 bytes"):
        store.get_range("k", start=0, end=10)
    assert store.counters.get("errors.short_body") == 3
