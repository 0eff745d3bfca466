"""The dataset index: a JSON manifest plus compact binary arrays, written last.

``index.bin`` holds, for N samples, little-endian arrays in this order after an 8-byte magic
and the uint64 count: shard id (uint32), offset (uint64), length (uint64), label (int64),
CRC-32 (uint32), key offsets (uint64, N + 1 entries) and the UTF-8 key blob. ``index.json``
names everything else and carries the SHA-256 of ``index.bin``; writing it is the commit
point. See docs/FORMAT.md. Nothing here unpickles anything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

import numpy as np

from stoker.errors import BucketNotFoundError, ShardFormatError
from stoker.format.keys import SampleKeys
from stoker.format.spec import (
    ARRAYS_MAGIC,
    ARRAYS_NAME,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
)
from stoker.format.tar import check_member_name
from stoker.format.tokens import TokenLayout, document_starts
from stoker.format.writer import ShardRecord
from stoker.storage.base import Store
from stoker.storage.cache import DiskCache
from stoker.storage.cached import CachedStore

T = TypeVar("T")

logger = logging.getLogger(__name__)

_ARRAYS = (
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
        for name, dtype in _ARRAYS:
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
        manifest[CHECKSUMS_KEY] = section_checksums(manifest)
        return manifest


#: The manifest entry that holds the SHA-256 of every other entry.
CHECKSUMS_KEY = "sections_sha256"
#: An ``index.json`` larger than this is refused before it is parsed (parsing JSON takes
#: many times its size in memory). 128 MiB holds the manifest of about 500,000 shards.
MAX_MANIFEST_BYTES = 128 << 20


def section_checksums(manifest: dict[str, Any]) -> dict[str, str]:
    """SHA-256 of each manifest entry's canonical JSON (sorted keys, no spaces, UTF-8)."""
    return {
        key: hashlib.sha256(
            json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        ).hexdigest()
        for key, value in sorted(manifest.items())
        if key != CHECKSUMS_KEY
    }


def _edited_sections(manifest: dict[str, Any]) -> list[str] | None:
    recorded = manifest.get(CHECKSUMS_KEY)
    if recorded is None:
        return None
    if not isinstance(recorded, dict):
        return [CHECKSUMS_KEY]
    actual = section_checksums(manifest)
    return sorted(k for k in set(recorded) | set(actual) if recorded.get(k) != actual.get(k))


def write_index(store: Store, index: DatasetIndex) -> None:
    """Write ``index.bin``, then ``index.json`` (the commit point)."""
    arrays = index.arrays_bytes()
    store.put(ARRAYS_NAME, arrays)
    manifest = json.dumps(index.manifest(arrays), indent=1, ensure_ascii=False)
    store.put(MANIFEST_NAME, manifest.encode("utf-8"))


def read_index(
    store: Store,
    *,
    max_manifest_bytes: int = MAX_MANIFEST_BYTES,
    cache: DiskCache | None = None,
) -> DatasetIndex:
    """Read a dataset's index with two GETs and no LIST.

    With a node's disk cache, the processes of the node that open the dataset at once (its
    ranks and loader workers) fetch the index once between them: each makes one HEAD of
    ``index.json`` (its ETag versions the cached copy, so a dataset packed again is read
    anew), one process fetches it and ``index.bin`` (versioned by the SHA-256 that
    ``index.json`` gives, no HEAD) into the cache, the others wait for them there.

    Besides parsing, the index is checked for consistency: every sample lies inside its
    shard's recorded size, the samples are grouped by shard in the counts the manifest gives,
    and object names are plain relative names (no ``..``, no absolute path). A manifest
    over ``max_manifest_bytes`` is refused unparsed. Entries edited since the index was
    written are listed in :attr:`DatasetIndex.edited` (and logged); ``stoker verify``
    reports them.

    Raises:
        FileNotFoundError: The dataset has no ``index.json`` (not packed, or not finished).
        ShardFormatError: The index is malformed, from a newer format version, or its
            arrays do not match the manifest.
    """
    where = f"{store.url}/{MANIFEST_NAME}"
    try:
        raw = _get_manifest(store, cache, max_manifest_bytes, where=where)
    except BucketNotFoundError:  # its message names the bucket or folder: say that
        raise
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{where}: no index; is this a packed stoker dataset, and did its pack finish?"
        ) from exc
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise ShardFormatError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise ShardFormatError(f"{where}: not a {FORMAT_NAME} manifest")
    version = manifest.get("version")
    if type(version) is not int or version < 1:
        raise ShardFormatError(f"{where}: format version {version!r} is not a positive integer")
    if version > FORMAT_VERSION:
        raise ShardFormatError(
            f"{where}: format version {version} is newer than this stoker reads "
            f"({FORMAT_VERSION}); upgrade stoker"
        )
    try:
        arrays_meta = _mapping(manifest, "arrays")
        arrays_name = _object_name(arrays_meta.get("name"), "arrays.name")
        arrays_sha256 = _checked(arrays_meta.get("sha256"), str, "arrays.sha256")
        shards = [
            _shard_entry(s, n)
            for n, s in enumerate(_checked(manifest.get("shards"), list, "shards"))
        ]
        samples = _checked(manifest.get("samples"), int, "samples")
        class_names = _checked(manifest.get("class_names", []), list, "class_names")
        fields = _mapping(manifest, "fields", default={})
        packed_with = _mapping(manifest, "packed_with", default={})
        skipped = _checked(manifest.get("skipped", []), list, "skipped")
        if not all(isinstance(name, str) for name in class_names):
            raise ValueError("class_names: not a list of strings")
        if not all(isinstance(k, str) and type(v) is int for k, v in fields.items()):
            raise ValueError("fields: not a mapping of extensions to counts")
        if not all(isinstance(entry, dict) for entry in skipped):
            raise ValueError("skipped: not a list of objects")
        tokens = (
            TokenLayout.from_json(manifest["tokens"], shards=len(shards))
            if "tokens" in manifest
            else None
        )
    except ValueError as exc:
        raise ShardFormatError(f"{where}: {exc}") from None
    arrays_where = f"{store.url}/{arrays_name}"
    arrays_bytes = arrays_meta.get("bytes")
    try:
        if cache is None:
            arrays = bytes(store.get(arrays_name))
        else:
            known = None  # an older manifest without the size: one HEAD for it
            if isinstance(arrays_bytes, int) and arrays_bytes >= 0:
                known = {arrays_name: (f"sha256:{arrays_sha256}", arrays_bytes)}
            arrays = bytes(CachedStore(store, cache, objects=known).get_whole(arrays_name))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{arrays_where}: missing; {MANIFEST_NAME} names it") from exc
    if hashlib.sha256(arrays).hexdigest() != arrays_sha256:
        raise ShardFormatError(
            f"{arrays_where}: checksum does not match {MANIFEST_NAME} "
            f"(an index from another dataset, or a partial write)"
        )
    index = _decode_arrays(arrays, where=arrays_where)
    index.shards = shards
    index.class_names = list(class_names)
    index.fields = dict(fields)
    index.packed_with = dict(packed_with)
    index.skipped = list(skipped)
    index.edited = _edited_sections(manifest)
    index.tokens = tokens
    if index.edited:
        logger.warning(
            "%s: %s edited since the index was written (checksums differ); "
            "`stoker verify` reports it",
            where,
            ", ".join(index.edited),
        )
    if len(index) != samples or sum(s.samples for s in shards) != len(index):
        raise ShardFormatError(f"{where}: sample counts disagree with {ARRAYS_NAME}")
    _check_layout(index, where=arrays_where)
    return index


def _get_manifest(
    store: Store, cache: DiskCache | None, max_manifest_bytes: int, *, where: str
) -> bytes:
    """``index.json``'s bytes, through ``cache`` if given (one larger than
    ``max_manifest_bytes`` is refused: through the cache, unread).

    Raises:
        ShardFormatError: It is larger than ``max_manifest_bytes``.
    """
    if cache is None:
        raw = bytes(store.get(MANIFEST_NAME))
        size = len(raw)
    else:
        shared = CachedStore(store, cache)
        size = shared.size_of(MANIFEST_NAME)
        raw = b"" if size > max_manifest_bytes else bytes(shared.get_whole(MANIFEST_NAME))
    if size > max_manifest_bytes:
        raise ShardFormatError(
            f"{where}: {size:,} bytes, more than an index may be "
            f"({max_manifest_bytes:,}); not parsed"
        )
    return raw


def _checked(value: object, kind: type[T], what: str) -> T:
    # bool is an int subclass, and never a count.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{what}: expected {kind.__name__}, found {type(value).__name__}")
    if isinstance(value, int) and not 0 <= value < 1 << 63:
        raise ValueError(f"{what}: {value} is out of range")
    return value


def _mapping(manifest: dict[str, Any], key: str, *, default: Any = None) -> dict[str, Any]:
    mapping: dict[str, Any] = _checked(manifest.get(key, default), dict, key)
    return mapping


def _object_name(value: Any, what: str) -> str:
    name: str = _checked(value, str, what)
    if not name or "" in name.split("/"):
        raise ValueError(f"{what}: {name!r} is not an object name")
    check_member_name(name)  # no absolute path, '..', backslash or control character
    return name


def _shard_entry(value: Any, number: int) -> ShardEntry:
    what = f"shards[{number}]"
    entry = _checked(value, dict, what)
    sha256 = _checked(entry.get("sha256"), str, f"{what}.sha256")
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"{what}.sha256: {sha256[:80]!r} is not a SHA-256 hex digest")
    return ShardEntry(
        _object_name(entry.get("name"), f"{what}.name"),
        _checked(entry.get("samples"), int, f"{what}.samples"),
        _checked(entry.get("bytes"), int, f"{what}.bytes"),
        sha256,
    )


def _check_layout(index: DatasetIndex, *, where: str) -> None:
    """Samples grouped by shard in the manifest's counts, each inside its shard's size."""
    counts = [s.samples for s in index.shards]
    if not np.array_equal(index.shard, np.repeat(np.arange(len(counts)), counts)):
        raise ShardFormatError(
            f"{where}: shard numbers do not group the samples as the manifest's shards do"
        )
    sizes = np.array([s.size for s in index.shards], dtype="<u8")[index.shard]
    outside = (index.length == 0) | (index.length > sizes) | (index.offset > sizes - index.length)
    if outside.any():
        i = int(np.argmax(outside))
        raise ShardFormatError(
            f"{where}: sample {index.keys[i]!r} (#{i}) at bytes {int(index.offset[i])}+"
            f"{int(index.length[i])} lies outside {index.shards[int(index.shard[i])].name} "
            f"({index.shards[int(index.shard[i])].size} bytes)"
        )
    if index.tokens is not None:
        _check_token_layout(index, index.tokens, where=where)


def _check_token_layout(index: DatasetIndex, layout: TokenLayout, *, where: str) -> None:
    """Each shard's tokens inside it; the documents tile the stream, whole tokens each."""
    for entry, count, offset in zip(
        index.shards, layout.shard_tokens, layout.data_offsets, strict=True
    ):
        if offset + count * layout.itemsize > entry.size:
            raise ShardFormatError(
                f"{where}: {entry.name} holds {count} tokens from byte {offset}, "
                f"past its {entry.size} bytes"
            )
    try:
        if (index.length % layout.itemsize).any():
            raise ValueError("a document's bytes are not whole tokens")
        document_starts(layout, index.shard, index.offset, index.length)
    except ValueError as exc:
        raise ShardFormatError(f"{where}: {exc}") from None


def _decode_arrays(data: bytes, *, where: str) -> DatasetIndex:
    if data[:8] != ARRAYS_MAGIC or len(data) < 16:
        raise ShardFormatError(f"{where}: bad magic {data[:8]!r}")
    count = int(np.frombuffer(data, dtype="<u8", count=1, offset=8)[0])
    position = 16
    columns: dict[str, np.ndarray] = {}
    for name, dtype in (*_ARRAYS, ("key_offsets", "<u8")):
        n = count + 1 if name == "key_offsets" else count
        size = np.dtype(dtype).itemsize * n
        if position + size > len(data):
            raise ShardFormatError(f"{where}: truncated ({name} runs past the end)")
        columns[name] = np.frombuffer(data, dtype=dtype, count=n, offset=position)
        position += size
    keys = SampleKeys.checked(bytes(data[position:]), columns["key_offsets"], where=where)
    return DatasetIndex(
        shards=[],
        class_names=[],
        fields={},
        shard=columns["shard"],
        offset=columns["offset"],
        length=columns["length"],
        label=columns["label"],
        crc32=columns["crc32"],
        keys=keys,
    )
