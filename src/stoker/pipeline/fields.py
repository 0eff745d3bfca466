"""Fields of any record: decoders by extension, which fields a batch carries, collation.

A sample is its members keyed by extension, as WebDataset names them (``jpg``, ``txt``,
``json``, ``npy``, ``cls``, ``seg.png``, ...). Each member is decoded by the table
:data:`FIELD_DECODERS`, looked up by its whole extension first and then by its last part
(``seg.png`` is a PNG): text to ``str``, JSON to Python objects, class numbers to ``int``,
``npy`` to a numpy array (its header checked, never with pickle), images to arrays.
Anything else, pickle-like members (``pyd``, ``pickle``, ``pth``) included, stays ``bytes``:
stored data is never unpickled.

The image a transform works on keeps its own fast path (a crop planned before decoding,
straight into the batch array; see :mod:`stoker.pipeline.decode`): :class:`FieldsConfig`
says which fields the batch carries besides it, under which names, and what happens when a
sample lacks one. :func:`collate` then makes one batch value of each field's values.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from PIL import Image

from stoker.format.imaging import PILLOW_ERRORS, pillow_problem
from stoker.format.spec import DEFAULT_MAX_PIXELS

#: Decodes one member's bytes; raises ValueError on bytes it cannot decode.
FieldDecoder = Callable[[bytes], Any]

#: Batch names the loader itself fills; a member with one of these extensions comes under
#: ``<name>_member`` instead (:func:`batch_name`).
RESERVED_NAMES = ("image", "index", "key", "label")

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


def decode_int(data: bytes) -> int:
    """A class number or other integer written as ASCII text (``b"7"``, ``b" 7\\n"``)."""
    text = bytes(data).strip()
    if not text or len(text) > 40:
        raise ValueError(f"not an integer: {bytes(data)[:40]!r}")
    try:
        return int(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"not an integer: {bytes(data)[:40]!r}") from None


def decode_npy(data: bytes) -> np.ndarray | bytes:
    """A numpy ``.npy`` array, its header checked against its length; never with pickle:
    an array of Python objects (which only unpickling could load) stays ``bytes``.

    Raises:
        ValueError: Not an ``npy`` file, or a length that is not what the header's shape
            and dtype say (a truncated file).
    """
    buffer = io.BytesIO(data)
    try:
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
    except (ValueError, SyntaxError, TypeError) as exc:
        raise ValueError(f"not an npy array: {exc}") from None
    if dtype.hasobject:
        return bytes(data)
    count = math.prod(shape)
    start = buffer.tell()
    needed = count * dtype.itemsize
    if len(data) - start != needed:
        raise ValueError(
            f"npy array of shape {shape} and dtype {dtype} needs {needed} bytes of data, "
            f"has {len(data) - start}"
        )
    array = np.frombuffer(data, dtype=dtype, count=count, offset=start)
    array = array.reshape(shape, order="F" if fortran else "C")
    return array.copy() if not array.flags.writeable else array


def decode_image(data: bytes) -> np.ndarray:
    """An image other than the transformed one (a segmentation mask, a depth map), as an
    array in its own mode: grey, palette indices and 16-bit or float planes as ``(H, W)``,
    RGBA as ``(H, W, 4)``, anything else as ``(H, W, 3)`` RGB.

    Raises:
        ValueError: Not an image Pillow reads, or more pixels than
            :data:`~stoker.format.spec.DEFAULT_MAX_PIXELS` (checked before decoding).
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > DEFAULT_MAX_PIXELS:
                raise ValueError(
                    f"{image.width}x{image.height} image is over {DEFAULT_MAX_PIXELS:,} pixels"
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


def batch_name(extension: str) -> str:
    """The batch name of a member with this extension when every field is carried: the
    extension itself, or ``<ext>_member`` for one the loader fills itself (``label``)."""
    return f"{extension}_member" if extension in RESERVED_NAMES else extension


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldsConfig:
    """Which fields a batch carries besides the transformed image, and how.

    Attributes:
        select: Batch name to the member extension it is read from, or a sequence of
            alternatives (the first one the sample has): ``{"caption": "txt",
            "mask": ("seg.png", "png")}``. None (the default): every member of every
            sample, each under its extension (see :func:`batch_name`), except the image
            the transform works on, which is ``image``. Naming ``image`` chooses the
            members the transform reads (``{"image": ("png", "jpg")}``); a selection
            without it carries no image unless the Loader has a transform.
        decoders: Decoders for extensions, over :data:`FIELD_DECODERS` (audio through your
            own callable, say). A decoder takes the member's bytes and raises ValueError on
            bytes it cannot decode.
        transforms: A callable per batch name, applied to the decoded value (not to the
            transformed image: that is the Loader's ``transform``).
        missing: When a sample lacks a chosen field: ``"raise"`` an error naming the
            sample and the field, ``"skip"`` the sample (counted and listed with the
            loader's skipped samples), or give ``"none"``.
        pad: Batch name to a pad value: that field's arrays of different lengths (first
            axis) come padded to the longest, with their lengths under
            ``<name>_lengths``; without one they come as a list.
    """

    select: Mapping[str, str | Sequence[str]] | None = None
    decoders: Mapping[str, FieldDecoder] = field(default_factory=dict)
    transforms: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)
    missing: Literal["raise", "skip", "none"] = "raise"
    pad: Mapping[str, float | int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.missing not in ("raise", "skip", "none"):
            raise ValueError(f"missing must be 'raise', 'skip' or 'none', got {self.missing!r}")
        for label, mapping in (
            ("select", self.select or {}),
            ("decoders", self.decoders),
            ("transforms", self.transforms),
            ("pad", self.pad),
        ):
            if not isinstance(mapping, Mapping):
                raise TypeError(f"{label} must be a mapping, got {type(mapping).__name__}")
        for name, source in (self.select or {}).items():
            alternatives = (source,) if isinstance(source, str) else tuple(source)
            if not alternatives or not all(isinstance(a, str) and a for a in alternatives):
                raise ValueError(
                    f"select[{name!r}] must be an extension or a sequence of extensions, "
                    f"got {source!r}"
                )
        for label, mapping in (("decoders", self.decoders), ("transforms", self.transforms)):
            for name, function in mapping.items():
                if not callable(function):
                    raise TypeError(f"{label}[{name!r}] must be callable, got {function!r}")
        chosen = self.chosen()
        for name in self.transforms:
            if chosen is not None and name not in chosen:
                raise ValueError(
                    f"transforms[{name!r}] names no field; fields are {sorted(chosen)}"
                )
        for name, value in self.pad.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"pad[{name!r}] must be a number, got {value!r}")

    def chosen(self) -> dict[str, tuple[str, ...]] | None:
        """Batch name to the alternatives it is read from; None for every field."""
        if self.select is None:
            return None
        return {
            name: (source,) if isinstance(source, str) else tuple(source)
            for name, source in self.select.items()
        }


class MissingField(ValueError):
    """A sample lacks a field the batch carries (``missing="raise"`` or ``"skip"``)."""


def decode_fields(
    sample: Mapping[str, Any],
    config: FieldsConfig,
    *,
    skip: Sequence[str] = (),
) -> dict[str, Any]:
    """The batch fields of one sample, decoded and transformed.

    Args:
        sample: The sample's members by extension (``bytes``), and the loader's own
            entries (``key``, ``label``, ...), which are not members.
        config: Which fields, and how.
        skip: Member extensions handled elsewhere (the image the transform works on).

    Raises:
        MissingField: A chosen field is absent and ``config.missing`` is not ``"none"``.
        ValueError: A member's decoder or a field transform failed; the message names the
            field.
    """
    chosen = config.chosen()
    if chosen is None:
        chosen = {
            batch_name(ext): (ext,)
            for ext, value in sample.items()
            if ext not in skip and isinstance(value, bytes | bytearray | memoryview)
        }
    out: dict[str, Any] = {}
    for name, alternatives in chosen.items():
        ext = next((a for a in alternatives if a in sample), None)
        if ext is None:
            if config.missing == "none":
                out[name] = None
                continue
            wanted = " or ".join(repr(a) for a in alternatives)
            members = sorted(k for k, v in sample.items() if isinstance(v, bytes | memoryview))
            raise MissingField(f"no field {name!r} (member {wanted}; the sample has {members})")
        try:
            value = decoder_for(ext, config.decoders)(sample[ext])
            transform = config.transforms.get(name)
            if transform is not None:
                value = transform(value)
        except ValueError as exc:
            raise ValueError(f"field {name!r} (member {ext!r}): {exc}") from None
        out[name] = value
    return out


def collate(name: str, values: Sequence[Any], *, pad: float | int | None = None) -> dict[str, Any]:
    """One field's batch value(s) from its per-sample values.

    Arrays of one shape and dtype are stacked; arrays of different lengths along their first
    axis come padded with ``pad`` plus their lengths under ``<name>_lengths``, or as a list
    when no ``pad`` is given; numbers become an array; strings, bytes, None and other
    objects come as a list.

    Raises:
        ValueError: The field's arrays have different dtypes, or (when padding) differ in
            more than their first axis; the message names the field.
    """
    if values and all(isinstance(v, np.ndarray) for v in values):
        arrays: list[np.ndarray] = list(values)
        dtypes = {a.dtype for a in arrays}
        if len(dtypes) > 1:
            raise ValueError(
                f"field {name!r}: arrays of different dtypes in one batch "
                f"({', '.join(sorted(str(d) for d in dtypes))}); convert them in a field transform"
            )
        shapes = {a.shape for a in arrays}
        if len(shapes) == 1:
            return {name: np.stack(arrays)}
        if pad is None:
            return {name: arrays}
        tails = {a.shape[1:] for a in arrays}
        if len(tails) > 1 or any(a.ndim == 0 for a in arrays):
            raise ValueError(
                f"field {name!r}: arrays can be padded along their first axis only; shapes "
                f"{sorted(shapes)[:4]}"
            )
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        padded = np.full(
            (len(arrays), int(lengths.max()), *arrays[0].shape[1:]), pad, dtype=arrays[0].dtype
        )
        for row, array in enumerate(arrays):
            padded[row, : len(array)] = array
        return {name: padded, f"{name}_lengths": lengths}
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return {name: np.array(values, dtype=np.int64)}
    if values and all(isinstance(v, float) for v in values):
        return {name: np.array(values, dtype=np.float64)}
    return {name: list(values)}
