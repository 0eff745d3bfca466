"""Fuzzing the TFRecord reader: record framing and the protobuf parser of tf.train.Example.

Records carry valid CRCs (so the parser, not the checksum, meets the damage) and payloads
that are protobuf-shaped (nested messages whose field numbers are mostly the ones Example
uses, every wire type, lengths that lie) or plain bytes; files are sometimes truncated or
flipped. The reader returns samples or raises SourceError, nothing else.
"""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import google_crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.errors import SourceError
from stoker.format.foreign.tfrecord import TFRecordReader, write_tfrecord

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

numbers = st.sampled_from([1, 1, 1, 2, 2, 3, 0, 4, 15, 2**29 - 1])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _masked(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32)


def _frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + _masked(length) + data + _masked(data)


@st.composite
def leaf(draw: st.DrawFn) -> bytes:
    number = draw(numbers)
    wire = draw(st.sampled_from([0, 1, 2, 2, 2, 3, 5, 6, 7]))
    tag = _varint(number << 3 | wire)
    if wire == 0:
        return tag + _varint(draw(st.integers(0, 2**64 - 1)))
    if wire == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wire == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    if wire == 2:
        payload = draw(st.one_of(st.binary(max_size=24), st.text(max_size=8).map(str.encode)))
        lie = draw(st.sampled_from([0, 0, 0, 1, -1, 2**40]))
        return tag + _varint(max(0, len(payload) + lie)) + payload
    return tag + draw(st.binary(max_size=4))


def _message(parts: tuple[int, list[bytes]]) -> bytes:
    number, children = parts
    body = b"".join(children)
    return _varint(number << 3 | 2) + _varint(len(body)) + body


messages = st.recursive(
    leaf(),
    lambda inner: st.tuples(numbers, st.lists(inner, max_size=4)).map(_message),
    max_leaves=12,
)
payloads = st.one_of(
    st.lists(messages, max_size=4).map(b"".join),
    st.binary(max_size=64),
)


@st.composite
def files(draw: st.DrawFn) -> bytes:
    data = b"".join(_frame(p) for p in draw(st.lists(payloads, min_size=1, max_size=4)))
    damage = draw(st.sampled_from(["none", "none", "none", "truncate", "flip", "garbage"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == "flip":
        position = draw(st.integers(0, len(data) - 1))
        data = data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]
    elif damage == "garbage":
        data += draw(st.binary(min_size=1, max_size=20))
    return data


def _read_all(path: Path, *, verify_crc: bool = True) -> None:
    reader = TFRecordReader(str(path), verify_crc=verify_crc)
    try:
        refs = reader.refs()
        _ = reader.class_names
    except SourceError:
        return
    size = path.stat().st_size
    for ref in refs:
        assert ref.start >= 0
        assert ref.start + ref.length <= size
        try:
            sample = reader.read(ref)
        except SourceError:
            continue
        assert all(isinstance(v, bytes) for v in sample.fields.values())


@FUZZ
@given(data=files(), verify_crc=st.booleans())
def test_tfrecord_reader_raises_only_source_errors(data: bytes, verify_crc: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "fuzz.tfrecord")
        path.write_bytes(data)
        _read_all(path, verify_crc=verify_crc)


@FUZZ
@given(
    image=st.binary(min_size=1, max_size=64),
    label=st.integers(-(2**63), 2**63 - 1),
    text=st.text(max_size=10),
    extra=st.lists(st.floats(width=32), min_size=1, max_size=4),
    position=st.integers(0, 10_000),
    value=st.integers(0, 255),
)
def test_damaged_example_payloads_raise_only_source_errors(
    image: bytes, label: int, text: str, extra: list[float], position: int, value: int
) -> None:
    """A real Example with one byte of its payload changed, and its CRCs made valid again."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "fuzz.tfrecord")
        example = {"image/encoded": image, "label": label, "image/class/text": text, "x": extra}
        write_tfrecord(path, [example])
        payload = bytearray(path.read_bytes()[12:-4])
        payload[position % len(payload)] = value
        path.write_bytes(_frame(bytes(payload)))
        _read_all(path)
