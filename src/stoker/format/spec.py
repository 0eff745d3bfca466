"""Constants of the shard and index format; docs/FORMAT.md is the byte-level spec."""

from __future__ import annotations

import re

FORMAT_NAME = "stoker-shards"
FORMAT_VERSION = 1

MANIFEST_NAME = "index.json"
ARRAYS_NAME = "index.bin"
ARRAYS_MAGIC = b"STKIDX01"
PACK_STATE_DIR = "_stoker"

TAR_BLOCK = 512
# Members carry this fixed time so that packing the same input twice gives identical shards.
MEMBER_MTIME = 0

_KEY = re.compile(r"^[^./][^.]*$")
_UNSAFE_KEY = re.compile(r"[\\\x00-\x1f\x7f]|^[A-Za-z]:")


def shard_name(index: int) -> str:
    """Object name of shard number ``index``: ``shard-000000.tar``."""
    return f"shard-{index:06d}.tar"


def check_key(key: str) -> None:
    """Raise ValueError unless ``key`` can be a WebDataset sample key in our shards.

    A key has no ``.`` (WebDataset splits member names at the first dot), does not start
    with ``/`` or a drive letter (``C:``), has no empty or ``..`` segments, no backslash and
    no control character, and is at most 200 bytes of UTF-8: readers refuse member names
    that could escape a directory they are extracted into.
    """
    if (
        not _KEY.match(key)
        or _UNSAFE_KEY.search(key)
        or any(part in ("", "..") for part in key.split("/"))
    ):
        raise ValueError(
            f"invalid sample key {key!r}: keys may not contain '.', a backslash or a control "
            "character, start with '/' or a drive letter, or have empty or '..' segments"
        )
    if len(key.encode("utf-8")) > 200:
        raise ValueError(f"sample key {key[:40]!r}... is longer than 200 bytes")


def normalise_extension(ext: str) -> str:
    """Lower-case field extension with common aliases folded (``JPEG`` -> ``jpg``)."""
    ext = ext.lower().lstrip(".")
    return {"jpeg": "jpg", "tif": "tiff"}.get(ext, ext)


def sniff_image_extension(data: bytes) -> str:
    """Field extension of encoded image bytes from their magic: jpg, png, webp, else bin."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "bin"
