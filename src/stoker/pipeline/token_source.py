"""TokenSource: the sequences of a token dataset's concatenated stream, a Loader source.

A token dataset (:mod:`stoker.format.tokens`) is one stream of tokens. Cut into sequences
of ``seq_len + 1`` tokens, sequence ``k`` is tokens ``[k * (seq_len + 1), (k + 1) *
(seq_len + 1))``: its first ``seq_len`` tokens are the inputs (and the ``labels``, which
equal them as Hugging Face's causal LMs expect), its last ``seq_len`` the ``targets`` (the
next token of each input). The tokens after the last whole sequence (fewer than
``seq_len + 1``) are never read.

:class:`TokenSource` is the Loader's source whose units are these sequences. Its order is
:func:`~stoker.pipeline.order.epoch_order` over one virtual shard of ``N`` sequences, so a
block is a run of consecutive sequences, one ranged read of about
:data:`~stoker.pipeline.plan.BLOCK_TARGET_BYTES`, and partition and resume are the
Loader's (a few integers). The source makes its batcher,
:class:`~stoker.pipeline.token_batcher.TokenBatcher`, which casts a batch's sequences
into its arrays and, on request, adds document boundaries
(:func:`~stoker.pipeline.token_batcher.document_boundaries`), computed from the index,
never by scanning for an end-of-text id. Its order sizes blocks and read groups by bytes
of sequences (:func:`token_order`). Packed sequences
(:class:`~stoker.pipeline.packed_tokens.PackedTokenSource`) build on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from stoker.format.reader import ShardDataset
from stoker.format.token_reader import TokenReader
from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.order import EpochOrder, OrderConfig, epoch_order
from stoker.pipeline.plan import BLOCK_TARGET_BYTES, MIN_GROUPS, group_blocks_for
from stoker.pipeline.token_batcher import TokenBatcher, TokenConfig


class TokenSource:
    """Sequences of ``seq_len + 1`` tokens of one token dataset: a Loader source.

    Units are sequence numbers. Each unit is ``{"tokens": row, "sequence": k}``, ``row`` a
    read-only view into the run of sequences it was read with (no copy).

    Args:
        dataset: A token dataset (its index has a ``tokens`` section).
        config: Sequence length and batch settings.

    Raises:
        ValueError: Not a token dataset, too few tokens for one sequence, or an output
            dtype that cannot hold the dataset's largest id.
    """

    def __init__(self, dataset: ShardDataset, config: TokenConfig) -> None:
        self.reader = TokenReader(dataset)
        self.config = config
        self.span = config.span
        layout = self.reader.layout
        self.sequences = self._count_sequences()
        if not self.sequences:
            raise ValueError(
                f"{dataset.url}: {self.reader.tokens} tokens, fewer than one sequence of "
                f"seq_len + 1 = {self.span}"
            )
        if layout.max_id > np.iinfo(np.dtype(config.dtype)).max:
            raise ValueError(
                f"{dataset.url}: token ids go up to {layout.max_id}, more than "
                f"dtype={config.dtype!r} holds"
            )

    def _count_sequences(self) -> int:
        return self.reader.tokens // self.span

    @property
    def url(self) -> str:
        return self.reader.dataset.url

    @property
    def datasets(self) -> list[ShardDataset]:
        return [self.reader.dataset]

    @property
    def extra_fields(self) -> tuple[str, ...]:
        return ()

    @property
    def shard_sizes(self) -> list[int]:
        """One virtual shard of every sequence: blocks are runs of consecutive sequences."""
        return [self.sequences]

    @property
    def tokens(self) -> int:
        """Tokens in the stream."""
        return self.reader.tokens

    @property
    def padding_tokens(self) -> int:
        """Padding in the sequences: 0, the stream is cut without any."""
        return 0

    @property
    def remainder_tokens(self) -> int:
        """Tokens after the last whole sequence, never read."""
        return self.reader.tokens - self.sequences * self.span

    @property
    def doc_starts(self) -> np.ndarray:
        """Stream position of each document's first token, and the total at the end."""
        return self.reader.doc_starts

    cut_first_batch = True  # 32 kB of sequences need not wait for a 16 MB read group
    one_get_per_unit = False

    @property
    def row_fields(self) -> tuple[str, ...]:
        """``input_ids``, ``labels``, ``targets``, ``index``, ``real`` (exact evaluation's
        row mask, where a batch has it) and ``position_ids`` with documents;
        ``cu_seqlens``, ``doc_lens`` and ``max_seqlen`` follow the documents."""
        rows = ("input_ids", "labels", "targets", "index", "real")
        return (*rows, "position_ids") if self.config.documents else rows

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        return token_order(order, units=units, unit_bytes=unit_bytes)

    def make_batcher(self, settings: BatcherSettings) -> Batcher:
        return self.mix_batcher(None, [self], settings)

    def mix_batcher(
        self, mix: object, parts: Sequence[object], settings: BatcherSettings
    ) -> Batcher:
        """The batcher of the sequences of ``parts`` (this source, or a mix's sources:
        ``mix``, None for this one alone).

        Raises:
            ValueError: A transform, or a part that is no token source.
        """
        if settings.transform is not None:
            raise ValueError(f"{self.url}: token sequences take no transform")
        tokens = token_parts(parts)
        if tokens is None:
            raise ValueError(f"{self.url}: a mix of token sequences and samples")
        return TokenBatcher(
            self.config,
            doc_starts=[s.doc_starts for s in tokens] if self.config.documents else [],
            mixed=mix is not None,
            stages=settings.stages,
        )

    def shard_of(self, unit: int) -> str | None:
        return None  # a sequence may span shards

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        return epoch_order(self.shard_sizes, config=config, epoch=epoch)

    def units(self) -> int:
        return self.sequences

    def shuffled(self) -> bool:
        # Documents packed in a shuffled order (stoker pack's default, or an unrecorded
        # order) make sequences independent enough: a batch draws from a read group of
        # blocks far apart, and a wider window would only hold memory. A pack that kept its
        # input's order (sorted by source, date) gets the Loader's mixing window
        # (docs/tokens.md).
        return self.reader.dataset.index.packed_with.get("shuffle_seed", 0) is not None

    def unit_bytes(self) -> float:
        return float(self.span * self.reader.layout.itemsize)

    def nbytes(self, ids: Sequence[int]) -> int:
        return len(ids) * self.span * self.reader.layout.itemsize

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        wanted = np.asarray(ids, dtype=np.int64)
        if not len(wanted):
            return []
        unique = np.unique(wanted)
        if unique[0] < 0 or unique[-1] >= self.sequences:
            raise IndexError(f"{self.url}: sequence ids outside 0..{self.sequences - 1}")
        # Consecutive sequences are one run of the stream: one ranged read each.
        runs = np.split(unique, np.flatnonzero(np.diff(unique) != 1) + 1)
        span = self.span
        reads = await asyncio.gather(
            *(self.reader.read_async(int(r[0]) * span, (int(r[-1]) + 1) * span) for r in runs)
        )
        rows: dict[int, np.ndarray] = {}  # built at C speed: this runs for every sequence
        for run, data in zip(runs, reads, strict=True):
            rows.update(zip(run.tolist(), data.reshape(len(run), span), strict=True))
        return [{"tokens": rows[k], "sequence": k} for k in wanted.tolist()]


def token_block_size(unit_bytes: float) -> int:
    """Sequences per block: one ranged read of about :data:`BLOCK_TARGET_BYTES` (no cap on
    the count, unlike samples: sequences are small and always read together)."""
    return max(1, round(BLOCK_TARGET_BYTES / max(unit_bytes, 1.0)))


def token_order(order: OrderConfig | None, *, units: int, unit_bytes: float) -> OrderConfig:
    """Order settings for sequences: unset ``block_size`` and ``group_blocks`` sized for
    blocks of about 4 MB and read groups of about 16 MB (at least
    :data:`~stoker.pipeline.plan.MIN_GROUPS` groups an epoch); the rest is left to
    :func:`~stoker.pipeline.plan.resolve_order`."""
    order = order or OrderConfig()
    block_size = order.block_size or min(token_block_size(unit_bytes), max(1, units // MIN_GROUPS))
    group_blocks = order.group_blocks
    if group_blocks is None:
        group_blocks = group_blocks_for(block_size, units=units, unit_bytes=unit_bytes)
    return replace(order, block_size=block_size, group_blocks=group_blocks)


def token_parts(parts: Sequence[object]) -> list[TokenSource] | None:
    """``parts`` as token sources; None unless every one is."""
    found = [p for p in parts if isinstance(p, TokenSource)]
    return found if len(found) == len(parts) else None


def stream_tokens(source: object, units: int, span: int) -> int:
    """Tokens an epoch of ``source`` could deliver: a token source's whole stream, or in a
    mix its ``units`` sequences of ``span`` tokens."""
    return source.tokens if isinstance(source, TokenSource) else units * span
