"""What a dataset's records hold, field by field: for ``stoker inspect`` and ``stoker show``.

:func:`summarise_fields` reads a dataset's first samples (one ranged GET) and says, for each
member extension, how many samples have it (from the index), how the Loader decodes it
(the decoder table of :mod:`stoker.pipeline.fields`), its mean size in bytes and a short
summary of the decoded values: ``str, 12-48 chars``, ``float32 (128,)``, ``ragged float32
(1..5,)``, ``dict (keys: tags, w)``. :func:`preview` shows one value on one line, and
:func:`describe_samples` the fields of a loader's first samples.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from stoker.core.units import format_bytes
from stoker.format.reader import member_extension
from stoker.format.spec import IMAGE_FIELD_NAMES
from stoker.pipeline.fields import FIELD_DECODERS, batch_name, decoder_for, keep_bytes

if TYPE_CHECKING:
    from stoker.format.reader import ShardDataset
    from stoker.pipeline.loader import Loader

#: Samples ``stoker inspect`` decodes to summarise each field's values.
DEFAULT_SUMMARY_SAMPLES = 16

#: What each decoder of the table makes, in words.
_DECODED_AS = {
    FIELD_DECODERS["txt"]: "text",
    FIELD_DECODERS["json"]: "json",
    FIELD_DECODERS["cls"]: "int",
    FIELD_DECODERS["npy"]: "npy array",
    FIELD_DECODERS["jpg"]: "image",
    keep_bytes: "bytes",
}

#: Batch fields the Loader fills itself, not members of a sample.
_LOADER_FIELDS = ("key", "label", "index")


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldSummary:
    """One member extension of a dataset.

    Attributes:
        field: The member extension (``txt``, ``seg.png``).
        batch_name: Its name in the Loader's batches with every field (``image`` for the
            first image extension, which the transform works on).
        samples: Samples that have it, from the index (None where the index does not count).
        decoded_as: ``text``, ``json``, ``int``, ``npy array``, ``image`` or ``bytes``.
        read: Of the samples read, how many have it.
        mean_bytes: Mean size of the member in the samples read (None where none has it).
        values: A summary of the decoded values of the samples read.
        failed: Samples read whose member does not decode.
        problem: The first failure's reason.
    """

    field: str
    batch_name: str
    samples: int | None
    decoded_as: str
    read: int
    mean_bytes: float | None
    values: str
    failed: int = 0
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise_fields(
    dataset: ShardDataset, *, samples: int = DEFAULT_SUMMARY_SAMPLES
) -> list[FieldSummary]:
    """Each field of ``dataset``: its count from the index, and what its first ``samples``
    samples hold (read with one coalesced ranged GET; corrupt samples are left out).

    Images are summarised from their headers (format, mode, size), not decoded.
    """
    counts = dataset.index.fields
    read = [
        s
        for s in dataset.read_many(range(min(samples, len(dataset))), return_errors=True)
        if isinstance(s, dict)
    ]
    members: dict[str, list[bytes]] = {name: [] for name in counts}
    for sample in read:
        for name, value in sample.items():
            if name not in _LOADER_FIELDS and isinstance(value, bytes | bytearray | memoryview):
                members.setdefault(member_extension(name), []).append(bytes(value))
    images = [name for name in IMAGE_FIELD_NAMES if name in members]
    return [
        _summary(
            name,
            data,
            samples=counts.get(name) if counts else None,
            batch="image" if images and name == images[0] else batch_name(name),
        )
        for name, data in members.items()
    ]


def _summary(name: str, data: list[bytes], *, samples: int | None, batch: str) -> FieldSummary:
    decoder = decoder_for(name)
    kind = _DECODED_AS.get(decoder, getattr(decoder, "__name__", "custom"))
    values: list[Any] = []
    problems: list[str] = []
    for member in data:
        try:
            values.append(_image_header(member) if kind == "image" else decoder(member))
        except ValueError as exc:
            problems.append(str(exc))
    summary = describe_values(values) if values else "-"
    if kind == "npy array" and any(isinstance(v, bytes) for v in values):
        summary += " (npy of Python objects: kept as bytes, never unpickled)"
    return FieldSummary(
        field=name,
        batch_name=batch,
        samples=samples,
        decoded_as=kind,
        read=len(data),
        mean_bytes=sum(map(len, data)) / len(data) if data else None,
        values=summary,
        failed=len(problems),
        problem=problems[0] if problems else None,
    )


@dataclass(frozen=True, slots=True)
class _ImageHeader:
    format: str
    mode: str
    width: int
    height: int


def _image_header(data: bytes) -> _ImageHeader:
    try:
        with Image.open(io.BytesIO(data)) as image:
            return _ImageHeader(image.format or "?", image.mode, image.width, image.height)
    except Exception as exc:  # Pillow raises many kinds on bad bytes
        raise ValueError(f"not an image Pillow reads: {exc}") from None


def describe_values(values: Sequence[Any]) -> str:
    """A short summary of one field's decoded values: their types, and the lengths, ranges,
    dtypes, shapes or keys of each type (``str, 12-48 chars``; ``ragged float32 (1..5,)``)."""
    groups: dict[str, list[Any]] = {}
    for value in values:
        groups.setdefault(_type_name(value), []).append(value)
    return "; ".join(_describe_group(kind, group) for kind, group in groups.items())


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, np.ndarray):
        return "array"
    if isinstance(value, _ImageHeader):
        return "image"
    if value is None:
        return "null"
    return type(value).__name__


def _describe_group(kind: str, values: list[Any]) -> str:
    if kind == "str":
        return f"str, {_span([len(v) for v in values], '-')} chars"
    if kind in ("int", "float"):
        return f"{kind}, {_span(values, '..')}"
    if kind in ("bytes", "bytearray"):
        return f"bytes, {_span([len(v) for v in values], '-')} B"
    if kind in ("list", "tuple"):
        return f"{kind}, {_span([len(v) for v in values], '-')} items"
    if kind == "dict":
        keys = sorted({str(k) for v in values for k in v})
        shown = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "")
        return f"dict (keys: {shown})"
    if kind == "array":
        return _describe_arrays(values)
    if kind == "image":
        formats = "/".join(sorted({h.format for h in values}))
        modes = "/".join(sorted({h.mode for h in values}))
        sizes = sorted({(h.width, h.height) for h in values})
        size = f"{sizes[0][0]}x{sizes[0][1]}"
        if len(sizes) > 1:
            size += f"..{sizes[-1][0]}x{sizes[-1][1]}"
        return f"{formats} {modes}, {size}"
    return kind


def _describe_arrays(arrays: list[np.ndarray]) -> str:
    dtype = "|".join(sorted({str(a.dtype) for a in arrays}))
    shapes = {a.shape for a in arrays}
    if len(shapes) == 1:
        return f"{dtype} {_shape(next(iter(shapes)))}"
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        listed = ", ".join(_shape(s) for s in sorted(shapes, key=lambda s: (len(s), s))[:3])
        return f"ragged {dtype}, shapes {listed}{', ...' if len(shapes) > 3 else ''}"
    axes = [_span([s[axis] for s in shapes], "..") for axis in range(ranks.pop())]
    return f"ragged {dtype} ({', '.join(axes)}{',' if len(axes) == 1 else ''})"


def _shape(shape: tuple[int, ...]) -> str:
    return str(tuple(shape))


def _span(numbers: Iterable[Any], sep: str) -> str:
    ordered = sorted(numbers)
    low, high = (_number(n) for n in (ordered[0], ordered[-1]))
    return low if low == high else f"{low}{sep}{high}"


def _number(n: float) -> str:
    return str(n) if isinstance(n, int) else f"{n:.4g}"  # bool is an int: True, False


def preview(value: Any, *, width: int = 60) -> str:
    """One decoded value on one line of at most ``width`` characters: text quoted, an array
    as its dtype, shape and first elements, JSON objects as JSON, bytes by size."""
    if value is None:
        text = "(none: the sample lacks it)"
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, np.ndarray):
        head = [
            _number(x) if isinstance(x, int | float) else str(x) for x in value.ravel()[:6].tolist()
        ]
        if value.size > 6:
            head.append("...")
        text = f"{value.dtype} {_shape(value.shape)} [{', '.join(head)}]"
    elif isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        text = f"bytes, {format_bytes(len(data))}: {data[:16]!r}{'...' if len(data) > 16 else ''}"
    elif isinstance(value, dict | list):
        text = json.dumps(value, ensure_ascii=False, default=str)
    else:
        text = str(value)
    text = " ".join(text.split())  # one line
    return text if len(text) <= width else text[: width - 3] + "..."


def describe_samples(loader: Loader, count: int, *, width: int = 78) -> list[list[str]]:
    """The fields of ``loader``'s first ``count`` samples as its batches carry them: for
    each sample, a line with its key and class, then a line per field (a padded array
    without its padding)."""
    names = loader.dataset.class_names
    samples: list[list[str]] = []
    for batch in loader:
        fields = [
            f
            for f in batch
            if f not in _LOADER_FIELDS and not (f.endswith("_lengths") and f[:-8] in batch)
        ]
        for row, (key, label) in enumerate(zip(batch["key"], batch["label"].tolist(), strict=True)):
            title = f"{key}" + (f"  (class {names[label]})" if 0 <= label < len(names) else "")
            lines = [title]
            for name in fields:
                value = batch[name][row]
                lengths = batch.get(f"{name}_lengths")
                if lengths is not None:
                    value = value[: int(lengths[row])]
                lines.append(f"  {name}: {preview(value, width=width - len(name) - 4)}")
            samples.append(lines)
            if len(samples) == count:
                return samples
    return samples
