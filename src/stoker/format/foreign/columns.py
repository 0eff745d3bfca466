"""How the columns of an Arrow table (a Parquet file's) become the members of a sample.

:func:`plan_columns` looks at the schema once and gives each column a :class:`ColumnRule`;
:func:`row_members` applies the rules to one row.

Columns become members, in column order, by their Arrow type:

- binary, whose values are images (by their bytes: JPEG, PNG, WebP): ``jpg``,
  ``png`` or ``webp`` for a column named image, img, jpg, jpeg, png or webp (the first
  such), else ``COLUMN.jpg`` ...; other bytes are ``COLUMN.bin``, except in that
  column of images, where an image Pillow reads is named by its format (``gif``) and
  anything else is an error naming the row;
- the Hugging Face image and audio struct ``{bytes, path}``: its bytes, named as
  binary is, except that bytes that are no image take the extension of ``path``
  (``audio.flac``); a struct with a path and no bytes (not embedded) is an error;
- string: ``txt`` for a column named txt, text or caption (the first such), else
  ``COLUMN.txt`` (UTF-8);
- integer, named label, cls, class or target (the first such): the sample's label,
  and its ``cls`` member; class names come from the Hugging Face ``ClassLabel`` in
  the file's metadata unless given;
- string, named so: class names, the label each one's place among those given, else
  among the column's distinct values sorted (as an image folder's class folders);
- lists of numbers (nested lists too, or fixed-size lists): ``COLUMN.npy``, the
  row's array in the column's dtype (``np.save``, no pickle); a ragged nested list or
  one holding nulls is an error;
- anything else (other numbers, booleans, dates, structs, maps, lists of strings):
  ``COLUMN.json``.

``COLUMN`` is the column's name, lower-cased, with characters other than letters,
digits, ``_`` and ``-`` made ``_``. A null value gives no member for that row.
"""

from __future__ import annotations

import datetime
import decimal
import importlib
import io
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np
from PIL import Image

from stoker.errors import SourceError
from stoker.format.imaging import PILLOW_ERRORS, pillow_problem
from stoker.format.spec import sniff_image_extension

ColumnKind = Literal["binary", "media", "text", "label", "label_name", "json", "array"]

#: Columns whose images are named by their extension alone (``jpg``, not ``image.jpg``).
IMAGE_COLUMNS = ("image", "img", "jpg", "jpeg", "png", "webp")
#: Columns whose strings are the sample's ``txt``.
TEXT_COLUMNS = ("txt", "text", "caption")
#: Integer or string columns that are the sample's label (the first one found, in column
#: order); strings are class names.
LABEL_COLUMNS = ("label", "cls", "class", "target")

#: Member extensions of Pillow's formats whose name is not one.
_PILLOW_EXTENSIONS = {"JPEG": "jpg", "TIFF": "tiff", "JPEG2000": "jp2", "MPO": "jpg"}

_UNSAFE = re.compile(r"[^a-z0-9_-]")
_SUFFIX = re.compile(r"^[a-z0-9]{1,10}$")


def import_pyarrow() -> ModuleType:
    """The ``pyarrow`` module.

    Raises:
        ImportError: It is not installed; the message names the extra that brings it.
    """
    try:
        importlib.import_module("pyarrow.parquet")  # the submodule, as pyarrow.parquet
        return importlib.import_module("pyarrow")
    except ImportError as exc:
        raise ImportError(
            "reading Parquet needs pyarrow; install it with: pip install 'stoker[parquet]'"
        ) from exc


@dataclass(frozen=True, slots=True)
class ColumnRule:
    """What one column gives each sample.

    Attributes:
        column: The column's name in the file.
        kind: How its values are turned into member bytes.
        stem: The member name before its extension (the column's name, made safe).
        short: Name members by extension alone (``jpg``, ``txt``), not ``STEM.EXT``.
    """

    column: str
    kind: ColumnKind
    stem: str
    short: bool = False


def plan_columns(schema: Any, *, where: str) -> list[ColumnRule]:
    """One rule per column of the Arrow ``schema``, in column order.

    Raises:
        SourceError: Two columns would give members of the same name.
    """
    pa = import_pyarrow()
    rules: list[ColumnRule] = []
    have_label = have_text = have_image = False
    stems: dict[str, str] = {}
    for index, name in enumerate(schema.names):
        arrow_type = value_type(schema.field(index).type)
        stem = _UNSAFE.sub("_", name.lower()) or f"column{index}"
        if stem in stems:
            raise SourceError(
                f"{where}: columns {stems[stem]!r} and {name!r} would both be members "
                f"named {stem}.*; rename one"
            )
        stems[stem] = name
        lowered = name.lower()
        if _is_binary(pa, arrow_type) or _is_media(pa, arrow_type):
            kind: ColumnKind = "binary" if _is_binary(pa, arrow_type) else "media"
            short = lowered in IMAGE_COLUMNS and not have_image
            have_image = have_image or short
            rules.append(ColumnRule(name, kind, stem, short))
        elif _is_string(pa, arrow_type) and lowered in LABEL_COLUMNS and not have_label:
            have_label = True
            rules.append(ColumnRule(name, "label_name", stem, True))
        elif _is_string(pa, arrow_type):
            short = lowered in TEXT_COLUMNS and not have_text
            have_text = have_text or short
            rules.append(ColumnRule(name, "text", stem, short))
        elif pa.types.is_integer(arrow_type) and lowered in LABEL_COLUMNS and not have_label:
            have_label = True
            rules.append(ColumnRule(name, "label", stem, True))
        elif _numeric_lists(pa, arrow_type):
            rules.append(ColumnRule(name, "array", stem))
        else:
            rules.append(ColumnRule(name, "json", stem))
    return rules


def value_type(arrow_type: Any) -> Any:
    """The type its values have once read: dictionary values, extension storage."""
    pa = import_pyarrow()
    while True:
        if isinstance(arrow_type, pa.ExtensionType):
            arrow_type = arrow_type.storage_type
        elif pa.types.is_dictionary(arrow_type):
            arrow_type = arrow_type.value_type
        else:
            return arrow_type


def plain_array(column: Any) -> Any:
    """One column of a row group as a single Arrow array of its value type."""
    pa = import_pyarrow()
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    while True:
        if isinstance(array, pa.ExtensionArray):
            array = array.storage
        elif pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        else:
            return array


def label_number(name: str, label_index: Mapping[str, int] | None) -> int:
    """The label of a class name.

    Raises:
        ValueError: A name that is not one of the classes.
    """
    number = (label_index or {}).get(name)
    if number is None:
        raise ValueError(f"label {name[:80]!r} is not one of the class names")
    return number


def row_members(
    rules: Sequence[ColumnRule],
    arrays: Sequence[Any],
    row: int,
    *,
    where: str,
    label_index: Mapping[str, int] | None = None,
) -> dict[str, bytes]:
    """The members of one row: member name -> bytes, in column order; nulls give none.

    Args:
        rules: From :func:`plan_columns`.
        arrays: The row group's columns, each from :func:`plain_array`.
        row: Row number inside the row group.
        where: The file and sample, for messages.
        label_index: Label of each class name, for a column of string labels.

    Raises:
        SourceError: A value that cannot become its member (a ragged or null-holding
            array, bytes inside a nested value, an image struct with no bytes, bytes
            that are no image in a column of images, a class name that is none of the
            classes, two members of one name), naming the column.
    """
    pa = import_pyarrow()
    members: dict[str, bytes] = {}
    for rule, array in zip(rules, arrays, strict=True):
        scalar = array[row]
        if not scalar.is_valid:
            continue
        try:
            name, data = _member(pa, rule, scalar, label_index)
        except (TypeError, ValueError, UnicodeDecodeError) as exc:
            raise SourceError(f"{where}, column {rule.column!r}: {exc}") from exc
        if name in members:
            raise SourceError(
                f"{where}: column {rule.column!r} gives a second {name!r} member; rename it"
            )
        members[name] = data
    return members


def _member(
    pa: ModuleType, rule: ColumnRule, scalar: Any, label_index: Mapping[str, int] | None
) -> tuple[str, bytes]:
    if rule.kind == "label":
        return "cls", str(int(scalar.as_py())).encode()
    if rule.kind == "label_name":
        return "cls", str(label_number(scalar.as_py(), label_index)).encode()
    if rule.kind == "text":
        return ("txt" if rule.short else f"{rule.stem}.txt"), scalar.as_py().encode("utf-8")
    if rule.kind == "array":
        buffer = io.BytesIO()
        np.save(buffer, _ndarray(pa, scalar.values), allow_pickle=False)
        return f"{rule.stem}.npy", buffer.getvalue()
    if rule.kind == "json":
        text = json.dumps(scalar.as_py(), default=_json_value, ensure_ascii=False)
        return f"{rule.stem}.json", text.encode("utf-8")
    if rule.kind == "binary":
        return _binary_member(rule, bytes(scalar.as_py()), path=None)
    value = scalar.as_py()  # media: the {bytes, path} struct of Hugging Face images and audio
    data, path = value.get("bytes"), value.get("path")
    if data is None:
        raise ValueError(f"the file holds no bytes for {path!r} (a path only: not embedded)")
    return _binary_member(rule, bytes(data), path=path)


def _binary_member(rule: ColumnRule, data: bytes, *, path: str | None) -> tuple[str, bytes]:
    ext = sniff_image_extension(data)
    if ext != "bin":
        return (ext if rule.short else f"{rule.stem}.{ext}"), data
    _, dot, suffix = (path or "").rsplit("/", 1)[-1].rpartition(".")
    if dot and _SUFFIX.match(suffix.lower()):  # audio.flac, audio.wav, ...
        return f"{rule.stem}.{suffix.lower()}", data
    if rule.short:  # a column of images (by its name): bytes that are none are an error
        return _pillow_extension(data), data
    return f"{rule.stem}.bin", data


def _pillow_extension(data: bytes) -> str:
    """The extension of an image Pillow reads (GIF, BMP, TIFF, ...), from its header.

    Raises:
        ValueError: The bytes are no image Pillow reads.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                kind = str(image.format or "")
    except PILLOW_ERRORS as exc:
        raise ValueError(
            f"a column of images holds a value that is no image: {pillow_problem(data, exc)}"
        ) from None
    return _PILLOW_EXTENSIONS.get(kind, kind.lower() or "bin")


def _ndarray(pa: ModuleType, values: Any) -> np.ndarray[Any, Any]:
    # One row's list, nested lists flattened level by level; every level must be regular.
    if values.null_count:
        raise ValueError(f"an array value holds {values.null_count} null(s); npy cannot")
    if _is_list(pa, values.type):
        lengths = (
            np.full(len(values), values.type.list_size)
            if pa.types.is_fixed_size_list(values.type)
            else values.value_lengths().to_numpy(zero_copy_only=False)
        )
        if len(lengths) and (lengths != lengths[0]).any():
            raise ValueError(
                f"a ragged array (inner lengths {sorted(set(lengths.tolist()))[:5]}); npy "
                "holds regular arrays only"
            )
        inner = _ndarray(pa, values.flatten())
        width = int(lengths[0]) if len(lengths) else 0
        return inner.reshape((len(values), width, *inner.shape[1:]))
    return np.asarray(values.to_numpy(zero_copy_only=False))


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | datetime.timedelta):
        return str(value)
    if isinstance(value, bytes):
        raise TypeError("bytes inside a nested value: JSON cannot carry them")
    raise TypeError(f"a {type(value).__name__} that JSON cannot carry")


def _is_list(pa: Any, arrow_type: Any) -> bool:
    return bool(
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )


def _numeric_lists(pa: Any, arrow_type: Any) -> bool:
    if not _is_list(pa, arrow_type):
        return False
    while _is_list(pa, arrow_type):
        arrow_type = arrow_type.value_type
    return bool(
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
    )


def _is_string(pa: Any, arrow_type: Any) -> bool:
    return bool(
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_string_view(arrow_type)
    )


def _is_binary(pa: Any, arrow_type: Any) -> bool:
    return bool(
        pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_fixed_size_binary(arrow_type)
        or pa.types.is_binary_view(arrow_type)
    )


def _is_media(pa: Any, arrow_type: Any) -> bool:
    # The Hugging Face Image and Audio features: struct<bytes: binary, path: string>.
    if not pa.types.is_struct(arrow_type):
        return False
    names = {arrow_type.field(i).name for i in range(arrow_type.num_fields)}
    if "bytes" not in names or not names <= {"bytes", "path"}:
        return False
    return _is_binary(pa, value_type(arrow_type.field("bytes").type))
