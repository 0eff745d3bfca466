"""A Parquet object's footer, read once per node: the last bytes of the object (its
thrift-encoded metadata, its length and the ``PAR1`` magic), fetched by one or two ranged
GETs and kept in the node's disk cache, versioned by the object's size and ETag, so that
every rank and loader worker of the node opens the file without reading it again.

A footer that claims more bytes than the object holds, or more than
:data:`MAX_FOOTER_BYTES`, is refused naming the object, before anything that large is
read or allocated.
"""

from __future__ import annotations

import io
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.columns import import_pyarrow
from stoker.format.foreign.locations import read_object
from stoker.storage.base import Store
from stoker.storage.cache import DiskCache
from stoker.storage.cache_once import fetch_once

#: Bytes read from the end of an object first: most footers fit (Arrow reads 64 KiB too).
FOOTER_PROBE_BYTES = 64 << 10
#: The largest footer a file may claim (a table of tens of thousands of row groups).
MAX_FOOTER_BYTES = 64 << 20
_MAGIC = b"PAR1"


def footer_metadata(
    store: Store, key: str, size: int, *, where: str, etag: str | None, cache: DiskCache
) -> Any:
    """The ``pyarrow.parquet.FileMetaData`` of the object ``key`` (``size`` bytes), from
    the node's disk cache or read once for the node.

    Raises:
        SourceError: The object is too short to be Parquet, does not end in ``PAR1``, or
            its footer claims more than the object or :data:`MAX_FOOTER_BYTES`.
    """
    version = f"{size}:{etag}" if etag else str(size)
    tail = fetch_once(
        cache,
        f"parquet-footer\0{store.url}\0{key}\0{version}",
        lambda: read_footer(store, key, size, where=where),
    )
    pa = import_pyarrow()
    try:
        return pa.parquet.read_metadata(io.BytesIO(_MAGIC + tail))
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise SourceError(f"{where}: cannot read as Parquet: {exc}") from exc


def read_footer(store: Store, key: str, size: int, *, where: str) -> bytes:
    """The footer of the object ``key`` with its length and magic: its last bytes."""
    if size < 12:
        raise SourceError(f"{where}: cannot read as Parquet: {size} bytes is too short")
    probe = min(size, FOOTER_PROBE_BYTES)
    tail = read_object(store, key, size - probe, probe)
    if len(tail) < 8 or tail[-4:] != _MAGIC:
        raise SourceError(f"{where}: cannot read as Parquet: it does not end in {_MAGIC!r}")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size or length > MAX_FOOTER_BYTES:
        raise SourceError(
            f"{where}: cannot read as Parquet: its footer claims {length:,} bytes, in an "
            f"object of {size:,} (at most {MAX_FOOTER_BYTES:,} are read)"
        )
    if length + 8 > len(tail):
        tail = read_object(store, key, size - length - 8, length + 8 - len(tail)) + tail
    return bytes(tail[-(length + 8) :])
