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

_UNSAFE_KEY = re.compile(r"[\\\x00-\x1f\x7f]|^[A-Za-z]:")


#: Most key prefixes a dataset's shards may be spread over (three hex digits' worth).
MAX_PREFIXES = 4096


def shard_name(index: int) -> str:
    """Object name of shard number ``index``: ``shard-000000.tar``."""
    return f"shard-{index:06d}.tar"


def prefix_labels(prefixes: int) -> list[str]:
    """The folder names shards are spread over: none for 1, else ``prefixes`` hex labels.

    Labels are evenly spaced over the hex key space (4 gives ``00 40 80 c0``), at least two
    digits wide, so that neighbouring prefixes differ in their first character where they
    can and S3 can split them into partitions of their own.
    """
    if not 1 <= prefixes <= MAX_PREFIXES:
        raise ValueError(f"prefixes must be between 1 and {MAX_PREFIXES}, got {prefixes}")
    if prefixes == 1:
        return []
    width = max(2, ((prefixes - 1).bit_length() + 3) // 4)
    return [f"{p * 16**width // prefixes:0{width}x}" for p in range(prefixes)]


def shard_key(index: int, *, prefixes: int = 1) -> str:
    """Key of shard number ``index`` in a dataset spread over ``prefixes`` prefixes.

    With one prefix, the flat name (``shard-000005.tar``); with more, shard ``n`` goes
    under label ``n % prefixes`` of :func:`prefix_labels` (``40/shard-000005.tar`` of 4),
    so every prefix holds the same number of shards, give or take one.
    """
    labels = prefix_labels(prefixes)
    name = shard_name(index)
    return f"{labels[index % prefixes]}/{name}" if labels else name


def check_key(key: str) -> None:
    """Raise ValueError unless ``key`` can be a WebDataset sample key in our shards.

    A key's last segment has no ``.`` (WebDataset splits a member's base name at its first
    dot; folders before it may have dots: ``v1.2/0001``), the key does not start with ``/``
    or a drive letter (``C:``), has no empty, ``.`` or ``..`` segments, no backslash and no
    control character, and is at most 200 bytes of UTF-8: readers refuse member names that
    could escape a directory they are extracted into.
    """
    parts = key.split("/")
    if (
        "." in parts[-1]
        or _UNSAFE_KEY.search(key)
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(
            f"invalid sample key {key!r}: a key's last segment may not contain '.', and keys "
            "may not contain a backslash or a control character, start with '/' or a drive "
            "letter, or have empty, '.' or '..' segments"
        )
    if len(key.encode("utf-8")) > 200:
        raise ValueError(f"sample key {key[:40]!r}... is longer than 200 bytes")


_EXTENSION_ALIASES = {"jpeg": "jpg", "jpe": "jpg", "tif": "tiff"}

#: Field extensions that hold an encoded image, as pack writes them (normalised).
IMAGE_FIELDS = ("jpg", "png", "webp", "bmp", "tiff", "gif")
#: The same with their aliases, each after its own name: what a reader looks for in a
#: sample, since shards indexed in place (a WebDataset tar) keep their members' names.
IMAGE_FIELD_NAMES = tuple(
    name
    for ext in IMAGE_FIELDS
    for name in (ext, *(a for a, e in _EXTENSION_ALIASES.items() if e == ext))
)


def normalise_extension(ext: str) -> str:
    """Lower-case field extension with common aliases folded (``JPEG`` -> ``jpg``)."""
    ext = ext.lower().lstrip(".")
    return _EXTENSION_ALIASES.get(ext, ext)


def sniff_image_extension(data: bytes) -> str:
    """Field extension of encoded image bytes from their magic: jpg, png, webp, else bin."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "bin"


#: Images with more pixels than this are refused before decoding, as decompression bombs.
#: Pillow's own warning threshold (about 9,459 x 9,459), so no image under it trips Pillow's.
DEFAULT_MAX_PIXELS = 89_478_485

#: Start-of-frame markers carry a JPEG's size (all SOFn except DHT, JPG and DAC).
JPEG_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def declared_image_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """``(width, height)`` as a JPEG, PNG, GIF, BMP or WebP header declares it, or None.

    Reads only the header, so it costs microseconds and allocates nothing whatever the
    size declared: the check against a pixel limit that must come before any decoder runs.
    None means another format, or a header too damaged to say (a decoder will refuse it).
    """
    head = bytes(data[:65536])
    if head.startswith(b"\xff\xd8"):
        return _jpeg_declared_size(head)
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR" and len(head) >= 24:
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")
    if head.startswith(b"BM") and len(head) >= 26:
        if int.from_bytes(head[14:18], "little") == 12:  # OS/2 core header: 16-bit fields
            return int.from_bytes(head[18:20], "little"), int.from_bytes(head[20:22], "little")
        width = int.from_bytes(head[18:22], "little", signed=True)
        height = int.from_bytes(head[22:26], "little", signed=True)  # negative: top-down
        return abs(width), abs(height)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) >= 30:
        chunk = head[12:16]
        if chunk == b"VP8X":
            width = int.from_bytes(head[24:27], "little") + 1
            return width, int.from_bytes(head[27:30], "little") + 1
        if chunk == b"VP8L" and head[20] == 0x2F:
            bits = int.from_bytes(head[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8 ":
            width = int.from_bytes(head[26:28], "little") & 0x3FFF
            return width, int.from_bytes(head[28:30], "little") & 0x3FFF
    return None


def _jpeg_declared_size(head: bytes) -> tuple[int, int] | None:
    position = 2
    while position + 9 <= len(head) and head[position] == 0xFF:
        marker = head[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            position += 2
            continue
        if marker in JPEG_SOF_MARKERS:
            height = int.from_bytes(head[position + 5 : position + 7], "big")
            return int.from_bytes(head[position + 7 : position + 9], "big"), height
        if marker == 0xDA:
            return None
        position += 2 + int.from_bytes(head[position + 2 : position + 4], "big")
    return None
