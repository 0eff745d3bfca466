"""Fields of any record: which fields a batch carries, decoded, and collation.

A sample is its members keyed by extension, as WebDataset names them (``jpg``, ``txt``,
``json``, ``npy``, ``cls``, ``seg.png``, ...), each decoded by the table of
:mod:`stoker.format.records` (re-exported here: :data:`FIELD_DECODERS`,
:func:`decoder_for` and the decoders): text to ``str``, JSON to Python objects, class
numbers to ``int``, ``npy`` to a numpy array (its header checked, never with pickle),
images to arrays; anything else, pickle-like members included, stays ``bytes``.

The image a transform works on keeps its own fast path (a crop planned before decoding,
straight into the batch array; see :mod:`stoker.pipeline.decode`): :class:`FieldsConfig`
says which fields the batch carries besides it, under which names, and what happens when a
sample lacks one. :func:`collate` then makes one batch value of each field's values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from stoker.format.reader import LABEL_MEMBER, member_entry, member_extension
from stoker.format.records import (
    FIELD_DECODERS,
    FieldDecoder,
    decode_image,
    decode_int,
    decode_json,
    decode_npy,
    decode_text,
    decoder_for,
    keep_bytes,
)

__all__ = [
    "FIELD_DECODERS",
    "RESERVED_NAMES",
    "FieldDecoder",
    "FieldsConfig",
    "MissingField",
    "batch_name",
    "collate",
    "decode_fields",
    "decode_image",
    "decode_int",
    "decode_json",
    "decode_npy",
    "decode_text",
    "decoder_for",
    "keep_bytes",
]

#: Batch names the loader itself fills; a member with one of these extensions comes under
#: ``<name>_member`` instead (:func:`batch_name`).
RESERVED_NAMES = ("image", "index", "key", "label")


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
            the transform works on, which is ``image``, and a ``cls`` member holding the
            sample's label, which is ``label`` (a selection naming ``cls`` has it too).
            Naming ``image`` chooses the members the transform reads (``{"image": ("png",
            "jpg")}``); a selection without it carries no image unless the Loader has a
            transform.
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
        sample: The sample's members (``bytes``) by entry (see
            :func:`~stoker.format.reader.member_entry`), and the loader's own entries
            (``key``, ``label``, ...), which are not members.
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
            for ext in (
                member_extension(entry)
                for entry, value in sample.items()
                if entry not in skip
                and isinstance(value, bytes | bytearray | memoryview)
                and not _holds_the_label(sample, entry)
            )
        }
    out: dict[str, Any] = {}
    for name, alternatives in chosen.items():
        ext = next((a for a in alternatives if member_entry(a) in sample), None)
        if ext is None:
            if config.missing == "none":
                out[name] = None
                continue
            wanted = " or ".join(repr(a) for a in alternatives)
            members = sorted(k for k, v in sample.items() if isinstance(v, bytes | memoryview))
            raise MissingField(f"no field {name!r} (member {wanted}; the sample has {members})")
        try:
            value = decoder_for(ext, config.decoders)(sample[member_entry(ext)])
            transform = config.transforms.get(name)
            if transform is not None:
                value = transform(value)
        except ValueError as exc:
            raise ValueError(f"field {name!r} (member {ext!r}): {exc}") from None
        out[name] = value
    return out


def _holds_the_label(sample: Mapping[str, Any], entry: str) -> bool:
    """Whether ``entry`` is the ``cls`` member the sample's ``label`` was read from (its
    class once in the batch, as ``label``); a ``cls`` that says otherwise is carried."""
    if entry != LABEL_MEMBER or "label" not in sample:
        return False
    try:
        return bool(decode_int(sample[entry]) == sample["label"])
    except ValueError:
        return False


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
