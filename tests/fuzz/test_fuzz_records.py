"""Fuzzing the member decoders of any record: npy, JSON, UTF-8 text and integers.

The Loader skips or raises a bad sample only when its decoder raises ValueError, and pack
refuses one the same way; any other exception (RecursionError from deeply nested JSON, a
numpy TypeError) would stop training whatever ``on_error`` says. Inputs are arbitrary
bytes, valid members with bytes overwritten, cut or extended, and ``npy`` headers written
field by field with lying shapes, odd dtypes and data of the wrong length.

``decode_npy`` allocates no more than its input implies: a header declaring a billion
items over a few bytes of data is refused before anything of that size is made (measured
with tracemalloc, which sees numpy's buffers).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.format import records
from stoker.format.records import (
    decode_int,
    decode_json,
    decode_npy,
    decode_text,
    read_npy_header,
)

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "npy": decode_npy,
    "json": decode_json,
    "txt": decode_text,
    "cls": decode_int,
}

#: What parsing a header (at most 10,000 bytes: literal_eval, a dtype of many fields) may
#: allocate besides the member's own size; a lying shape would ask for far more.
HEADER_ALLOWANCE_BYTES = 8 << 20


def _npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, array, version=version, allow_pickle=True)
    return out.getvalue()


NPY_ORIGINALS = [
    _npy(np.arange(12, dtype=np.float32).reshape(3, 4)),
    _npy(np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))),
    _npy(np.zeros((0, 5), dtype=np.uint16)),
    _npy(np.array(3.5)),
    _npy(np.array([b"ab", b"c"])),
    _npy(np.array(["x", "yz"])),
    _npy(np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,))])),
    _npy(np.arange(4, dtype=">u2"), version=(2, 0)),
    _npy(np.array([{"a": 1}, None], dtype=object)),
]
JSON_ORIGINALS = [
    b'{"w": 640, "h": 480, "tags": ["a", "b"], "caption": "\\u00fc", "x": null}',
    b'[1, 2.5e3, -0, true, false, "\\ud83d\\ude00"]',
    b"[" * 2_000 + b"]" * 2_000,
]
TEXT_ORIGINALS = ["a caption, ünïcode, 日本語, 🐕".encode(), b"", b"x" * 300]
INT_ORIGINALS = [b"7", b" -12\n", b"1_000", b"+3", b"9" * 40]


@st.composite
def mutated(draw: st.DrawFn, originals: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(originals)))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        reach = draw(st.sampled_from([16, 128, len(data)]))
        position = draw(st.integers(0, min(len(data), reach) - 1))
        data[position] = draw(
            st.sampled_from([0x00, 0xFF, 0x80, 0x22, 0x5B, 0x7B, 0x2C, draw(st.integers(0, 255))])
        )
    choice = draw(st.integers(0, 5))
    if choice == 0:
        data = data[: draw(st.integers(0, len(data)))]
    elif choice == 1:
        data += draw(st.binary(max_size=64))
    return bytes(data)


DTYPES = st.sampled_from(
    [
        "<f4",
        "|u1",
        ">i8",
        "|b1",
        "<c16",
        "|S0",
        "|S7",
        "<U0",
        "<U3",
        "|V0",
        "|V5",
        "|O",
        "<M8[s]",
        "<m8",
        "<f2",
        "x",
        "",
        "<f4 ",
    ]
)
DESCRS = st.one_of(
    DTYPES,
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", ""]),
            DTYPES,
            st.sampled_from([(), (0,), (2,), (10**9,)]),
        ),
        max_size=3,
    ).map(lambda fields: [(n, d, s) if s else (n, d) for n, d, s in fields]),
    st.just([("a", [("b", "<i4", (0,))])]),
    st.integers(),
    st.none(),
)
DIMENSIONS = st.sampled_from([0, 1, 2, 3, 7, -1, -2, 10**9, 2**62, 2**63, 10**30, True])


@st.composite
def npy_headers(draw: st.DrawFn) -> bytes:
    """An npy file whose header dict is drawn field by field, padded as numpy pads it,
    with data of about the length the header implies, or not."""
    header: dict[str, Any] = {
        "descr": draw(DESCRS),
        "fortran_order": draw(st.sampled_from([False, True, 0, "no"])),
        "shape": tuple(draw(st.lists(DIMENSIONS, max_size=4))),
    }
    if draw(st.integers(0, 9)) == 0:
        header.pop(draw(st.sampled_from(sorted(header))))
    text = repr(header).encode("latin-1")
    version = draw(st.sampled_from([(1, 0), (2, 0), (3, 0), (4, 0)]))
    width = 2 if version == (1, 0) else 4
    pad = -(6 + 2 + width + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    prefix = b"\x93NUMPY" + bytes(version) + len(text).to_bytes(width, "little")
    try:
        dtype = np.dtype(header["descr"])
        shape = header["shape"]
        wanted = math.prod(shape) * dtype.itemsize
        size = wanted if 0 <= wanted <= 4096 else 16
    except Exception:  # a header numpy refuses: any length will do
        size = 16
    size = max(0, size + draw(st.sampled_from([0, 0, 0, -1, 1, -size])))
    return prefix + text + bytes(size)


#: Shapes as a header may write them: numpy's own, and near misses that Python's literal
#: parser reads otherwise (``(5)`` is no tuple, ``(05,)`` no literal) or not at all.
SHAPE_TEXTS = st.sampled_from(
    [
        "()", "(5,)", "(3, 4)", "(3, 4,)", "(0, 2)", "(5)", "(05,)", "(3,4)", "( 3,)",
        "(3 ,)", "(3, 4, )", "(,)", "(-1,)", "(1_0,)", "(0x5,)", "(5,,)", "(5, )",
        "(99999999999999999999,)", "(True,)", "[5]", "(5.0,)",
    ]
)  # fmt: skip


@st.composite
def npy_header_texts(draw: st.DrawFn) -> bytes:
    """An npy file whose header text is numpy's plain form with its shape drawn from
    :data:`SHAPE_TEXTS` and at most one other piece changed, so that both header readers
    (the plain-form one and numpy's) meet near misses."""
    pieces = {
        "descr": "'<f4'",
        "fortran": "False",
        "tail": ", }",
        "key": "'descr'",
        "padding": " " * 40 + "\n",
    }
    changed = draw(st.sampled_from([None, *pieces]))
    if changed is not None:
        pieces[changed] = draw(
            st.sampled_from(
                {
                    "descr": ["'|u1'", "'>i8'", "'|O'", "'<U3'", "'|V0'", "'x'", "'<f4 '", "'f4'"],
                    "fortran": ["True", "0", "false"],
                    "tail": ["}", ",}", " , }", ", } ", ",  }"],
                    "key": ['"descr"', "'Descr'", "'descr' "],
                    "padding": ["", "\n", " ", " " * 20_000 + "\n", "\n\n", "\t\n"],
                }[changed]
            )
        )
    text = (
        f"{{{pieces['key']}: {pieces['descr']}, 'fortran_order': {pieces['fortran']}, "
        f"'shape': {draw(SHAPE_TEXTS)}{pieces['tail']}{pieces['padding']}"
    )
    version = draw(st.sampled_from([(1, 0), (2, 0), (3, 0)]))
    width = 2 if version == (1, 0) else 4
    raw = text.encode()[: 2 ** (8 * width) - 1]
    length = len(raw) + draw(st.sampled_from([0, 0, 0, 0, -1, 1, 1000]))
    header = b"\x93NUMPY" + bytes(version) + max(length, 0).to_bytes(width, "little") + raw
    return header + bytes(draw(st.sampled_from([0, 4, 12, 48, 60])))


def _only_value_errors(decode: Callable[[bytes], Any], data: bytes) -> Any:
    with contextlib.suppress(ValueError):
        return decode(data)
    return None


@FUZZ
@given(ext=st.sampled_from(sorted(DECODERS)), data=st.binary(max_size=2_000))
def test_arbitrary_bytes_decode_or_raise_value_error(ext: str, data: bytes) -> None:
    _only_value_errors(DECODERS[ext], data)


@FUZZ
@given(
    data=st.one_of(
        mutated(NPY_ORIGINALS),
        mutated(JSON_ORIGINALS),
        mutated(TEXT_ORIGINALS),
        mutated(INT_ORIGINALS),
    )
)
def test_mutated_members_decode_or_raise_value_error(data: bytes) -> None:
    for decode in DECODERS.values():
        _only_value_errors(decode, data)


@FUZZ
@given(text=st.text(max_size=200))
def test_text_and_integers_round_trip(text: str) -> None:
    assert decode_text(text.encode()) == text
    value = _only_value_errors(decode_int, text.encode("utf-8"))
    if value is not None:
        assert value == int(text.strip())


@FUZZ
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=20,
    )
)
def test_json_round_trips(value: Any) -> None:
    assert decode_json(json.dumps(value).encode()) == value


@FUZZ
@given(data=st.one_of(npy_header_texts(), npy_headers(), mutated(NPY_ORIGINALS)))
def test_plain_npy_headers_read_as_numpy_reads_them(data: bytes) -> None:
    # The plain-form reader takes only headers numpy's own reader reads the same way, and
    # refuses only what numpy refuses.
    plain = _read_or_refuse(records._plain_npy_header, data)
    if plain is not None:
        assert _read_or_refuse(records._numpy_npy_header, data) == plain
    _only_value_errors(decode_npy, data)


def _read_or_refuse(read: Callable[[bytes], Any], data: bytes) -> Any:
    try:
        return read(data)
    except Exception:  # any refusal: read_npy_header words each as a ValueError
        return "refused"


def _decode_npy_measured(data: bytes) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = _only_value_errors(decode_npy, data)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@FUZZ
@given(data=st.one_of(npy_headers(), npy_header_texts(), mutated(NPY_ORIGINALS)))
def test_npy_allocates_no_more_than_its_input_implies(data: bytes) -> None:
    result, peak = _decode_npy_measured(data)
    assert peak <= 2 * len(data) + HEADER_ALLOWANCE_BYTES
    if isinstance(result, np.ndarray):
        layout = read_npy_header(data)
        assert result.nbytes == len(data) - layout.offset
        assert result.shape == layout.shape
        assert result.dtype == layout.dtype
    elif result is not None:
        assert result == data  # Python objects: their bytes, never unpickled
        assert read_npy_header(data).dtype.hasobject


@pytest.mark.parametrize(
    "header",
    [
        # Items of no size: any count fits in no data; numpy walked 10**18 of them (a hang).
        {"descr": [("a", "<i4", (0,))], "fortran_order": False, "shape": (10**18,)},
        {"descr": "|V0", "fortran_order": False, "shape": (10**9, 10**9)},
        # Negative dimensions multiply to a positive count.
        {"descr": "<f4", "fortran_order": False, "shape": (-1, -1)},
        {"descr": "<f4", "fortran_order": False, "shape": (-2, 2)},
    ],
)
def test_npy_headers_that_lie_about_their_size_are_refused(header: dict[str, Any]) -> None:
    text = repr(header).encode()
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + bytes(4)
    with pytest.raises(ValueError, match="npy array of"):
        decode_npy(data)


def test_an_npy_header_that_is_no_literal_is_a_value_error() -> None:
    # numpy then reads it as Python 2 wrote headers, with the tokenizer (TokenError).
    data = _npy(np.arange(12, dtype=np.float32)).replace(b"'<f4', ", b"'<f4'[ ", 1)
    with pytest.raises(ValueError, match="not an npy array"):
        decode_npy(data)


def test_a_python_2_header_is_read_or_refused_as_a_value_error() -> None:
    # numpy reads it after filtering the tokens, and warns: a UserWarning that is an
    # exception where warnings are errors (as in this test suite).
    text = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3L,), }"
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + bytes(12)
    with pytest.raises(ValueError, match=r"not an npy array: .*Python 2"):
        decode_npy(data)


def test_json_nested_past_the_recursion_limit_is_a_value_error() -> None:
    for opener in (b"[", b'{"a":'):
        with pytest.raises(ValueError, match="invalid JSON: nested too deeply"):
            decode_json(opener * 100_000)
