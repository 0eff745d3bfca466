"""SampleKeys: a dataset's sample keys, decoded from the index's key blob when asked for.

The index stores its keys as one UTF-8 blob with an offset per key (``docs/FORMAT.md``).
Decoding all of them when the index opens costs about half a microsecond and a Python
string a key (0.6 s and over 100 MB for a dataset of ImageNet's 1.28 M samples, paid again
by every spawned DataLoader worker), while a loader only needs the keys of the samples it
delivers. The blob is checked once, whole, when the index is read: valid UTF-8, and every
key starting on a character, so that each key decodes when asked for.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence
from typing import Any, SupportsIndex, overload

import numpy as np

from stoker.errors import ShardFormatError


class SampleKeys(Sequence[str]):
    """The keys of a dataset's samples, in sample order, each decoded when asked for.

    A read-only sequence of ``str``; equal to any sequence of the same strings.

    Args:
        blob: The keys' UTF-8 bytes, concatenated.
        offsets: ``len + 1`` offsets into ``blob``: key ``i`` is ``blob[offsets[i]:
            offsets[i + 1]]``.
    """

    __slots__ = ("_blob", "_offsets")

    def __init__(self, blob: bytes, offsets: np.ndarray) -> None:
        self._blob = blob
        self._offsets = offsets

    @classmethod
    def checked(cls, blob: bytes, offsets: np.ndarray, *, where: str) -> SampleKeys:
        """The keys of ``blob``, once it and its ``offsets`` are checked.

        Raises:
            ShardFormatError: Offsets out of order or not spanning the blob, a blob that is
                not UTF-8, or a key starting inside a character; naming ``where``.
        """
        if len(offsets) == 0 or int(offsets[0]) != 0 or int(offsets[-1]) != len(blob):
            first = int(offsets[0]) if len(offsets) else None
            last = int(offsets[-1]) if len(offsets) else None
            raise ShardFormatError(
                f"{where}: key offsets run from {first} to {last}, expected 0 to "
                f"{len(blob)} (the key blob's size)"
            )
        starts = offsets.astype(np.int64, copy=False)
        if (np.diff(starts) < 0).any():
            raise ShardFormatError(f"{where}: key offsets are not in order")
        try:
            blob.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ShardFormatError(f"{where}: a sample key is not UTF-8: {exc}") from None
        # Valid as a whole, each key is valid if none starts on a continuation byte.
        firsts = starts[:-1][starts[:-1] < starts[1:]]
        inside = np.frombuffer(blob, dtype=np.uint8)[firsts] & 0xC0 == 0x80
        if inside.any():
            at = int(firsts[np.argmax(inside)])
            raise ShardFormatError(
                f"{where}: a sample key is not UTF-8: it starts inside a character (byte {at})"
            )
        return cls(blob, offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: SupportsIndex) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: SupportsIndex | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[n] for n in range(*i.indices(len(self)))]
        n, count = operator.index(i), len(self)
        if n < 0:
            n += count
        if not 0 <= n < count:
            raise IndexError(f"sample {operator.index(i)} of {count}")
        offsets = self._offsets
        return self._blob[offsets.item(n) : offsets.item(n + 1)].decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        blob = self._blob
        for start, end in itertools.pairwise(self._offsets.tolist()):
            yield blob[start:end].decode("utf-8")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__: Any = None  # equal to lists, so unhashable as they are

    def __repr__(self) -> str:
        return f"SampleKeys({len(self)} keys)"
