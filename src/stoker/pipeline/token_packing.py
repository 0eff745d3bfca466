"""Best-fit packing of a token stream's documents into sequences: a pure plan.

``TokenLoader(url, seq_len=..., packing="best-fit")`` places documents whole into
sequences of ``seq_len + 1`` tokens (the *capacity*) instead of cutting the stream at
every ``seq_len + 1`` tokens. The plan is a pure function of the documents' lengths (from
the index), the capacity and the window, so every rank and worker computes the same one
and resume needs nothing more than the Loader's few integers:

1. The documents, in stream order, are cut into *windows* of ``window`` consecutive
   documents (the last may be shorter).
2. A document longer than the capacity is cut into pieces of the capacity (in order; the
   last piece is the remainder); every other document is one piece.
3. In each window the pieces are placed by *best-fit decreasing*: longest first (ties in
   stream order), each into the open sequence with the least room it fits in (ties: the
   earliest opened), or into a new sequence. Full pieces take a sequence each, so a split
   document's pieces lie in sequences of increasing number.
4. Sequences are numbered window by window, in the order they were opened; the rest of
   each (its *padding*) is filled with the pad id by the batcher.

A window's documents are consecutive in the stream, so its sequences are read together
with one ranged read of the window, and the epoch's order treats each window as a shard
of its own (a block never straddles two windows). :func:`first_fit` (arrival order,
each piece into the earliest opened sequence it fits) is the baseline the benchmark
measures best-fit against.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: How a TokenLoader makes sequences of its stream: ``"concat"`` cuts the concatenated
#: stream every ``seq_len + 1`` tokens (the default); ``"best-fit"`` packs whole documents.
PackingMode = Literal["concat", "best-fit"]
PACKING_MODES: tuple[str, ...] = ("concat", "best-fit")
#: Documents packed together by default: about 1 Mi tokens of documents of ~1k tokens,
#: enough for best-fit to leave well under 1 % padding on heavy-tailed lengths.
DEFAULT_PACKING_WINDOW = 1024

#: A fitting rule: piece lengths and the capacity in, each piece's sequence (numbered from
#: 0 in the order opened) out.
Fit = Callable[[np.ndarray, int], np.ndarray]


def best_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Best-fit decreasing: each piece's sequence, longest pieces placed first, each into
    the sequence with the least room that holds it (ties: the earliest opened).

    Args:
        lengths: Piece lengths, each in ``1..capacity``.
        capacity: Tokens a sequence holds.

    Returns:
        Each piece's sequence number (0, 1, ... in the order opened).
    """
    order = np.argsort(-lengths, kind="stable")
    bins = np.empty(len(lengths), dtype=np.int64)
    # Open sequences with room, as room * scale + number: sorted by room, then number.
    scale = len(lengths) + 1
    rooms: list[int] = []
    opened = 0
    for item, length in zip(order.tolist(), lengths[order].tolist(), strict=True):
        at = bisect.bisect_left(rooms, length * scale)
        if at < len(rooms):
            key = rooms.pop(at)
            room, number = divmod(key, scale)
            room -= length
        else:
            room, number = capacity - length, opened
            opened += 1
        bins[item] = number
        if room:
            bisect.insort(rooms, room * scale + number)
    return bins


def first_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """First-fit in arrival order: each piece, as it comes, into the earliest opened
    sequence with room for it, or a new one (the baseline best-fit is measured against).

    Args:
        lengths: Piece lengths, each in ``1..capacity``.
        capacity: Tokens a sequence holds.

    Returns:
        Each piece's sequence number (0, 1, ... in the order opened).
    """
    rooms = np.zeros(len(lengths), dtype=np.int64)
    bins = np.empty(len(lengths), dtype=np.int64)
    opened = 0
    for item, length in enumerate(lengths.tolist()):
        fits = np.flatnonzero(rooms[:opened] >= length)
        number = int(fits[0]) if len(fits) else opened
        if number == opened:
            rooms[opened] = capacity
            opened += 1
        rooms[number] -= length
        bins[item] = number
    return bins


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """First-fit over the pieces sorted longest first (ties in arrival order)."""
    order = np.argsort(-lengths, kind="stable")
    bins = np.empty(len(lengths), dtype=np.int64)
    bins[order] = first_fit(lengths[order], capacity)
    return bins


FITS: dict[str, Fit] = {
    "best-fit": best_fit,
    "first-fit": first_fit,
    "first-fit-decreasing": first_fit_decreasing,
}


@dataclass(frozen=True, slots=True)
class PackPlan:
    """Which pieces of the stream make each packed sequence.

    Attributes:
        starts: Stream position of each piece, sequence by sequence (in a sequence, in the
            order they are laid out).
        lengths: Each piece's tokens.
        sequence_starts: Offsets into ``starts`` where each sequence's pieces begin, and
            the number of pieces at the end.
        window_sequences: Sequences of each window, in window order.
        capacity: Tokens a sequence holds (``seq_len + 1``).
    """

    starts: np.ndarray
    lengths: np.ndarray
    sequence_starts: np.ndarray
    window_sequences: np.ndarray
    capacity: int

    @property
    def sequences(self) -> int:
        """Packed sequences."""
        return len(self.sequence_starts) - 1

    @property
    def real_tokens(self) -> np.ndarray:
        """Stream tokens in each sequence (the rest is padding)."""
        if not len(self.lengths):
            return np.zeros(self.sequences, dtype=np.int64)
        return np.add.reduceat(self.lengths, self.sequence_starts[:-1])

    @property
    def padding_tokens(self) -> int:
        """Padding over all sequences."""
        return self.sequences * self.capacity - int(self.lengths.sum())

    def pieces(self, sequence: int) -> tuple[np.ndarray, np.ndarray]:
        """Stream starts and lengths of one sequence's pieces."""
        a, b = self.sequence_starts[sequence], self.sequence_starts[sequence + 1]
        return self.starts[a:b], self.lengths[a:b]


def split_documents(doc_starts: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Pieces of the documents of ``doc_starts`` (starts plus the end), each document cut
    into pieces of ``capacity`` tokens and its remainder: their starts and lengths."""
    bounds = np.asarray(doc_starts, dtype=np.int64)
    starts: np.ndarray = bounds[:-1]
    lengths: np.ndarray = bounds[1:] - bounds[:-1]
    counts: np.ndarray = -(-lengths // capacity)
    first = np.repeat(starts, counts)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    piece_starts = first + within * capacity
    ends = np.repeat(starts + lengths, counts)
    return piece_starts, np.minimum(piece_starts + capacity, ends) - piece_starts


def pack_documents(
    doc_starts: np.ndarray, *, capacity: int, window: int, fit: Fit = best_fit
) -> PackPlan:
    """The packing plan of a stream's documents (see the module docstring).

    Args:
        doc_starts: Stream position of each document's first token, and the total at the
            end (a token index's :func:`~stoker.format.tokens.document_starts`).
        capacity: Tokens a sequence holds (``seq_len + 1``).
        window: Documents packed together.
        fit: The rule that places a window's pieces (:func:`best_fit`).

    Returns:
        The plan: every token of every document in exactly one sequence.
    """
    doc_starts = np.asarray(doc_starts, dtype=np.int64)
    documents = len(doc_starts) - 1
    starts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    window_sequences: list[int] = []
    for first in range(0, documents, window):
        bounds = doc_starts[first : min(first + window, documents) + 1]
        piece_starts, piece_lengths = split_documents(bounds, capacity)
        keep = piece_lengths > 0  # an empty document has no piece
        piece_starts, piece_lengths = piece_starts[keep], piece_lengths[keep]
        bins = fit(piece_lengths, capacity)
        order = np.argsort(bins, kind="stable")  # by sequence, then in stream order
        starts.append(piece_starts[order])
        lengths.append(piece_lengths[order])
        opened = int(bins.max()) + 1 if len(bins) else 0
        counts.append(np.bincount(bins, minlength=opened))
        window_sequences.append(opened)
    cat = np.concatenate
    per_sequence = cat(counts) if counts else np.zeros(0, dtype=np.int64)
    return PackPlan(
        starts=cat(starts) if starts else np.zeros(0, dtype=np.int64),
        lengths=cat(lengths) if lengths else np.zeros(0, dtype=np.int64),
        sequence_starts=cat([[0], np.cumsum(per_sequence)]).astype(np.int64),
        window_sequences=np.asarray(window_sequences, dtype=np.int64),
        capacity=capacity,
    )
