"""Batches as tensors: numeric arrays become tensors, everything else stays as it is."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

#: numpy dtype kinds that become tensors: booleans, signed and unsigned integers, floats,
#: complex numbers.
NUMERIC_KINDS = "biufc"


def to_tensors(batch: Mapping[str, Any]) -> dict[str, Any]:
    """A batch with its numeric arrays as tensors (no copy) and everything else as it is.

    Arrays of numbers and booleans become tensors of their own dtype (images stay
    ``(N, H, W, 3)`` uint8; a big-endian ``npy`` array is put in native byte order first).
    A field that is a list (ragged arrays, images of different sizes, values with gaps)
    stays a list, each numeric array in it a tensor: ragged arrays come as a list of
    tensors, as a DataLoader's own conversion would make them. Strings, bytes, JSON
    objects, None, and arrays torch has no dtype for (strings, dates, records) are left
    as they are: torch has no string tensors.
    """
    return {name: _tensors_in(value) for name, value in batch.items()}


def _tensors_in(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return _as_tensor(value)
    if isinstance(value, list) and any(isinstance(v, np.ndarray) for v in value):
        return [_as_tensor(v) if isinstance(v, np.ndarray) else v for v in value]
    return value


def _as_tensor(array: np.ndarray) -> torch.Tensor | np.ndarray:
    """A tensor sharing ``array``'s memory, or ``array`` itself where torch has no dtype."""
    if array.dtype.kind not in NUMERIC_KINDS:
        return array
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    elif not array.flags.writeable:
        array = array.copy()  # torch warns of, and may write through, a read-only array
    try:
        return torch.from_numpy(array)
    except TypeError:  # float128 and other dtypes torch lacks
        return array


def each_tensor(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of a batch value: itself, or those of a list."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list):
        yield from (v for v in value if isinstance(v, torch.Tensor))
