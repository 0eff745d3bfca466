"""Fuzzing the tar parsers: the shard reader's ``parse_members`` and the importer's ``scan_tar``.

Inputs are built from headers with valid checksums (random bytes alone almost never get past
the checksum), with hostile names, every type flag, odd size fields, pax and GNU long-name
records, then optionally mutated or truncated. Whatever the input, the parsers return or
raise our own errors; and where ``scan_tar`` accepts a tar, ``parse_members`` reads each of
its sample spans to the same members (the ``stoker index`` path depends on that).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.errors import ShardFormatError, SourceError
from stoker.format.foreign.wds_tar import scan_tar
from stoker.format.tar import member_header, parse_members

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

NASTY_NAMES = [
    b"k.jpg",
    b"k.cls",
    b"k.JPG",
    b"k",
    b"k.",
    b".jpg",
    b"dir/",
    b"dir/k.jpg",
    b"./k.jpg",
    b"../k.jpg",
    b"a/../../k.jpg",
    b"/etc/k.jpg",
    b"a\\..\\k.jpg",
    b"C:k.jpg",
    b"a\x01b.jpg",
    b"a\x7fb.jpg",
    b"v1.2/k.jpg",
    b"\xff\xfe.jpg",
    b"k.tar.gz",
]
TYPES = [b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"x", b"g", b"L", b"K"]
TYPES += [b"S", b"M", b"D", b"V", b"A", b"\xff"]

names = st.one_of(st.sampled_from(NASTY_NAMES), st.binary(max_size=110))
pax_keys = st.sampled_from([b"path", b"size", b"linkpath", b"GNU.sparse.map", b"mtime", b"\xff"])
pax_values = st.one_of(
    st.sampled_from(
        [b"k.jpg", b"../k.jpg", b"/abs.jpg", b"3", b"-1", b"9" * 30, b"1_0", b"", b"0x10"]
    ),
    st.binary(max_size=40),
)


@st.composite
def pax_block(draw: st.DrawFn) -> bytes:
    """pax records, mostly well formed, sometimes with a wrong length or no newline."""
    out = b""
    for key, value in draw(st.lists(st.tuples(pax_keys, pax_values), max_size=3)):
        body = b" " + key + b"=" + value + b"\n"
        length = len(body) + len(str(len(body) + 3))
        length = next(n for n in range(length - 1, length + 3) if len(str(n)) + len(body) == n)
        record = str(length).encode() + body
        mangle = draw(st.sampled_from(["none", "none", "length", "newline", "digits"]))
        if mangle == "length":
            record = str(length + draw(st.integers(-5, 5))).encode() + body
        elif mangle == "newline":
            record = record[:-1] + b"X"
        elif mangle == "digits":
            record = b"9" * draw(st.integers(20, 5000)) + body
        out += record
    return out


def size_field(draw: st.DrawFn, actual: int) -> bytes:
    kind = draw(st.sampled_from(["octal", "octal", "octal", "other", "base256", "junk"]))
    if kind == "octal":
        value = actual
    elif kind == "other":
        value = draw(st.integers(0, 0o77777777777))
    if kind in ("octal", "other"):
        return f"{value:011o}".encode() + b"\0"
    if kind == "base256":
        first = draw(st.sampled_from([0x80, 0xFF]))
        return bytes([first]) + draw(st.integers(0, 2**80)).to_bytes(11, "big")[-11:]
    return draw(st.binary(min_size=12, max_size=12))


def header(name: bytes, typeflag: bytes, size: bytes, *, prefix: bytes, ustar: bool) -> bytes:
    block = bytearray(512)
    block[0 : len(name[:100])] = name[:100]
    block[100:108] = b"0000644\0"
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    block[124:136] = size
    block[136:148] = b"00000000000\0"
    block[156:157] = typeflag
    block[257:265] = b"ustar\x0000" if ustar else b"ustar  \0"
    block[345 : 345 + len(prefix[:155])] = prefix[:155]
    block[148:156] = b" " * 8
    block[148:156] = f"{sum(block):06o}\0 ".encode()
    return bytes(block)


GOOD_NAMES = [b"k.jpg", b"k.cls", b"k.seg.png", b"a/k.jpg", b"a/k.cls", b"b.jpg", b"k", b"d/"]
GOOD_TYPES = [b"0", b"0", b"0", b"\0", b"7", b"x", b"g", b"L", b"5"]


@st.composite
def member(draw: st.DrawFn) -> bytes:
    """One member: usually well formed (so parsing gets deep), sometimes hostile."""
    hostile = draw(st.integers(0, 3)) == 0
    typeflag = draw(st.sampled_from(TYPES if hostile else GOOD_TYPES))
    if typeflag in (b"x", b"g"):
        if hostile:
            data = draw(pax_block())
        else:
            record = b" path=" + draw(st.sampled_from(GOOD_NAMES)) + b"\n"
            data = str(len(record) + 2).encode() + record
    elif typeflag in (b"L", b"K"):
        data = draw(names if hostile else st.sampled_from(GOOD_NAMES)) + b"\0"
    else:
        data = draw(st.binary(max_size=1200))
    size = size_field(draw, len(data)) if hostile else f"{len(data):011o}\0".encode()
    prefix = draw(
        st.sampled_from([b"", b"", b"dir", b"..", b"/abs", b"\xff"] if hostile else [b""])
    )
    name = draw(names if hostile else st.sampled_from(GOOD_NAMES))
    block = header(name, typeflag, size, prefix=prefix, ustar=draw(st.booleans()))
    return block + data + bytes(-len(data) % 512)


@st.composite
def tars(draw: st.DrawFn) -> bytes:
    data = b"".join(draw(st.lists(member(), max_size=8)))
    if draw(st.integers(0, 4)):
        data += bytes(1024)
    if data and draw(st.integers(0, 3)) == 0:  # flip bytes (checksums then mostly fail)
        for _ in range(draw(st.integers(1, 3))):
            position = draw(st.integers(0, len(data) - 1))
            data = data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]
    if data and draw(st.integers(0, 7)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return data


@st.composite
def valid_spans(draw: st.DrawFn) -> bytes:
    """Spans as ShardWriter writes them, then mutated."""
    key = draw(st.from_regex(r"[a-z0-9_]{1,12}", fullmatch=True))
    span = b""
    for ext in draw(st.lists(st.sampled_from(["jpg", "cls", "json"]), unique=True, min_size=1)):
        data = draw(st.binary(max_size=700))
        span += member_header(f"{key}.{ext}", len(data)) + data + bytes(-len(data) % 512)
    for _ in range(draw(st.integers(0, 2))):
        position = draw(st.integers(0, len(span) - 1))
        span = span[:position] + bytes([draw(st.integers(0, 255))]) + span[position + 1 :]
    if draw(st.booleans()):
        span = span[: draw(st.integers(0, len(span)))]
    return span


def _parse(span: bytes) -> dict[str, bytes] | None:
    try:
        fields = parse_members(span, where="fuzz")
    except ShardFormatError:
        return None
    assert all(isinstance(k, str) and isinstance(v, bytes) for k, v in fields.items())
    assert sum(len(v) for v in fields.values()) <= len(span)
    return fields


@FUZZ
@given(span=st.one_of(tars(), valid_spans(), st.binary(max_size=2048)))
def test_parse_members_raises_only_shard_format_errors(span: bytes) -> None:
    _parse(span)


@FUZZ
@given(data=st.one_of(tars(), st.binary(max_size=2048)))
def test_scan_tar_raises_only_source_errors(data: bytes) -> None:
    try:
        samples = scan_tar(data, name="fuzz.tar")
    except SourceError:
        return
    previous_end = 0
    for sample in samples:
        assert previous_end <= sample.span_start < sample.span_end <= len(data)
        previous_end = sample.span_end
        for _, offset, size in sample.members:
            assert sample.span_start < offset
            assert offset + size <= sample.span_end
        # What scan_tar accepts, the shard reader reads to the same members.
        span = data[sample.span_start : sample.span_end]
        expected: dict[str, Any] = {
            ext: data[offset : offset + size] for ext, offset, size in sample.members
        }
        assert parse_members(span, where="fuzz") == expected
