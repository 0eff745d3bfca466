"""Staging a token pack's documents: each checked (:func:`check_document`) and appended to
a temporary file in input order, then read back in the pack's order, so that the dtype
(from the largest id) and the shuffled order are settled before the first shard is
written."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import numpy as np

from stoker.errors import SourceError
from stoker.pack.report import PackProgress
from stoker.pack.token_sources import Item


def check_document(item: Item, limit: int, vocab_size: int | None) -> tuple[np.ndarray, str | None]:
    """The document's ids as an array, and why it cannot be packed (None if it can)."""
    if item.problem is not None:
        return np.zeros(0, np.uint32), item.problem
    try:
        array = np.asarray(item.value)
    except (ValueError, TypeError) as exc:
        return np.zeros(0, np.uint32), f"not an array of token ids: {exc}"
    if array.ndim != 1:
        return array, f"a {array.ndim}-D array of shape {array.shape}, expected one dimension"
    if not len(array):
        return array, "empty document (no tokens)"
    if array.dtype.kind not in "iu":
        return array, f"ids of dtype {array.dtype}, expected integers"
    low, high = int(array.min()), int(array.max())
    if low < 0:
        return array, f"token id {low} is negative"
    if high > limit:
        within = f"the vocabulary of {vocab_size:,}" if vocab_size else "32 bits"
        return array, f"token id {high} is out of range (outside {within})"
    return array, None


class Staging:
    """Checked documents in a temporary file, in input order, read back in any order."""

    def __init__(self, dtype: np.dtype[Any]) -> None:
        self.dtype = dtype
        self.keys: list[str] = []
        self.starts: list[int] = [0]
        self.max_id = -1
        # Closed by __exit__; unnamed, so nothing is left behind even on a crash.
        self._file: IO[bytes] = tempfile.TemporaryFile(prefix="stoker-tokens-")  # noqa: SIM115

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *_: object) -> None:
        self._file.close()

    def add(self, key: str, tokens: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self.keys.append(key)
        self.starts.append(self.starts[-1] + len(tokens))
        self.max_id = max(self.max_id, int(tokens.max()))

    def fill(
        self,
        items: Iterable[Item],
        *,
        limit: int,
        vocab_size: int | None,
        on_error: str,
        skipped: list[dict[str, str]],
        progress: PackProgress | None = None,
        total: int | None = None,
        where: str = "input",
    ) -> None:
        """Check and stage each document; a bad one raises :class:`SourceError` naming it,
        or with ``on_error="skip"`` is listed in ``skipped``. ``progress`` is called once a
        document, with ``total`` (None when unknown).

        Raises:
            ValueError: No document was staged (naming ``where`` and why).
        """
        for item in items:
            tokens, problem = check_document(item, limit, vocab_size)
            if problem is None:
                self.add(item.key, tokens)
            elif on_error == "raise":
                raise SourceError(f"{item.source}: document {item.key!r}: {problem}")
            else:
                skipped.append({"key": item.key, "source": item.source, "reason": problem})
            if progress is not None:
                progress(total, 1, tokens.nbytes)
        if not self.keys:
            reason = skipped[0]["reason"] if skipped else "none found"
            raise ValueError(f"{where}: no documents to pack ({len(skipped)} skipped: {reason})")

    def length(self, n: int) -> int:
        """Tokens in document ``n`` (in input order)."""
        return self.starts[n + 1] - self.starts[n]

    def documents(self, order: Sequence[int]) -> Iterator[tuple[str, np.ndarray]]:
        self._file.flush()
        item = self.dtype.itemsize
        for n in order:
            start, end = self.starts[n], self.starts[n + 1]
            self._file.seek(start * item)
            data = self._file.read((end - start) * item)
            yield self.keys[n], np.frombuffer(data, dtype=self.dtype)
