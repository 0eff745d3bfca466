"""POSIX ustar member headers: writing ours, and reading any tar's headers safely.

The header-reading helpers are shared by the shard reader (:func:`parse_members`, one sample's
span) and the WebDataset importer (:func:`stoker.format.foreign.wds_tar.scan_tar`, whole
tars), so that a tar ``stoker index`` accepts is a tar the reader can read. They accept the
ustar members stoker writes and what other writers add (pax ``x``/``g`` records, GNU
long names, GNU base-256 sizes, old signed checksums), and refuse links, devices, fifos,
sparse files, and names that are absolute, contain a ``..`` segment, a backslash or a
control character. Every refusal is a :class:`ValueError` whose text says what is wrong;
callers add where.
"""

from __future__ import annotations

import re

from stoker.errors import ShardFormatError
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


def parse_members(span: bytes | memoryview, *, where: str) -> dict[str, bytes]:
    """Split one sample's span (headers and data of its members) into ``{ext: bytes}``.

    The extension is the member's base name after its first ``.``, lower-cased; members
    without one are skipped, as WebDataset does. pax and GNU long-name headers are applied
    to the member they precede.

    Raises:
        ShardFormatError: A corrupt header, a member that runs past the span, an unsafe or
            refused member (see the module docstring), a directory entry, or an extension
            that appears twice; the message names ``where`` and the member.
    """
    view = memoryview(span).cast("B")
    end = len(view)
    fields: dict[str, bytes] = {}
    global_pax: dict[str, bytes] = {}
    pax: dict[str, bytes] = {}
    long_name: bytes | None = None
    extended_at: int | None = None  # an extended header waiting for its member
    position = 0
    while position < end:
        if position + TAR_BLOCK > end:
            raise ShardFormatError(f"{where}: span ends inside a tar header at byte {position}")
        header = view[position : position + TAR_BLOCK].tobytes()
        if not any(header):
            if any(view[position:]):
                raise ShardFormatError(
                    f"{where}: end-of-archive block at byte {position} inside the sample"
                )
            break
        kind = header[156:157]
        try:
            check_header(header)
            size = header_number(header[124:136], "size")
            if kind not in PAX_TYPES and kind not in GNU_LONG_TYPES:
                declared = {**global_pax, **pax}.get("size")
                size = pax_size(declared) if declared else size
        except ValueError as exc:
            raise ShardFormatError(f"{where}: tar header at byte {position}: {exc}") from None
        data_start = position + TAR_BLOCK
        if size > end - data_start:
            raise ShardFormatError(
                f"{where}: member at byte {position} declares {size} bytes of data, "
                f"past the end of the {end}-byte sample"
            )
        data = view[data_start : data_start + size].tobytes()
        header_at, position = position, data_start + padded(size)
        if kind in PAX_TYPES or kind in GNU_LONG_TYPES:
            extended_at = header_at if extended_at is None else extended_at
            try:
                if kind == b"g":
                    records = global_pax_records(data)
                    global_pax = {k: v for k, v in {**global_pax, **records}.items() if v}
                elif kind == b"x":
                    pax.update(pax_records(data))
                elif kind == b"L":
                    long_name = data.split(b"\0", 1)[0]
            except ValueError as exc:
                raise ShardFormatError(f"{where}: tar header at byte {header_at}: {exc}") from None
            continue
        merged = {**global_pax, **pax}
        try:
            name = member_name(header, merged, long_name)
        except ValueError as exc:
            raise ShardFormatError(f"{where}: tar header at byte {header_at}: {exc}") from None
        pax, long_name, extended_at = {}, None, None
        problem = None
        if kind in REFUSED_TYPES:
            problem = f"is {REFUSED_TYPES[kind]}"
        elif kind in DIRECTORY_TYPES or name.endswith("/"):
            problem = "is a directory entry"
        elif kind not in REGULAR_TYPES:
            problem = f"has unsupported type {kind.decode('latin-1')!r}"
        elif any(k.startswith("GNU.sparse.") for k in merged):
            problem = "is a GNU sparse file"
        if problem is not None:
            raise ShardFormatError(f"{where}: member {name!r} {problem}; not allowed")
        base = name.rsplit("/", 1)[-1]
        if "." not in base:
            continue
        ext = base.split(".", 1)[1].lower()
        if ext in fields:
            raise ShardFormatError(f"{where}: two {ext!r} members (the second is {name!r})")
        fields[ext] = data
    if extended_at is not None:
        raise ShardFormatError(
            f"{where}: extended header at byte {extended_at} is not followed by a member"
        )
    return fields
