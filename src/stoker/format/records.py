"""Members of any record, decoded by extension: the table both the read path and pack use.

A sample is its members keyed by extension, as WebDataset names them (``jpg``, ``txt``,
``json``, ``npy``, ``cls``, ``seg.png``, ...). Each member is decoded by the table
:data:`FIELD_DECODERS`, looked up by its whole extension first and then by its last part
(``seg.png`` is a PNG): text to ``str``, JSON to Python objects, class numbers to ``int``,
``npy`` to a numpy array (its header checked, never with pickle), images to arrays.
Anything else, pickle-like members (``pyd``, ``pickle``, ``pth``) included, stays ``bytes``:
stored data is never unpickled.

The Loader decodes members with this table (:mod:`stoker.pipeline.fields`); pack checks
each member with the same decoders before writing it (:mod:`stoker.pack.fieldcheck`), so
that what pack accepts, training reads.
"""

from __future__ import annotations

import io
import json
import math
import re
import tokenize
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from stoker.format.imaging import PILLOW_ERRORS, pillow_problem

#: Decodes one member's bytes; raises ValueError on bytes it cannot decode.
FieldDecoder = Callable[[bytes], Any]

#: Default ``max_pixels`` of :func:`decode_image`: 4096 x 4096, 48 MiB as RGB. An image field
#: is kept whole in the batch, so its bound is lower than the transformed image's
#: (:data:`~stoker.format.spec.DEFAULT_MAX_PIXELS`), which is resized as it is decoded.
FIELD_MAX_PIXELS = 1 << 24

#: Largest ``npy`` header the decoder reads (numpy's own limit for untrusted files).
_MAX_NPY_HEADER = 10_000


def decode_text(data: bytes) -> str:
    """UTF-8 text (a caption, a transcript)."""
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def decode_json(data: bytes) -> Any:
    """A JSON document (UTF-8)."""
    try:
        return json.loads(decode_text(data))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:  # nesting deeper than Python's recursion limit
        raise ValueError("invalid JSON: nested too deeply to parse") from None


def decode_int(data: bytes) -> int:
    """A class number or other integer written as ASCII text (``b"7"``, ``b" 7\\n"``)."""
    text = bytes(data).strip()
    if not text or len(text) > 40:
        raise ValueError(f"not an integer: {bytes(data)[:40]!r}")
    try:
        return int(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"not an integer: {bytes(data)[:40]!r}") from None


@dataclass(frozen=True, slots=True)
class NpyLayout:
    """What an ``npy`` header says, checked against the member's length.

    Attributes:
        shape: The array's shape (no negative dimension).
        dtype: Its dtype.
        fortran_order: Whether the data is in column-major order.
        offset: Where the data starts in the member.
    """

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran_order: bool
    offset: int


#: The header numpy writes for an array of a plain dtype (``np.save``), which is read
#: without numpy's Python-literal parser (about 30 us a member): anything else, or more,
#: goes through that parser. Dimensions as Python writes them (no leading zeros), one
#: dimension with its comma.
_PLAIN_NPY_HEADER = re.compile(
    rb"\{'descr': '([<>|=]?[A-Za-z][0-9]{0,4})', 'fortran_order': (True|False), "
    rb"'shape': \(((?:0|[1-9][0-9]{0,17})(?:,|(?:, (?:0|[1-9][0-9]{0,17}))+,?)|)\)"
    rb"(?:, )?\} *\n?"
)
#: numpy's header-length field by npy version: its size in bytes.
_NPY_LENGTH_BYTES = {(1, 0): 2, (2, 0): 4, (3, 0): 4}

_NpyHeader = tuple[tuple[int, ...], np.dtype[Any], bool, int]


def _plain_npy_header(data: bytes | memoryview) -> _NpyHeader | None:
    """The header as :func:`_numpy_npy_header` reads it, if it is the plain one numpy
    writes; else None."""
    width = _NPY_LENGTH_BYTES.get((data[6], data[7])) if len(data) >= 8 else None
    if width is None or bytes(data[:6]) != b"\x93NUMPY":
        return None
    length = int.from_bytes(data[8 : 8 + width], "little")
    start = 8 + width
    if length > _MAX_NPY_HEADER or len(data) < start + length:
        return None
    match = _PLAIN_NPY_HEADER.fullmatch(bytes(data[start : start + length]))
    if match is None:
        return None
    descr, fortran, shape = match.groups()
    dtype = np.dtype(descr.decode("ascii"))  # as numpy's descr_to_dtype makes it
    dimensions = tuple(int(n) for n in shape.split(b",") if n.strip())
    return dimensions, dtype, fortran == b"True", start + length


#: What ast.literal_eval says of an expression that is no literal: the node's repr.
_NOT_A_LITERAL = re.compile(r"malformed node or string.*<ast\.(\w+) object at 0x[0-9a-fA-F]+>")


def _npy_problem(exc: BaseException) -> str:
    """``exc`` in words: ``literal_eval``'s ``<ast.Call object at 0x...>`` as what it is."""
    match = _NOT_A_LITERAL.search(str(exc))
    if match is None:
        return str(exc)
    return (
        f"its header holds an expression ({match.group(1)}) where numpy writes only "
        "literals (a dict of descr, fortran_order and shape)"
    )


def _numpy_npy_header(data: bytes | memoryview) -> _NpyHeader:
    buffer = io.BytesIO(data)
    version = np.lib.format.read_magic(buffer)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(
            buffer, max_header_size=_MAX_NPY_HEADER
        )
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(
            buffer, max_header_size=_MAX_NPY_HEADER
        )
    else:
        raise ValueError(f"npy version {version} is not supported")
    return tuple(int(n) for n in shape), dtype, bool(fortran), buffer.tell()


def read_npy_header(data: bytes | memoryview) -> NpyLayout:
    """Read and check an ``npy`` member's header without touching its data: a dtype of
    Python objects is returned as it is (their data is a pickle); for any other, the data
    after the header must be exactly what the shape and dtype need.

    Raises:
        ValueError: Not an ``npy`` file, or a length that is not what the header's shape
            and dtype say (a truncated file).
    """
    try:
        shape, dtype, fortran, offset = _plain_npy_header(data) or _numpy_npy_header(data)
    except (
        ValueError,
        SyntaxError,
        TypeError,
        RecursionError,
        tokenize.TokenError,
        Warning,
    ) as exc:
        # numpy parses the header as a Python literal, and one that is not as Python 2
        # wrote it, with the tokenizer and a UserWarning: each raises its own error (the
        # warning when warnings are errors).
        raise ValueError(f"not an npy array: {_npy_problem(exc)}") from None
    layout = NpyLayout(shape, dtype, fortran, offset)
    if dtype.hasobject:
        return layout
    if any(n < 0 for n in layout.shape):
        raise ValueError(f"npy array of negative shape {layout.shape}")
    count = math.prod(layout.shape)
    if count and not dtype.itemsize:
        # Items of no size: any count fits in no data, and numpy would walk them all.
        raise ValueError(f"npy array of {count} items of dtype {dtype}, which has no size")
    needed = count * dtype.itemsize
    if len(data) - layout.offset != needed:
        raise ValueError(
            f"npy array of shape {layout.shape} and dtype {dtype} needs {needed} bytes of "
            f"data, has {len(data) - layout.offset}"
        )
    return layout


def decode_npy(data: bytes) -> np.ndarray | bytes:
    """A numpy ``.npy`` array, its header checked against its length
    (:func:`read_npy_header`); never with pickle: an array of Python objects (which only
    unpickling could load) stays ``bytes``.

    Raises:
        ValueError: Not an ``npy`` file, or a length that is not what the header's shape
            and dtype say (a truncated file).
    """
    layout = read_npy_header(data)
    if layout.dtype.hasobject:
        return bytes(data)
    count = math.prod(layout.shape)
    try:
        array = np.frombuffer(data, dtype=layout.dtype, count=count, offset=layout.offset)
        array = array.reshape(layout.shape, order="F" if layout.fortran_order else "C")
    except (ValueError, TypeError) as exc:  # a shape or dtype numpy cannot make an array of
        raise ValueError(
            f"npy array of shape {layout.shape} and dtype {layout.dtype}: {exc}"
        ) from None
    return array.copy() if not array.flags.writeable else array


def decode_image(data: bytes, *, max_pixels: int = FIELD_MAX_PIXELS) -> np.ndarray:
    """An image other than the transformed one (a segmentation mask, a depth map), as an
    array in its own mode: grey, palette indices and 16-bit or float planes as ``(H, W)``,
    RGBA as ``(H, W, 4)``, anything else as ``(H, W, 3)`` RGB.

    Such an image is not resized by the transform: it reaches the batch whole, so its size
    is bounded before decoding (a PNG of a few hundred kB can declare 9000 x 9000 pixels).
    For larger ones, decode the field with ``FieldsConfig(decoders={"png":
    functools.partial(decode_image, max_pixels=N)})``.

    Raises:
        ValueError: Not an image Pillow reads, or more pixels than ``max_pixels``
            (default :data:`FIELD_MAX_PIXELS`; checked before decoding).
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > max_pixels:
                raise ValueError(
                    f"{image.width}x{image.height} image is over {max_pixels:,} pixels, the "
                    f"bound for an image field besides the transformed one (it reaches the "
                    f"batch whole); to read larger ones, decode the field with "
                    f"functools.partial(decode_image, max_pixels=N) in FieldsConfig.decoders"
                )
            if image.mode in ("L", "P", "I", "I;16", "F", "RGB", "RGBA"):
                return np.asarray(image)
            return np.asarray(image.convert("L" if image.mode == "1" else "RGB"))
    except PILLOW_ERRORS as exc:
        raise ValueError(f"not an image Pillow can decode: {pillow_problem(data, exc)}") from None


def keep_bytes(data: bytes) -> bytes:
    """The member's bytes, unchanged."""
    return bytes(data)


#: Decoders by extension; extensions not named here stay ``bytes``. Pickle-like members
#: (``pyd``, ``pickle``, ``pth``) are deliberately absent: they stay bytes.
FIELD_DECODERS: dict[str, FieldDecoder] = {
    **dict.fromkeys(("txt", "text", "transcript", "caption"), decode_text),
    **dict.fromkeys(("json", "jsn"), decode_json),
    **dict.fromkeys(
        ("cls", "cls2", "class", "count", "idx", "index", "inx", "id", "label"), decode_int
    ),
    "npy": decode_npy,
    **dict.fromkeys(
        ("jpg", "jpeg", "png", "webp", "bmp", "tiff", "tif", "gif", "ppm", "pgm"), decode_image
    ),
}


def decoder_for(
    extension: str, registered: Mapping[str, FieldDecoder] | None = None
) -> FieldDecoder:
    """The decoder of a member's ``extension``: the user's ``registered`` one or the table's,
    by whole extension, then by its last part (``seg.png`` -> ``png``); else :func:`keep_bytes`."""
    ext = extension.lower()
    last = ext.rpartition(".")[2]
    for table in (registered or {}, FIELD_DECODERS):
        for name in (ext, last):
            if name in table:
                return table[name]
    return keep_bytes
