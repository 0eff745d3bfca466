"""index_webdataset(): give existing WebDataset tars a stoker index, without rewriting them."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stoker.core.crc import crc32
from stoker.errors import ShardFormatError, SourceError
from stoker.format.foreign.wds_tar import refuse_compressed_names, scan_tar
from stoker.format.index import DatasetIndex, read_index, write_index
from stoker.format.spec import ARRAYS_NAME, MANIFEST_NAME
from stoker.format.writer import SampleRecord, ShardRecord
from stoker.storage import StorageOptions, open_store
from stoker.storage.base import Store

logger = logging.getLogger(__name__)

#: Labels up to this are named by number without a look at how many samples there are.
_NAMED_LABELS = 1 << 16
#: The largest label a ``.cls`` member may hold (the index keeps labels as int64), and
#: the longest text read as one.
_MAX_LABEL = (1 << 63) - 1
_MAX_CLS_BYTES = 64


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

    Args:
        url: The folder or prefix holding the tars.
        storage_options: See :func:`stoker.open_store`.
        class_names: Names of labels 0, 1, ...; without them, labels that exist are named
            ``"0"``, ``"1"``, ... up to the largest.
        progress: Called with each tar's name and size once it is read.

    Raises:
        SourceError: No tars, a tar that breaks WebDataset's rules (names the tar and
            member), or a label with no name among ``class_names``.
    """
    store = open_store(url, storage_options=storage_options)
    started = time.perf_counter()
    listed = [m.key for m in store.list("")]
    names = sorted(key for key in listed if key.endswith(".tar"))
    if not names:
        refuse_compressed_names(listed, where=store.url)
        raise SourceError(f"{store.url}: no .tar shards to index")
    refuse_foreign_index(store, listed)
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
                    label = _cls_label(
                        data[offset : offset + size], f"{store.url}/{name}", sample.key
                    )
            span = data[sample.span_start : sample.span_end]
            samples.append(
                SampleRecord(
                    sample.key,
                    label,
                    sample.span_start,
                    sample.span_end - sample.span_start,
                    crc32(span),
                )
            )
        records.append(ShardRecord(name, len(data), hashlib.sha256(data).hexdigest(), samples))
        if progress is not None:
            progress(name, len(data))
    index = DatasetIndex.from_shards(
        [r for r in records if r.samples],
        class_names=_class_names(class_names, records, store.url),
        fields=fields,
        packed_with={"indexed_from": "webdataset", "shards": len(names)},
    )
    write_index(store, index)
    return IndexReport(
        store.url, len(index.shards), len(index), total, time.perf_counter() - started
    )


def refuse_foreign_index(store: Store, listed: list[str]) -> None:
    """Refuse to write an index over ``index.json`` or ``index.bin`` files that an earlier
    ``stoker index`` did not write: the user's own files, or a packed dataset's index.

    Raises:
        SourceError: Naming the file and what it is.
    """
    present = [name for name in (MANIFEST_NAME, ARRAYS_NAME) if name in listed]
    if not present:
        return
    where = f"{store.url}/{present[0]}"
    try:
        index = read_index(store)
    except (FileNotFoundError, ShardFormatError, ValueError):
        raise SourceError(
            f"{where} exists and is not a stoker index; stoker index would overwrite it. "
            "Move it away, or index a copy of the tars elsewhere"
        ) from None
    if "indexed_from" not in index.packed_with:
        raise SourceError(
            f"{where}: this is a dataset written by stoker pack, not tars to index; "
            "its index is already there"
        )


def _cls_label(member: bytes, tar: str, key: str) -> int:
    """The label of a ``.cls`` member: -1 for text that is no integer, as WebDataset's own
    decoder would fail on it.

    Raises:
        SourceError: An integer below -1 or beyond the index's int64, naming the sample.
    """
    text = member.strip()
    if len(text) > _MAX_CLS_BYTES or not text.lstrip(b"+-").isdigit():
        return -1
    if len(text) > 19 or not -1 <= int(text) <= _MAX_LABEL:
        raise SourceError(
            f"{tar}: sample {key!r} has label {text[:24].decode()}"
            f"{'...' if len(text) > 24 else ''} in its .cls member: labels are -1 (none) to "
            f"{_MAX_LABEL:,}"
        )
    return int(text)


def _class_names(given: list[str] | None, records: list[ShardRecord], url: str) -> list[str]:
    labelled = [(s.label, r.name, s.key) for r in records for s in r.samples if s.label >= 0]
    top = max(labelled, default=(-1, "", ""))
    if not given:
        # Named by number up to the largest: a list as long as the largest label, which
        # a few bytes of .cls must not make gigabytes long (one name per sample and more).
        if top[0] >= max(_NAMED_LABELS, 4 * len(labelled)):
            logger.warning(
                "%s/%s: sample %r has label %d, too large to name labels 0 to %d by number "
                "for %d labelled sample(s): the index has no class names (give them with "
                "--class-names)",
                url,
                top[1],
                top[2],
                top[0],
                top[0],
                len(labelled),
            )
            return []
        return [str(label) for label in range(top[0] + 1)]
    if top[0] >= len(given):
        raise SourceError(
            f"{url}/{top[1]}: sample {top[2]!r} has label {top[0]}, and {len(given)} class "
            "names were given"
        )
    return list(given)
