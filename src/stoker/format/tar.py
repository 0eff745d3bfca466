"""POSIX ustar member headers: writing ours and parsing them inside one sample's span."""

from __future__ import annotations

from stoker.errors import ShardFormatError
from stoker.format.spec import MEMBER_MTIME, TAR_BLOCK


def padded(size: int) -> int:
    """``size`` rounded up to a whole number of 512-byte blocks."""
    return -(-size // TAR_BLOCK) * TAR_BLOCK


def _octal(value: int, width: int) -> bytes:
    text = f"{value:0{width - 1}o}".encode("ascii")
    if len(text) > width - 1:
        raise ValueError(f"{value} does not fit a {width}-byte tar field")
    return text + b"\0"


def member_header(name: str, size: int) -> bytes:
    """A ustar header block for a regular file ``name`` of ``size`` bytes.

    Names longer than 100 bytes are split at a ``/`` into the 155-byte prefix field.
    Sizes up to 8 GiB fit the classic octal field.

    Raises:
        ValueError: The name cannot be represented in ustar.
    """
    raw = name.encode("utf-8")
    prefix = b""
    if len(raw) > 100:
        cut = raw.rfind(b"/", 0, 156)
        if cut <= 0 or len(raw) - cut - 1 > 100:
            raise ValueError(f"member name {name!r} is too long for a ustar header")
        prefix, raw = raw[:cut], raw[cut + 1 :]
    header = bytearray(TAR_BLOCK)
    header[0 : len(raw)] = raw
    header[100:108] = _octal(0o644, 8)
    header[108:116] = _octal(0, 8)
    header[116:124] = _octal(0, 8)
    header[124:136] = _octal(size, 12)
    header[136:148] = _octal(MEMBER_MTIME, 12)
    header[148:156] = b" " * 8
    header[156:157] = b"0"
    header[257:265] = b"ustar\x0000"
    header[345 : 345 + len(prefix)] = prefix
    checksum = sum(header)
    header[148:156] = f"{checksum:06o}\0 ".encode("ascii")
    return bytes(header)


def parse_members(span: bytes | memoryview, *, where: str) -> dict[str, bytes]:
    """Split one sample's span (headers and data of its members) into ``{ext: bytes}``.

    Handles the ustar members stoker writes and the pax (``x``) and GNU long-name (``L``)
    headers that other WebDataset writers add.

    Raises:
        ShardFormatError: A header is corrupt or a member runs past the span.
    """
    view = memoryview(span)
    fields: dict[str, bytes] = {}
    position = 0
    long_name: str | None = None
    while position + TAR_BLOCK <= len(view):
        header = view[position : position + TAR_BLOCK]
        if not any(header):
            break
        stored = header[148:156].tobytes().split(b"\0", 1)[0].strip()
        expected = sum(header[:148]) + 8 * 32 + sum(header[156:])
        try:
            size = int(header[124:136].tobytes().split(b"\0", 1)[0].strip() or b"0", 8)
            valid = int(stored, 8) == expected
        except ValueError:
            valid = False
        if not valid:
            raise ShardFormatError(f"{where}: corrupt tar header at byte {position} of sample")
        kind = header[156:157].tobytes()
        data_start = position + TAR_BLOCK
        data_end = data_start + size
        if data_end > len(view):
            raise ShardFormatError(f"{where}: member at byte {position} runs past the sample")
        data = view[data_start:data_end]
        position = data_start + padded(size)
        if kind == b"L":
            long_name = data.tobytes().rstrip(b"\0").decode("utf-8")
            continue
        if kind == b"x":
            for record in data.tobytes().decode("utf-8").splitlines():
                _, _, pair = record.partition(" ")
                k, _, v = pair.partition("=")
                if k == "path":
                    long_name = v
            continue
        if kind not in (b"0", b"\0"):
            continue
        name = long_name or _header_name(header)
        long_name = None
        base = name.rsplit("/", 1)[-1]
        ext = base.split(".", 1)[1] if "." in base else ""
        fields[ext.lower()] = data.tobytes()
    return fields


def _header_name(header: memoryview) -> str:
    name = header[0:100].tobytes().split(b"\0", 1)[0]
    prefix = header[345:500].tobytes().split(b"\0", 1)[0]
    full = prefix + b"/" + name if prefix else name
    return full.decode("utf-8")
