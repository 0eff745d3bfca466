"""The dataset index in a store: written last, read back with two GETs and checked.

What an index holds and its encoding are :mod:`stoker.format.dataset_index`.

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
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from stoker.errors import BucketNotFoundError, ShardFormatError
from stoker.format.dataset_index import (
    ARRAY_COLUMNS,
    CHECKSUMS_KEY,
    DatasetIndex,
    ShardEntry,
    ShardJSON,
    section_checksums,
)
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
from stoker.storage.base import Store
from stoker.storage.cache import DiskCache
from stoker.storage.cached import CachedStore

__all__ = [
    "CHECKSUMS_KEY",
    "MAX_MANIFEST_BYTES",
    "DatasetIndex",
    "ShardEntry",
    "ShardJSON",
    "read_index",
    "section_checksums",
    "write_index",
]

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: An ``index.json`` larger than this is refused before it is parsed (parsing JSON takes
#: many times its size in memory). 128 MiB holds the manifest of about 500,000 shards.
MAX_MANIFEST_BYTES = 128 << 20


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
    manifest = _parse_manifest(
        _get_manifest(store, cache, max_manifest_bytes, where=where), where=where
    )
    try:
        parts = _Manifest.of(manifest)
    except ValueError as exc:
        raise ShardFormatError(f"{where}: {exc}") from None
    arrays_where = f"{store.url}/{parts.arrays_name}"
    index = _decode_arrays(_get_arrays(store, cache, parts, where=arrays_where), where=arrays_where)
    index.shards = parts.shards
    index.class_names = parts.class_names
    index.fields = parts.fields
    index.packed_with = parts.packed_with
    index.skipped = parts.skipped
    index.edited = _edited_sections(manifest)
    index.tokens = parts.tokens
    index.videos = parts.videos
    if index.edited:
        logger.warning(
            "%s: %s edited since the index was written (checksums differ); "
            "`stoker verify` reports it",
            where,
            ", ".join(index.edited),
        )
    if len(index) != parts.samples or sum(s.samples for s in parts.shards) != len(index):
        raise ShardFormatError(f"{where}: sample counts disagree with {ARRAYS_NAME}")
    _check_layout(index, where=arrays_where)
    return index


def _parse_manifest(raw: bytes, *, where: str) -> dict[str, Any]:
    """``index.json`` parsed, its format and version checked."""
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
    return manifest


@dataclass(frozen=True, slots=True, kw_only=True)
class _Manifest:
    """The entries of a manifest, each checked."""

    arrays_name: str
    arrays_sha256: str
    arrays_bytes: object  # the size of index.bin, if the manifest gives it
    shards: list[ShardEntry]
    samples: int
    class_names: list[str]
    fields: dict[str, int]
    packed_with: dict[str, Any]
    skipped: list[dict[str, str]]
    tokens: TokenLayout | None
    videos: dict[str, Any] | None

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> _Manifest:
        """Raises ValueError naming the entry that is wrong."""
        arrays = _mapping(manifest, "arrays")
        arrays_name = _object_name(arrays.get("name"), "arrays.name")
        arrays_sha256 = _checked(arrays.get("sha256"), str, "arrays.sha256")
        listed = _checked(manifest.get("shards"), list, "shards")
        shards = [_shard_entry(s, n) for n, s in enumerate(listed)]
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
        videos = _mapping(manifest, "videos") if "videos" in manifest else None
        if videos is not None:
            _object_name(videos.get("name"), "videos.name")
            _checked(videos.get("sha256"), str, "videos.sha256")
            _checked(videos.get("bytes"), int, "videos.bytes")
        return cls(
            arrays_name=arrays_name,
            arrays_sha256=arrays_sha256,
            arrays_bytes=arrays.get("bytes"),
            shards=shards,
            samples=samples,
            class_names=list(class_names),
            fields=dict(fields),
            packed_with=dict(packed_with),
            skipped=list(skipped),
            tokens=tokens,
            videos=None if videos is None else dict(videos),
        )


def _get_arrays(store: Store, cache: DiskCache | None, parts: _Manifest, *, where: str) -> bytes:
    """``index.bin``'s bytes, through ``cache`` if given, checked against the manifest's
    SHA-256."""
    name = parts.arrays_name
    try:
        if cache is None:
            arrays = bytes(store.get(name))
        else:
            known = None  # an older manifest without the size: one HEAD for it
            size = parts.arrays_bytes
            if isinstance(size, int) and size >= 0:
                known = {name: (f"sha256:{parts.arrays_sha256}", size)}
            arrays = bytes(CachedStore(store, cache, objects=known).get_whole(name))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{where}: missing; {MANIFEST_NAME} names it") from exc
    if hashlib.sha256(arrays).hexdigest() != parts.arrays_sha256:
        raise ShardFormatError(
            f"{where}: checksum does not match {MANIFEST_NAME} "
            f"(an index from another dataset, or a partial write)"
        )
    return arrays


def _get_manifest(
    store: Store, cache: DiskCache | None, max_manifest_bytes: int, *, where: str
) -> bytes:
    """``index.json``'s bytes, through ``cache`` if given (one larger than
    ``max_manifest_bytes`` is refused: through the cache, unread).

    Raises:
        FileNotFoundError: There is none.
        ShardFormatError: It is larger than ``max_manifest_bytes``.
    """
    try:
        if cache is None:
            raw = bytes(store.get(MANIFEST_NAME))
            size = len(raw)
        else:
            shared = CachedStore(store, cache)
            size = shared.size_of(MANIFEST_NAME)
            raw = b"" if size > max_manifest_bytes else bytes(shared.get_whole(MANIFEST_NAME))
    except BucketNotFoundError:  # its message names the bucket or folder: say that
        raise
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{where}: no index; is this a packed stoker dataset, and did its pack finish?"
        ) from exc
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
    for name, dtype in (*ARRAY_COLUMNS, ("key_offsets", "<u8")):
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
