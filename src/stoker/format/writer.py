"""ShardWriter: builds one tar shard in WebDataset layout and writes it to a Store."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from stoker.core.crc import crc32
from stoker.format.foreign.base import Sample
from stoker.format.spec import TAR_BLOCK, check_key, normalise_extension
from stoker.format.tar import member_header, padded
from stoker.storage.base import Store


@dataclass(frozen=True, slots=True)
class SampleRecord:
    """Where one written sample lives in its shard.

    Attributes:
        key: Sample key.
        label: Class index, or -1.
        offset: Byte offset of the sample's first member header in the shard.
        length: Bytes from that header to the end of its last member's padded data.
        crc32: zlib CRC-32 of those ``length`` bytes.
    """

    key: str
    label: int
    offset: int
    length: int
    crc32: int


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """A complete shard: its name, size, checksum and samples."""

    name: str
    size: int
    sha256: str
    samples: list[SampleRecord]


class ShardWriter:
    """Collects samples into one shard and writes it with a single atomic ``put``.

    The shard is built in memory (shards are tens to hundreds of MB), so the object appears
    under its name only when complete. Members are ``KEY.EXT`` in the order of each sample's
    fields; a sample's members are contiguous.

    Args:
        store: Where the shard goes.
        name: Its key in the store.
    """

    def __init__(self, store: Store, name: str) -> None:
        self._store = store
        self._name = name
        self._buffer = bytearray()
        self._records: list[SampleRecord] = []
        self._keys: set[str] = set()

    @property
    def size(self) -> int:
        """Bytes written so far (without the end-of-archive blocks)."""
        return len(self._buffer)

    def __len__(self) -> int:
        return len(self._records)

    def add(self, sample: Sample) -> SampleRecord:
        """Append a sample.

        Raises:
            ValueError: Invalid or duplicate key, or a sample without fields.
        """
        check_key(sample.key)
        if sample.key in self._keys:
            raise ValueError(f"duplicate sample key {sample.key!r} in shard {self._name}")
        if not sample.fields:
            raise ValueError(f"sample {sample.key!r} has no fields")
        names = [normalise_extension(ext) for ext in sample.fields]
        if len(set(names)) != len(names):
            raise ValueError(
                f"sample {sample.key!r}: fields {sorted(sample.fields)} name the same "
                "extension twice"
            )
        start = len(self._buffer)
        for ext, data in sample.fields.items():
            name = f"{sample.key}.{normalise_extension(ext)}"
            self._buffer += member_header(name, len(data))
            self._buffer += data
            self._buffer += bytes(padded(len(data)) - len(data))
        end = len(self._buffer)
        crc = crc32(memoryview(self._buffer)[start:end])
        record = SampleRecord(sample.key, sample.label, start, end - start, crc)
        self._keys.add(sample.key)
        self._records.append(record)
        return record

    @staticmethod
    def data_offset(sample: Sample, extension: str) -> int:
        """Where member ``extension``'s data starts, in bytes from the sample's first header
        (as :meth:`add` writes it)."""
        at = 0
        for ext, data in sample.fields.items():
            header = len(member_header(f"{sample.key}.{normalise_extension(ext)}", len(data)))
            if ext == extension:
                return at + header
            at += header + padded(len(data))
        raise KeyError(extension)

    def close(self) -> ShardRecord:
        """Finish the archive, write it to the store, and describe it."""
        self._buffer += bytes(2 * TAR_BLOCK)
        digest = hashlib.sha256(self._buffer).hexdigest()
        self._store.put(self._name, self._buffer)
        record = ShardRecord(self._name, len(self._buffer), digest, list(self._records))
        self._buffer = bytearray()
        return record
