"""Verify a packed dataset whole: every shard's size and SHA-256, every sample's CRC-32 and
tar members, and the index's manifest checksums (``stoker verify``,
:meth:`stoker.format.reader.ShardDataset.verify`)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.core.crc import crc32
from stoker.errors import ShardFormatError
from stoker.format.index import DatasetIndex, ShardEntry
from stoker.format.spec import MANIFEST_NAME
from stoker.format.tar import parse_members
from stoker.storage.base import Store


@dataclass(slots=True)
class VerifyReport:
    """What :func:`verify_shards` checked and found.

    Attributes:
        shards: Shards checked.
        samples: Samples checked.
        bytes: Bytes read.
        corrupt: ``(shard, sample key or "", what is wrong)`` for every problem found.
    """

    shards: int = 0
    samples: int = 0
    bytes: int = 0
    corrupt: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No problem found."""
        return not self.corrupt

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "ok": self.ok,
            "shards": self.shards,
            "samples": self.samples,
            "bytes": self.bytes,
            "corrupt": [
                {"shard": shard, "sample": key, "problem": problem}
                for shard, key, problem in self.corrupt
            ],
        }


def verify_shards(
    store: Store,
    index: DatasetIndex,
    *,
    url: str,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Read every shard of ``index`` from ``store`` whole and check it; never raises for
    corruption: every problem, with its shard and sample, is listed in the report.

    Args:
        store: The dataset's store.
        index: Its index.
        url: The dataset, as messages name it.
        progress: Called with the bytes of each shard once it is checked.
    """
    engine = store.engine
    report = VerifyReport()
    first_sample = np.concatenate([[0], np.cumsum([s.samples for s in index.shards])])

    async def check(number: int, entry: ShardEntry) -> None:
        try:
            data = await store.get_async(entry.name)
        except FileNotFoundError:
            report.corrupt.append((entry.name, "", "shard is missing"))
            return
        report.shards += 1
        report.bytes += len(data)
        if len(data) != entry.size:
            report.corrupt.append(
                (entry.name, "", f"size {len(data)} != {entry.size} in the index")
            )
        digest_ok = hashlib.sha256(data).hexdigest() == entry.sha256
        for i in range(int(first_sample[number]), int(first_sample[number + 1])):
            report.samples += 1
            start = int(index.offset[i])
            span = data[start : start + int(index.length[i])]
            key = index.keys[i]
            if crc32(span) != int(index.crc32[i]):
                report.corrupt.append((entry.name, key, "sample bytes fail their CRC-32"))
                continue
            if index.tokens is not None:
                continue  # a document's span is raw tokens, not tar members
            try:  # an index made over a malformed span passes the CRC but cannot be read
                parse_members(span, where=f"{url}/{entry.name}:{key}")
            except ShardFormatError as exc:
                report.corrupt.append((entry.name, key, str(exc)))
        if not digest_ok and not any(c[0] == entry.name for c in report.corrupt):
            report.corrupt.append((entry.name, "", "SHA-256 mismatch outside any sample"))
        if progress is not None:
            progress(len(data))

    async def check_all() -> None:
        limit = asyncio.Semaphore(max(2, min(8, os.cpu_count() or 2)))

        async def bounded(number: int, entry: ShardEntry) -> None:
            async with limit:
                await check(number, entry)

        await asyncio.gather(*(bounded(n, e) for n, e in enumerate(index.shards)))

    engine.run(check_all())
    if index.edited:
        edited = ", ".join(index.edited)
        problem = f"{edited} edited since the index was written (checksums differ)"
        report.corrupt.append((MANIFEST_NAME, "", problem))
    report.corrupt.sort()
    return report
