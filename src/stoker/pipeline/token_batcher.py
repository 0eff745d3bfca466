"""TokenBatcher: a batch of token sequences as ``input_ids``, ``labels`` and ``targets``.

The Loader's assembler for token sources (:class:`~stoker.pipeline.tokens.TokenSource`):
there is nothing to decode, so no pool. Each sequence of ``seq_len + 1`` stream tokens is
cast once into its row of ``input_ids`` (its first ``seq_len`` tokens) and once into its
row of ``targets`` (its last ``seq_len``: the next token of each input), and ``labels``
is a copy of ``input_ids`` (Hugging Face's convention: the model shifts), all three in one
preallocated array of the output dtype, recycled once the consumer lets go of the batch
(:class:`~stoker.pipeline.batch_arrays.BatchArrays`): a fresh 393 kB per batch of 8 x 2048
int64 triples cost the kernel a page fault per 4 kB, more than the casts themselves.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from stoker.core.metrics import Stage, Stages
from stoker.pipeline.batch_arrays import BatchArrays
from stoker.pipeline.pending import PendingBatch
from stoker.pipeline.tokens import TokenConfig, document_boundaries

#: Batches' arrays the batcher keeps for reuse (the torch adapter holds two batches).
KEEP_ARRAYS = 4


class TokenBatcher:
    """Casts a batch's sequences into ``input_ids``, ``labels`` and ``targets``: the
    Loader's assembler for token sources (it has
    :class:`~stoker.pipeline.batching.BatchAssembler`'s methods).

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

    def start_workers(self, *, batch_size: int, depth: int) -> None:
        """Nothing to start: batches are assembled in the loader's thread."""

    def resize(self, threads: int) -> None:
        """No decode threads to resize."""

    def close(self) -> None:
        """Nothing to stop."""

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
        if self.config.documents:
            sequences = np.fromiter((u["sequence"] for u in raw), dtype=np.int64, count=len(raw))
            sources = batch["source"] if self.mixed else np.zeros(len(raw), dtype=np.int64)
            batch.update(self._documents(sequences, sources))
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

    def _documents(self, sequences: np.ndarray, sources: np.ndarray) -> dict[str, Any]:
        seq_len = self.config.seq_len
        size = len(sequences) * seq_len
        if len(self._flat) != size:  # one batch shape all epoch (a last one may differ)
            self._flat = np.arange(size, dtype=np.int64)
        return document_boundaries(
            sequences * self.config.span,
            sources,
            self.doc_starts,
            seq_len=seq_len,
            flat=self._flat,
        )
