"""Batch arrays that are written once per batch and reused once the consumer lets go."""

from __future__ import annotations

import sys

import numpy as np


class BatchArrays:
    """Batch arrays, recycled once the consumer has let go of them.

    A fresh 38 MB array per batch of 256 images at 224x224 costs the kernel a page fault
    and a page of zeroes per 4 kB written: about 7 % of the loader's CPU on small images.
    An array handed out earlier is reused only when this pool holds the sole reference to
    it, so a batch (or a view of it, a tensor made by ``torch.from_numpy``, a
    ``memoryview``: all of which refer to the array) that the consumer still holds is
    never written over.

    Args:
        keep: Most arrays the pool refers to; older ones are left to their holders.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._arrays: list[np.ndarray] = []
        self.reused = 0
        # What _references() says of an array only the pool holds, measured rather than
        # assumed: interpreters differ in which references a call's arguments add.
        self._sole = _references([np.empty(0, dtype=np.uint8)], 0)

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        """A uint8 array of ``shape`` that no one else refers to."""
        arrays = self._arrays
        for n in range(len(arrays)):
            if arrays[n].shape == shape and _references(arrays, n) == self._sole:
                self.reused += 1
                return arrays[n]
        array = np.empty(shape, dtype=np.uint8)
        arrays.append(array)
        del arrays[: -self.keep]
        return array


def _references(arrays: list[np.ndarray], n: int) -> int:
    return sys.getrefcount(arrays[n])
