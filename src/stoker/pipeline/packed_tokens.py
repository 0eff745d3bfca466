"""PackedTokenSource: a token dataset's documents packed whole into sequences, a Loader source.

``TokenLoader(url, seq_len=..., packing="best-fit")`` reads this source instead of
:class:`~stoker.pipeline.tokens.TokenSource`. Its units are the sequences of the packing
plan (:func:`~stoker.pipeline.token_packing.pack_documents`, computed from the index when
the source is made, the same on every rank and worker); everything else is the token
source's: the Loader's order over units, its partition into equal shares per rank,
prefetch, the disk cache and ``state_dict``. Each window of the plan is a shard of the
order, one block by default, so a block is one window's documents, consecutive in the
stream and read with one ranged GET, and a read group several windows far apart.

A unit is ``{"tokens": row, "sequence": k, "real": n, "pieces": lengths}``: ``row`` its
``seq_len + 1`` tokens (its pieces laid end to end, zeros after them), ``n`` the stream
tokens in it, ``lengths`` its pieces'. The batcher
(:class:`~stoker.pipeline.token_batcher.TokenBatcher`) pads and masks the rest and cuts
document boundaries at the pieces.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from stoker.format.reader import ShardDataset
from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.plan import group_blocks_for
from stoker.pipeline.token_batcher import TokenConfig
from stoker.pipeline.token_packing import pack_documents
from stoker.pipeline.token_source import TokenSource

#: Pieces closer together than this in the stream are read with one GET (the bytes
#: between them read and dropped): a request costs about as much as 256 kB of transfer.
READ_GAP_BYTES = 256 * 1024


class PackedTokenSource(TokenSource):
    """The sequences of a token dataset's best-fit packing plan: a Loader source.

    Args:
        dataset: A token dataset (its index has a ``tokens`` section).
        config: Sequence length, ``packing="best-fit"``, the pad id and the window.

    Raises:
        ValueError: Not a token dataset, an empty stream, ids or a pad id the output
            dtype cannot hold, or no pad id where the dataset has no end-of-text id.
    """

    def __init__(self, dataset: ShardDataset, config: TokenConfig) -> None:
        super().__init__(dataset, config)
        pad_id = config.pad_id if config.pad_id is not None else self.reader.layout.eos_id
        if pad_id is None:
            raise ValueError(
                f"{dataset.url} was packed without an end-of-text id to pad with: give "
                "TokenConfig(pad_id=...) (TokenLoader(pad_id=...))"
            )
        if pad_id > np.iinfo(np.dtype(config.dtype)).max:
            raise ValueError(f"{dataset.url}: pad_id={pad_id} does not fit dtype={config.dtype!r}")
        self.config = replace(config, pad_id=pad_id)

    def _count_sequences(self) -> int:
        self.plan = pack_documents(
            self.reader.doc_starts, capacity=self.span, window=self.config.packing_window
        )
        self._real = self.plan.real_tokens
        return self.plan.sequences

    @property
    def shard_sizes(self) -> list[int]:
        """The sequences of each window: a block never straddles two windows."""
        return [int(n) for n in self.plan.window_sequences]

    @property
    def remainder_tokens(self) -> int:
        """0: every token of the stream is in a sequence."""
        return 0

    @property
    def padding_tokens(self) -> int:
        """Padding over all the plan's sequences."""
        return self.plan.padding_tokens

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        """Unset ``block_size``: a window's sequences (each window one block, one read);
        unset ``group_blocks``: read groups of about 16 MB."""
        block_size = order.block_size or max(1, int(self.plan.window_sequences.max(initial=1)))
        group_blocks = order.group_blocks
        if group_blocks is None:
            group_blocks = group_blocks_for(block_size, units=units, unit_bytes=unit_bytes)
        return replace(order, block_size=block_size, group_blocks=group_blocks)

    def mix_batcher(
        self, mix: object, parts: Sequence[object], settings: BatcherSettings
    ) -> Batcher:
        """The batcher of this source's packed sequences.

        Raises:
            ValueError: A mix (packed sequences are read from one dataset), or a transform.
        """
        if mix is not None:
            raise ValueError(
                f"{self.url}: packing='best-fit' reads one token dataset; mix sources "
                "with packing='concat'"
            )
        return super().mix_batcher(mix, parts, settings)

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        wanted = np.asarray(ids, dtype=np.int64)
        if not len(wanted):
            return []
        unique = np.unique(wanted)
        if unique[0] < 0 or unique[-1] >= self.sequences:
            raise IndexError(f"{self.url}: sequence ids outside 0..{self.sequences - 1}")
        plan = self.plan
        first = plan.sequence_starts[unique]
        counts = plan.sequence_starts[unique + 1] - first
        before = np.cumsum(counts) - counts  # each sequence's first piece in the lists below
        piece = np.repeat(first - before, counts) + np.arange(int(counts.sum()))
        starts, lengths = plan.starts[piece], plan.lengths[piece]
        run_starts, run_stops = read_runs(starts, lengths, gap=self._gap_tokens())
        reads = await asyncio.gather(
            *(self.reader.read_async(a, b) for a, b in zip(run_starts, run_stops, strict=True))
        )
        rows = np.zeros((len(unique), self.span), dtype=self.reader.layout.dtype)
        _lay_out(rows, reads, run_starts, starts, lengths, counts)
        at = dict(zip(unique.tolist(), range(len(unique)), strict=True))
        ends = np.cumsum(counts).tolist()
        firsts = before.tolist()
        real = self._real
        return [
            {
                "tokens": rows[at[k]],
                "sequence": k,
                "real": int(real[k]),
                "pieces": lengths[firsts[at[k]] : ends[at[k]]],
            }
            for k in wanted.tolist()
        ]

    def _gap_tokens(self) -> int:
        return READ_GAP_BYTES // self.reader.layout.itemsize


def read_runs(starts: np.ndarray, lengths: np.ndarray, *, gap: int) -> tuple[list[int], list[int]]:
    """The stream runs to read for pieces at ``starts`` of ``lengths``: pieces sorted by
    start, joined where fewer than ``gap`` tokens lie between them; each run's start and
    stop (a window read whole is one run)."""
    order = np.argsort(starts, kind="stable")
    starts, stops = starts[order], starts[order] + lengths[order]
    reach = np.maximum.accumulate(stops)
    new = np.flatnonzero(starts[1:] - reach[:-1] > gap) + 1
    first = np.concatenate([[0], new])
    last = np.concatenate([new - 1, [len(starts) - 1]])
    return starts[first].tolist(), reach[last].tolist()


def _lay_out(
    rows: np.ndarray,
    reads: Sequence[np.ndarray],
    run_starts: Sequence[int],
    starts: np.ndarray,
    lengths: np.ndarray,
    counts: np.ndarray,
) -> None:
    """Copy each piece (``starts``, ``lengths``; ``counts`` of them per row, in row order)
    from the run it was read with into its row, end to end."""
    run = np.searchsorted(np.asarray(run_starts), starts, side="right") - 1
    source = starts - np.asarray(run_starts, dtype=np.int64)[run]
    offsets = np.cumsum(lengths) - lengths  # where each piece starts, all rows end to end
    within = offsets - np.repeat(offsets[np.cumsum(counts) - counts], counts)
    target = np.repeat(np.arange(len(counts)) * rows.shape[1], counts) + within
    flat = rows.reshape(-1)
    for r, s, t, n in zip(
        run.tolist(), source.tolist(), target.tolist(), lengths.tolist(), strict=True
    ):
        flat[t : t + n] = reads[r][s : s + n]  # one memcpy a piece: ~4 a sequence
