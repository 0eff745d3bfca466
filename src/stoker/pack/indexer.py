"""index_webdataset(): give existing WebDataset tars a stoker index, without rewriting them."""

from __future__ import annotations

import hashlib
import os
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.wds_tar import scan_tar
from stoker.format.index import DatasetIndex, write_index
from stoker.format.writer import SampleRecord, ShardRecord
from stoker.storage import StorageOptions, open_store


@dataclass(frozen=True, slots=True)
class IndexReport:
    """What :func:`index_webdataset` found and wrote."""

    url: str
    shards: int
    samples: int
    bytes: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "url": self.url,
            "shards": self.shards,
            "samples": self.samples,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
        }


def index_webdataset(
    url: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | StorageOptions | None = None,
    class_names: list[str] | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> IndexReport:
    """Index the ``.tar`` shards under ``url`` in one sequential pass.

    Each tar is read once, its members grouped into samples by WebDataset's rules, each
    sample's span checksummed; labels come from ``.cls`` members. The index is written
    beside the shards, which stay as they are, so the dataset opens with two GETs.

    Raises:
        SourceError: No tars, or a tar that breaks WebDataset's rules (names the tar and
            member).
    """
    store = open_store(url, storage_options=storage_options)
    started = time.perf_counter()
    names = sorted(m.key for m in store.list("") if m.key.endswith(".tar"))
    if not names:
        raise SourceError(f"{store.url}: no .tar shards to index")
    records: list[ShardRecord] = []
    fields: dict[str, int] = {}
    total = 0
    for name in names:
        data = bytes(store.get(name))
        total += len(data)
        samples = []
        for sample in scan_tar(data, name=f"{store.url}/{name}"):
            label = -1
            for ext, offset, size in sample.members:
                fields[ext] = fields.get(ext, 0) + 1
                if ext == "cls":
                    try:
                        label = int(data[offset : offset + size].decode("ascii").strip())
                    except (UnicodeDecodeError, ValueError):
                        label = -1
            span = data[sample.span_start : sample.span_end]
            samples.append(
                SampleRecord(
                    sample.key,
                    label,
                    sample.span_start,
                    sample.span_end - sample.span_start,
                    zlib.crc32(span),
                )
            )
        records.append(ShardRecord(name, len(data), hashlib.sha256(data).hexdigest(), samples))
        if progress is not None:
            progress(name, len(data))
    index = DatasetIndex.from_shards(
        [r for r in records if r.samples],
        class_names=list(class_names or []),
        fields=fields,
        packed_with={"indexed_from": "webdataset", "shards": len(names)},
    )
    write_index(store, index)
    return IndexReport(
        store.url, len(index.shards), len(index), total, time.perf_counter() - started
    )
