"""``tf.train.Example`` in protobuf's wire format, without protobuf: a small decoder, the
matching encoder (for tests and small inputs), and an Example's features as JSON.

Wire format: https://protobuf.dev/programming-guides/encoding/
"""

from __future__ import annotations

import contextlib
import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.errors import SourceError

_INT64_MASK = (1 << 64) - 1

FeatureValue = bytes | str | int | float | list[Any]


@dataclass(slots=True)
class Example:
    """A decoded ``tf.train.Example``: feature name to values, by list kind."""

    bytes_lists: dict[str, list[bytes]] = field(default_factory=dict)
    float_lists: dict[str, list[float]] = field(default_factory=dict)
    int64_lists: dict[str, list[int]] = field(default_factory=dict)

    def summary(self) -> str:
        kinds: dict[str, Mapping[str, object]] = {
            "bytes_list": self.bytes_lists,
            "float_list": self.float_lists,
            "int64_list": self.int64_lists,
        }
        return ", ".join(
            sorted(f"{name} ({kind})" for kind, lists in kinds.items() for name in lists)
        )


def json_document(example: Example, *, skip: set[str | None]) -> dict[str, object]:
    """The features as JSON values, one value for a list of one, less those in ``skip``
    (binary bytes have no JSON form and are left out)."""
    doc: dict[str, list[Any]] = {}
    for name, raw in example.bytes_lists.items():
        with contextlib.suppress(UnicodeDecodeError):  # binary payloads have no JSON form
            doc[name] = [value.decode("utf-8") for value in raw]
    for name, floats in example.float_lists.items():
        # str(np.float32) is the shortest text that reads back as the same float32.
        doc[name] = [float(str(np.float32(v))) if math.isfinite(v) else None for v in floats]
    doc.update(example.int64_lists)
    return {
        name: values[0] if len(values) == 1 else values
        for name, values in doc.items()
        if name not in skip
    }


def decode_example(data: bytes, where: str) -> Example:
    """Decode a serialized ``tf.train.Example``.

    Raises:
        SourceError: It is not one (``where`` names it).
    """
    example = Example()
    try:
        for number, wire, start, stop in _fields(data, 0, len(data)):
            if (number, wire) == (1, 2):  # Example.features; repeats merge, as in protobuf
                _decode_features(data, start, stop, example)
    except (ValueError, struct.error) as exc:
        raise SourceError(f"{where}: not a tf.train.Example: {exc}") from exc
    return example


def _decode_features(data: bytes, start: int, stop: int, example: Example) -> None:
    for number, wire, entry_start, entry_stop in _fields(data, start, stop):
        if (number, wire) != (1, 2):
            continue
        name, kind, a, b = "", 0, 0, 0
        for entry_number, entry_wire, c, d in _fields(data, entry_start, entry_stop):
            if (entry_number, entry_wire) == (1, 2):
                name = data[c:d].decode("utf-8")
            elif (entry_number, entry_wire) == (2, 2):
                for feature_number, feature_wire, e, f in _fields(data, c, d):
                    if feature_number in (1, 2, 3) and feature_wire == 2:
                        kind, a, b = feature_number, e, f  # a oneof: the last one wins
        for lists in (example.bytes_lists, example.float_lists, example.int64_lists):
            lists.pop(name, None)  # a repeated map key: the last entry wins
        values = [(w, c, d) for n, w, c, d in _fields(data, a, b) if n == 1]
        if kind == 1:
            example.bytes_lists[name] = [data[c:d] for w, c, d in values if w == 2]
        elif kind == 2:
            floats: list[float] = []
            for w, c, d in values:
                if w == 5 or (w == 2 and (d - c) % 4 == 0):  # one float, or packed floats
                    floats.extend(struct.unpack_from(f"<{(d - c) // 4}f", data, c))
                elif w == 2:
                    raise ValueError(f"packed float list of {d - c} bytes")
            example.float_lists[name] = floats
        elif kind == 3:
            ints: list[int] = []
            for w, c, d in values:
                while w == 2 and c < d:  # packed
                    value, c = _varint(data, c, d)
                    ints.append(_signed(value))
                if w == 0:
                    ints.append(_signed(c))
            example.int64_lists[name] = ints


def _fields(data: bytes, pos: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(number, wire type, a, b)``: a varint's value as ``a``, else its byte range."""
    while pos < stop:
        tag, pos = _varint(data, pos, stop)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(data, pos, stop)
            yield number, wire, value, 0
            continue
        if wire == 2:
            length, pos = _varint(data, pos, stop)
        elif wire in (1, 5):
            length = 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire} at byte {pos}")
        if pos + length > stop:
            raise ValueError(f"field {number} overruns its message at byte {pos}")
        yield number, wire, pos, pos + length
        pos += length


def _varint(data: bytes, pos: int, stop: int) -> tuple[int, int]:
    result = shift = 0
    while pos < stop and shift < 70:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _INT64_MASK, pos
        shift += 7
    raise ValueError(f"bad varint ending at byte {pos}")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def encode_example(example: Mapping[str, FeatureValue]) -> bytes:
    """Serialize features as a ``tf.train.Example`` (see
    :func:`~stoker.format.foreign.tfrecord.write_tfrecord` for the kinds).

    Raises:
        ValueError: A value of another type, an empty list, or an int outside int64.
    """
    entries = b"".join(
        _field(1, _field(1, name.encode()) + _field(2, _encode_feature(name, value)))
        for name, value in example.items()
    )
    return _field(1, entries)


def _encode_feature(name: str, value: FeatureValue) -> bytes:
    values: list[Any] = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError(f"feature {name!r}: cannot tell the kind of an empty list")
    if all(isinstance(v, bytes | str) for v in values):
        return _field(
            1, b"".join(_field(1, v.encode() if isinstance(v, str) else v) for v in values)
        )
    if all(isinstance(v, int) for v in values):
        if not all(-(1 << 63) <= v < 1 << 63 for v in values):
            raise ValueError(f"feature {name!r}: int outside int64")
        return _field(3, _field(1, b"".join(_encode_varint(v & _INT64_MASK) for v in values)))
    if all(isinstance(v, int | float) for v in values):
        return _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)))
    raise ValueError(f"feature {name!r}: expected bytes, str, int, float or a list of one")


def _field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
