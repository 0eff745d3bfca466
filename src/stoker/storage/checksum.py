"""ETag checks: does a local file hold the same bytes as an object?

S3 gives a single-part object the hex MD5 of its bytes as ETag, and a multipart object the MD5
of its parts' MD5 digests followed by ``-N`` (N parts). Other stores' ETags are opaque; for
them :func:`etag_matches` answers None (unknown).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

_PLAIN = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART = re.compile(r"^([0-9a-f]{32})-(\d+)$")
_READ_BYTES = 8 * 1024 * 1024
MiB = 1024 * 1024
# Part sizes of common uploaders, tried when an ETag's part count fits them.
_COMMON_PART_SIZES = (8 * MiB, 5 * MiB, 16 * MiB, 64 * MiB, 15 * MiB, 100 * MiB)


def md5_hex(data: bytes | bytearray | memoryview) -> str:
    """Hex MD5 of ``data``."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def multipart_etag(path: Path, part_size_bytes: int) -> str:
    """The S3 ETag that ``path`` gets when uploaded in parts of ``part_size_bytes``."""
    digests = []
    with open(path, "rb") as f:
        while chunk := f.read(part_size_bytes):
            digests.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    if len(digests) <= 1:
        return md5_file(path)
    combined = hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()
    return f"{combined}-{len(digests)}"


def md5_file(path: Path) -> str:
    """Hex MD5 of a local file's bytes."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def etag_matches(path: Path, etag: str | None, *, part_size_bytes: int) -> bool | None:
    """Whether the local file's content matches an S3-style ETag; None if it cannot tell."""
    if not etag:
        return None
    etag = etag.strip('"').lower()
    if _PLAIN.match(etag):
        return md5_file(path) == etag
    match = _MULTIPART.match(etag)
    if not match:
        return None
    parts = int(match.group(2))
    size = path.stat().st_size
    tried = False
    for candidate in dict.fromkeys((part_size_bytes, *_COMMON_PART_SIZES)):
        if -(-size // candidate) == parts:
            tried = True
            if multipart_etag(path, candidate) == etag:
                return True
    return False if tried else None


def md5_tree(root: Path) -> dict[str, str]:
    """Relative POSIX path -> hex MD5 of every file under ``root`` (read in chunks)."""
    return {
        p.relative_to(root).as_posix(): md5_file(p) for p in sorted(root.rglob("*")) if p.is_file()
    }
