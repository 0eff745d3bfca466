"""One POSIX ustar header block: writing ours, and reading any tar's header fields safely
(numbers, checksums, pax and GNU long-name records, member names). Walking a tar's members
is :mod:`stoker.format.tar`. Every refusal is a :class:`ValueError` whose text says what is
wrong; callers add where.
"""

from __future__ import annotations

import re

from stoker.format.spec import MEMBER_MTIME, TAR_BLOCK

#: Type flags of members whose data is a file's bytes (``7`` is a contiguous file).
REGULAR_TYPES = frozenset({b"0", b"\0", b"7"})
#: Directory, GNU dump directory, GNU volume label: no data a sample could use.
DIRECTORY_TYPES = frozenset({b"5", b"D", b"V"})
#: pax extended (``x``, next member) and global (``g``) records.
PAX_TYPES = frozenset({b"x", b"g"})
#: GNU long name (``L``) and long link name (``K``) of the next member.
GNU_LONG_TYPES = frozenset({b"L", b"K"})
#: Member types refused wherever they appear, with what they are.
REFUSED_TYPES = {
    b"1": "a hard link",
    b"2": "a symbolic link",
    b"3": "a character device",
    b"4": "a block device",
    b"6": "a fifo",
    b"S": "a GNU sparse file",
    b"M": "a GNU multi-volume continuation",
}
_MAX_DIGITS = 20  # more digits than any real length; int() of huge strings is slow
_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HIGH_BYTES = re.compile(rb"[\x80-\xff]")


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


def header_number(raw: bytes, field: str) -> int:
    """A numeric header field: octal text, or GNU base-256 (high bit of the first byte set).

    Raises:
        ValueError: Not octal digits, or a negative base-256 number.
    """
    if raw[:1] and raw[0] & 0x80:
        if raw[0] == 0xFF:
            raise ValueError(f"negative {field} field")
        return int.from_bytes(bytes([raw[0] & 0x7F]) + raw[1:], "big")
    text = raw.split(b"\0", 1)[0].strip(b" ")
    if text.strip(b"01234567"):
        raise ValueError(f"bad {field} field {raw!r}")
    return int(text, 8) if text else 0


def check_header(header: bytes) -> None:
    """Check a header block's checksum (unsigned, or signed as some old writers summed).

    Raises:
        ValueError: The checksum field is not a number or does not match.
    """
    stored = header_number(header[148:156], "checksum")
    rest = header[:148] + header[156:]
    unsigned = sum(rest) + 8 * ord(" ")
    if stored == unsigned:  # the usual case: no need for the signed sum
        return
    signed = unsigned - 256 * len(_HIGH_BYTES.findall(rest))
    if stored != signed:
        raise ValueError(
            f"bad header checksum (stored {stored}, computed {unsigned}; corrupt or not a tar)"
        )


def pax_records(raw: bytes) -> dict[str, bytes]:
    """The ``LENGTH KEY=VALUE\\n`` records of a pax header's data.

    Raises:
        ValueError: A malformed record or a key that is not UTF-8.
    """
    records: dict[str, bytes] = {}
    pos = 0
    while pos < len(raw) and raw[pos] != 0:
        space = raw.find(b" ", pos, pos + _MAX_DIGITS + 1)
        digits = raw[pos:space] if space > pos else b""
        length = int(digits) if digits.isdigit() else 0
        record = raw[space + 1 : pos + length]
        key, sep, value = record[:-1].partition(b"=")
        if length <= 0 or pos + length > len(raw) or not record.endswith(b"\n") or not sep:
            raise ValueError(f"malformed pax record at byte {pos}")
        try:
            records[key.decode("utf-8")] = value
        except UnicodeDecodeError:
            raise ValueError(f"pax record at byte {pos} has a non-UTF-8 key") from None
        pos += length
    return records


def global_pax_records(raw: bytes) -> dict[str, bytes]:
    """The records of a pax global (``g``) header, which apply to every later member.

    Records that change how a member is read (its path or size) are refused: a sample's span
    is read on its own, without the headers before it, so it must mean the same alone.

    Raises:
        ValueError: A malformed record, or one that sets ``path`` or ``size``.
    """
    records = pax_records(raw)
    for key in ("path", "size"):
        if records.get(key):
            raise ValueError(f"a global pax header sets {key!r} for every later member")
    return records


def pax_size(value: bytes) -> int:
    """A pax ``size`` record's value.

    Raises:
        ValueError: Not decimal digits.
    """
    if not value.isdigit() or len(value) > _MAX_DIGITS:
        raise ValueError(f"bad pax size {value[:40]!r}")
    return int(value)


def member_name(header: bytes, pax: dict[str, bytes], long_name: bytes | None) -> str:
    """The member's path: a pax ``path``, else a GNU long name, else prefix and name fields.

    Raises:
        ValueError: The name is not UTF-8, or :func:`check_member_name` refuses it.
    """
    if pax.get("path"):
        raw = pax["path"]
    elif long_name is not None:
        raw = long_name
    else:
        raw = header[:100].split(b"\0", 1)[0]
        prefix = header[345:500].split(b"\0", 1)[0]
        # Only POSIX ustar headers have a prefix field; GNU headers keep other data there.
        if header[257:265] == b"ustar\x0000" and prefix:
            raw = prefix + b"/" + raw
    try:
        path = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"member name {raw[:120]!r} is not UTF-8") from None
    check_member_name(path)
    return path


def check_member_name(path: str) -> None:
    """Refuse member names that could escape a directory, or that mean different things to
    different tools: absolute paths, drive letters, ``..`` segments, backslashes, control
    characters (NUL included).

    Raises:
        ValueError: Naming the member and what is wrong with its name.
    """
    problem = None
    if path.startswith("/") or _DRIVE.match(path):
        problem = "an absolute path"
    elif ".." in path.split("/"):
        problem = "a '..' path segment"
    elif "\\" in path:
        problem = "a backslash"
    elif _CONTROL.search(path):
        problem = "a control character"
    if problem is not None:
        raise ValueError(f"member {path!r} has {problem}; not allowed")
