"""TokenBatcher: a batch of token sequences as ``input_ids``, ``labels`` and ``targets``.

The :class:`~stoker.pipeline.batcher.Batcher` a token source
(:class:`~stoker.pipeline.tokens.TokenSource`) makes: there is nothing to decode, so it
has no workers. :class:`TokenConfig` says how a stream becomes batches. Each sequence of
``seq_len + 1`` stream tokens is cast once into its row of ``input_ids`` (its first
``seq_len`` tokens) and once into its row of ``targets`` (its last ``seq_len``: the next
token of each input), and ``labels`` is a copy of ``input_ids`` (Hugging Face's
convention: the model shifts), all three in one
preallocated array of the output dtype, recycled once the consumer lets go of the batch
(:class:`~stoker.pipeline.batch_arrays.BatchArrays`): a fresh 393 kB per batch of 8 x 2048
int64 triples cost the kernel a page fault per 4 kB, more than the casts themselves.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.core.checks import check_bool, check_choice, check_int
from stoker.core.metrics import Stage, Stages
from stoker.pipeline.batch_arrays import BatchArrays
from stoker.pipeline.pending import PendingBatch
from stoker.pipeline.token_packing import DEFAULT_PACKING_WINDOW, PACKING_MODES, PackingMode

#: Output dtypes of ``input_ids``, ``labels`` and ``targets`` a TokenLoader makes.
OUTPUT_DTYPES = ("int64", "int32", "uint32", "uint16")


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenConfig:
    """How a token stream becomes batches.

    Attributes:
        seq_len: Tokens of ``input_ids`` (and of ``labels`` and ``targets``) per sequence;
            each sequence reads ``seq_len + 1`` tokens of the stream.
        documents: Add ``position_ids``, ``doc_lens``, ``cu_seqlens`` and ``max_seqlen``
            (document boundaries, from the index).
        dtype: dtype of ``input_ids``, ``labels`` and ``targets`` (``int64`` is what torch
            embeddings take).
        packing: ``"concat"`` (or None): sequences cut from the concatenated stream;
            ``"best-fit"``: documents placed whole into sequences, the rest padded
            (:mod:`~stoker.pipeline.token_packing`; needs a signed ``dtype``, since
            padding is ``-100`` in ``labels`` and ``targets``).
        pad_id: The id of padding in ``input_ids`` with ``"best-fit"``; None takes the
            dataset's end-of-text id (a dataset packed without one needs it given).
        packing_window: Documents (consecutive in the stream) packed together with
            ``"best-fit"``.
    """

    seq_len: int
    documents: bool = False
    dtype: str = "int64"
    packing: PackingMode | None = "concat"
    pad_id: int | None = None
    packing_window: int = DEFAULT_PACKING_WINDOW

    def __post_init__(self) -> None:
        check_int("seq_len", self.seq_len, minimum=1)
        check_bool("documents", self.documents)
        if self.dtype not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be one of {OUTPUT_DTYPES}, got {self.dtype!r}")
        if self.packing is None:
            object.__setattr__(self, "packing", "concat")
        check_choice("packing", self.packing, PACKING_MODES)
        check_int("packing_window", self.packing_window, minimum=1)
        if self.pad_id is not None:
            check_int("pad_id", self.pad_id, minimum=0)
        if not self.packed:
            if self.pad_id is not None:
                raise ValueError("pad_id pads packed sequences: give packing='best-fit'")
            return
        if np.dtype(self.dtype).kind != "i":
            raise ValueError(
                f"packing='best-fit' masks padding with -100 in labels and targets: "
                f"dtype must be 'int64' or 'int32', got {self.dtype!r}"
            )
        if self.pad_id is not None and self.pad_id > np.iinfo(np.dtype(self.dtype)).max:
            raise ValueError(f"pad_id={self.pad_id} does not fit dtype={self.dtype!r}")

    @property
    def span(self) -> int:
        """Stream tokens per sequence: ``seq_len + 1``."""
        return self.seq_len + 1

    @property
    def packed(self) -> bool:
        """Whether documents are packed whole (``packing="best-fit"``)."""
        return self.packing == "best-fit"


#: Batches' arrays the batcher keeps for reuse (the torch adapter holds two batches).
KEEP_ARRAYS = 4


class TokenBatcher:
    """Casts a batch's sequences into ``input_ids``, ``labels`` and ``targets``: the
    :class:`~stoker.pipeline.batcher.Batcher` of token sources.

    ``labels`` equals ``input_ids``, as a Hugging Face causal LM takes them (the model
    shifts: position ``j``'s logits are scored against ``labels[:, j + 1]``); ``targets``
    is already shifted, the next token of each input (``targets[:, j]`` is stream token
    ``j + 1`` of the sequence), for a plain cross-entropy of every position. The three
    are C-contiguous ``(N, seq_len)`` arrays of the output dtype that share no element
    (masking ``labels`` with ``-100`` never changes ``input_ids``); all are views into one
    buffer that is written again for a later batch only once nothing refers to any.

    Args:
        config: Sequence length, output dtype, whether to add document boundaries.
        doc_starts: Each source's document starts (see :attr:`TokenSource.doc_starts`).
        mixed: Units carry the ``source`` they came from (a mix); batches then do too.
        stages: Where collating is timed.
    """

    def __init__(
        self, config: TokenConfig, *, doc_starts: list[np.ndarray], mixed: bool, stages: Stages
    ) -> None:
        self.config = config
        self.doc_starts = doc_starts
        self.mixed = mixed
        self.stages = stages
        self.dtype = np.dtype(config.dtype)
        self.arrays = BatchArrays(keep=KEEP_ARRAYS)
        self._flat = np.zeros(0, dtype=np.int64)
        self._pad_id = 0 if config.pad_id is None else config.pad_id

    @property
    def workers(self) -> None:
        """None: batches are assembled in the loader's thread (casting takes microseconds)."""
        return None

    def start(self, ids: np.ndarray, raw: list[dict[str, Any]], epoch: int) -> PendingBatch:
        """Keep a batch's sequences until :meth:`finish` (casting them takes microseconds)."""
        return PendingBatch(np.asarray(ids, dtype=np.int64), raw, None, [])

    def finish(self, pending: PendingBatch, skipped: list[tuple[str, str]]) -> dict[str, Any]:
        """The batch: ``input_ids``, ``labels`` and ``targets`` ``(N, seq_len)``, ``index``
        (sequence ids, or mixed ids in a mix), ``source`` in a mix, and document
        boundaries when asked."""
        started = time.perf_counter()
        raw = pending.raw
        inputs, labels, targets = self._rows([unit["tokens"] for unit in raw])
        batch: dict[str, Any] = {
            "input_ids": inputs,
            "labels": labels,
            "targets": targets,
            "index": pending.ids,
        }
        if self.mixed:
            batch["source"] = np.fromiter(
                (unit["source"] for unit in raw), dtype=np.int64, count=len(raw)
            )
        if self.config.packed:
            real = np.fromiter((u["real"] for u in raw), dtype=np.int64, count=len(raw))
            mask_padding(inputs, labels, targets, real, pad_id=self._pad_id)
        if self.config.documents:
            batch.update(self._documents(raw, batch.get("source")))
        self.stages.record(
            Stage.COLLATE, time.perf_counter() - started, start_s=started, items=len(raw)
        )
        return batch

    def _rows(self, rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``input_ids``, ``labels`` and ``targets`` of ``rows`` (sequences of ``seq_len +
        1`` tokens): the rows joined, one cast-copy into inputs and targets, and a copy of
        inputs into labels (few numpy calls: each one may let the I/O thread take the
        GIL)."""
        count, seq_len = len(rows), self.config.seq_len
        out = self.arrays.take((3, count, seq_len * self.dtype.itemsize)).view(self.dtype)
        if count:
            joined = np.concatenate(rows)
            item = joined.itemsize
            # [k, i, j] = joined[i * span + j + k]: inputs (k = 0) and targets (k = 1).
            shifted = np.ndarray(
                (2, count, seq_len),
                dtype=joined.dtype,
                buffer=joined,
                strides=(item, self.config.span * item, item),
            )
            np.copyto(out[:2], shifted, casting="unsafe")
            np.copyto(out[2], out[0])
        return out[0], out[2], out[1]

    def _documents(self, raw: list[dict[str, Any]], sources: np.ndarray | None) -> dict[str, Any]:
        seq_len = self.config.seq_len
        size = len(raw) * seq_len
        if len(self._flat) != size:  # one batch shape all epoch (a last one may differ)
            self._flat = np.arange(size, dtype=np.int64)
        if self.config.packed:
            cuts = packed_cuts([u["pieces"] for u in raw], seq_len=seq_len)  # sorted
            return boundaries_from_cuts(cuts, rows=len(raw), seq_len=seq_len, flat=self._flat)
        sequences = np.fromiter((u["sequence"] for u in raw), dtype=np.int64, count=len(raw))
        return document_boundaries(
            sequences * self.config.span,
            np.zeros(len(raw), dtype=np.int64) if sources is None else sources,
            self.doc_starts,
            seq_len=seq_len,
            flat=self._flat,
        )


#: What ``labels`` and ``targets`` hold where a packed sequence is padding: Hugging Face's
#: and torch's ``cross_entropy``'s ignore index.
IGNORE_INDEX = -100


def mask_padding(
    inputs: np.ndarray,
    labels: np.ndarray,
    targets: np.ndarray,
    real: np.ndarray,
    *,
    pad_id: int,
) -> None:
    """Pad packed rows in place: row ``r`` holds ``real[r]`` stream tokens of its
    ``seq_len + 1``; the rest is ``pad_id`` in ``inputs`` and ``-100`` in ``labels``
    (from ``real``) and ``targets`` (from ``real - 1``: no position predicts padding)."""
    span = inputs.shape[1] + 1
    for row, count in enumerate(real.tolist()):  # a few rows: slices beat a batch mask
        if count == span:
            continue  # full: no padding
        inputs[row, count:] = pad_id
        labels[row, count:] = IGNORE_INDEX
        targets[row, count - 1 :] = IGNORE_INDEX


def packed_cuts(pieces: Sequence[np.ndarray], *, seq_len: int) -> np.ndarray:
    """Where each piece of packed rows starts in the flattened batch's inputs, padding
    (what follows a row's pieces) a piece of its own; sorted, from 0."""
    if not pieces:
        return np.zeros(0, dtype=np.int64)
    counts = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    ends = np.cumsum(np.concatenate(pieces))  # all rows' pieces end to end
    row_ends = ends[np.cumsum(counts) - 1]
    base = np.concatenate([[0], row_ends[:-1]])  # tokens before each row, end to end
    # Each row starts a piece at 0, then one at each of its pieces' ends (the last: its
    # padding), as long as it starts inside the row's inputs.
    within = ends - np.repeat(base, counts)
    row = np.repeat(np.arange(len(pieces), dtype=np.int64), counts)
    inside = within < seq_len
    starts = np.arange(len(pieces), dtype=np.int64) * seq_len
    return np.sort(np.concatenate([starts, within[inside] + row[inside] * seq_len]))


def document_boundaries(
    starts: np.ndarray,
    sources: np.ndarray,
    doc_starts: Sequence[np.ndarray],
    *,
    seq_len: int,
    flat: np.ndarray | None = None,
) -> dict[str, Any]:
    """Document boundaries of a batch of sequences' inputs, from the documents' starts.

    Each row's inputs (stream tokens ``[start, start + seq_len)``) are cut into pieces:
    the documents inside it, the first and last possibly cut by the row's ends.

    Args:
        starts: Stream position of each row's first token.
        sources: Each row's stream, an index into ``doc_starts``.
        doc_starts: Each stream's document starts (plus its total at the end).
        seq_len: Tokens per row.
        flat: ``arange(len(starts) * seq_len)``, if the caller keeps one.

    Returns:
        ``position_ids`` ``(N, seq_len)`` int64, counting from 0 at the start of each piece
        (a row that starts inside a document counts from 0 there too, so 0 marks every
        boundary, as packed-sequence attention expects); ``doc_lens``, a list of each row's
        piece lengths (int32); ``cu_seqlens`` (int32), the pieces' offsets in the flattened
        batch, from 0 to ``N * seq_len`` (FlashAttention's varlen form); ``max_seqlen``, the
        longest piece.
    """
    rows = len(starts)
    size = rows * seq_len
    cuts = [np.arange(0, size, seq_len, dtype=np.int64)]  # every row starts a piece
    streams = [0] if len(doc_starts) == 1 else np.unique(sources).tolist()
    for k in streams:
        mine = np.flatnonzero(sources == k) if len(doc_starts) > 1 else np.arange(rows)
        docs = doc_starts[k]
        # Documents starting strictly inside each row: docs[lo:hi].
        lo = np.searchsorted(docs, starts[mine], side="right")
        hi = np.searchsorted(docs, starts[mine] + seq_len, side="left")
        counts = hi - lo
        if not counts.sum():
            continue
        row = np.repeat(mine, counts)
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        cuts.append(docs[np.repeat(lo, counts) + within] - starts[row] + row * seq_len)
    return boundaries_from_cuts(
        np.sort(np.concatenate(cuts)), rows=rows, seq_len=seq_len, flat=flat
    )


def boundaries_from_cuts(
    first: np.ndarray, *, rows: int, seq_len: int, flat: np.ndarray | None = None
) -> dict[str, Any]:
    """``position_ids``, ``doc_lens``, ``cu_seqlens`` and ``max_seqlen`` (see
    :func:`document_boundaries`) of a batch of ``rows`` rows whose pieces start at
    ``first`` in the flattened batch (sorted, every row's start among them)."""
    size = rows * seq_len
    lengths = np.diff(np.append(first, size))
    flat = np.arange(size, dtype=np.int64) if flat is None else flat
    position_ids = (flat - np.repeat(first, lengths)).reshape(rows, seq_len)
    bounds = [0, *np.searchsorted(first, np.arange(1, rows) * seq_len).tolist(), len(first)]
    pieces = lengths.astype(np.int32)
    return {
        "position_ids": position_ids,
        "doc_lens": [pieces[a:b] for a, b in itertools.pairwise(bounds)],
        "cu_seqlens": np.append(first, size).astype(np.int32),
        "max_seqlen": int(lengths.max()) if len(lengths) else 0,
    }
