"""What a dataset's index holds (:class:`DatasetIndex`) and how it is encoded: the JSON
manifest, ``index.json``, and the binary arrays, ``index.bin`` (docs/FORMAT.md). Reading an
index back from a store, with its checks, is :mod:`stoker.format.index`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from stoker.format.spec import ARRAYS_MAGIC, ARRAYS_NAME, FORMAT_NAME, FORMAT_VERSION
from stoker.format.tokens import TokenLayout
from stoker.format.writer import ShardRecord

#: The per-sample arrays of ``index.bin``, in order, with their dtypes (the key offsets and
#: blob follow them).
ARRAY_COLUMNS = (
    ("shard", "<u4"),
    ("offset", "<u8"),
    ("length", "<u8"),
    ("label", "<i8"),
    ("crc32", "<u4"),
)


class ShardJSON(TypedDict):
    """One shard in the manifest."""

    name: str
    samples: int
    bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One shard as the index describes it."""

    name: str
    samples: int
    size: int
    sha256: str


@dataclass(slots=True)
class DatasetIndex:
    """Everything needed to read any sample with one ranged GET.

    Attributes:
        shards: Shards in order.
        class_names: Names indexed by label.
        fields: Field extensions seen, with how many samples have each.
        shard: Shard id of each sample.
        offset: Byte offset of each sample's span in its shard.
        length: Byte length of each sample's span.
        label: Label of each sample (-1 for none).
        crc32: CRC-32 of each sample's span.
        keys: Key of each sample (a read index decodes each when asked for:
            :class:`~stoker.format.keys.SampleKeys`).
        packed_with: Parameters of the pack that made it (free-form, for humans).
        skipped: Inputs left out with ``on_error="skip"``: dicts with key, source, reason.
        edited: Manifest entries whose checksum (``sections_sha256``) no longer matches,
            so edited after the index was written (``class_names`` renamed by hand); empty
            if all match, None for an index written before manifests carried checksums.
        tokens: For a token dataset (:mod:`stoker.format.tokens`), how its shards hold the
            token stream; its samples are then documents. None for any other dataset.
        videos: For a dataset of videos, the manifest's ``videos`` entry: name, bytes and
            SHA-256 of the object holding every video's seek index
            (:mod:`stoker.format.video_table`). None for any other dataset.
    """

    shards: list[ShardEntry]
    class_names: list[str]
    fields: dict[str, int]
    shard: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    label: np.ndarray
    crc32: np.ndarray
    keys: Sequence[str]
    packed_with: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    edited: list[str] | None = None
    tokens: TokenLayout | None = None
    videos: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def from_shards(
        cls,
        records: list[ShardRecord],
        *,
        class_names: list[str],
        fields: dict[str, int],
        packed_with: dict[str, Any] | None = None,
        skipped: list[dict[str, str]] | None = None,
    ) -> DatasetIndex:
        """Build the index of complete shards, in the order given."""
        samples = [(i, s) for i, record in enumerate(records) for s in record.samples]
        return cls(
            shards=[ShardEntry(r.name, len(r.samples), r.size, r.sha256) for r in records],
            class_names=list(class_names),
            fields=dict(sorted(fields.items())),
            shard=np.array([i for i, _ in samples], dtype="<u4"),
            offset=np.array([s.offset for _, s in samples], dtype="<u8"),
            length=np.array([s.length for _, s in samples], dtype="<u8"),
            label=np.array([s.label for _, s in samples], dtype="<i8"),
            crc32=np.array([s.crc32 for _, s in samples], dtype="<u4"),
            keys=[s.key for _, s in samples],
            packed_with=dict(packed_with or {}),
            skipped=list(skipped or []),
        )

    def arrays_bytes(self) -> bytes:
        """Encode the per-sample arrays as ``index.bin``."""
        count = len(self.keys)
        encoded = [k.encode("utf-8") for k in self.keys]
        key_offsets = np.zeros(count + 1, dtype="<u8")
        np.cumsum([len(k) for k in encoded], out=key_offsets[1:])
        parts = [ARRAYS_MAGIC, np.uint64(count).astype("<u8").tobytes()]
        for name, dtype in ARRAY_COLUMNS:
            parts.append(np.ascontiguousarray(getattr(self, name), dtype=dtype).tobytes())
        parts += [key_offsets.tobytes(), b"".join(encoded)]
        return b"".join(parts)

    def manifest(self, arrays: bytes) -> dict[str, Any]:
        """The JSON manifest for these arrays."""
        shards: list[ShardJSON] = [
            {"name": s.name, "samples": s.samples, "bytes": s.size, "sha256": s.sha256}
            for s in self.shards
        ]
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "samples": len(self.keys),
            "class_names": self.class_names,
            "fields": self.fields,
            "shards": shards,
            "arrays": {
                "name": ARRAYS_NAME,
                "bytes": len(arrays),
                "sha256": hashlib.sha256(arrays).hexdigest(),
            },
            "packed_with": self.packed_with,
            "skipped": self.skipped,
        }
        if self.tokens is not None:
            manifest["tokens"] = self.tokens.to_json()
        if self.videos is not None:
            manifest["videos"] = dict(self.videos)
        manifest[CHECKSUMS_KEY] = section_checksums(manifest)
        return manifest


#: The manifest entry that holds the SHA-256 of every other entry.
CHECKSUMS_KEY = "sections_sha256"


def section_checksums(manifest: dict[str, Any]) -> dict[str, str]:
    """SHA-256 of each manifest entry's canonical JSON (sorted keys, no spaces, UTF-8)."""
    return {
        key: hashlib.sha256(
            json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        ).hexdigest()
        for key, value in sorted(manifest.items())
        if key != CHECKSUMS_KEY
    }
