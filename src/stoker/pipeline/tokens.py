"""Token sources: what a :class:`~stoker.TokenLoader` reads from a packed token stream.

:func:`token_sources` makes a token dataset's source as its
:class:`~stoker.pipeline.token_batcher.TokenConfig` says: the sequences of the
concatenated stream (:class:`~stoker.pipeline.token_source.TokenSource`, the default) or
documents packed whole (:class:`~stoker.pipeline.packed_tokens.PackedTokenSource`,
``packing="best-fit"``). An epoch's first batch is fetched apart
(:func:`first_batch_apart`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from stoker.format.reader import ShardDataset
from stoker.pipeline.packed_tokens import PackedTokenSource
from stoker.pipeline.plan import EpochPlan, chunks_covering
from stoker.pipeline.token_batcher import TokenConfig
from stoker.pipeline.token_source import (
    TokenSource,
    stream_tokens,
    token_block_size,
    token_order,
    token_parts,
)

__all__ = [
    "TokenSource",
    "first_batch_apart",
    "stream_tokens",
    "token_block_size",
    "token_order",
    "token_parts",
    "token_sources",
]


def token_sources(
    datasets: Sequence[ShardDataset], config: TokenConfig | None, *, extras: bool = False
) -> list[TokenSource]:
    """The token sources of ``datasets``, read as ``config`` says.

    Raises:
        ValueError: No ``config`` (the message names :class:`~stoker.TokenLoader`), a
            dataset that is not a token dataset, or ``extras`` (windows, side tables).
    """
    if config is None:
        url = next((d.url for d in datasets if d.index.tokens is not None), "")
        raise ValueError(
            f"{url} is a token dataset: read it with "
            "stoker.TokenLoader(url, seq_len=..., batch_size=...)"
        )
    if extras:
        raise ValueError("token datasets take no windows or side tables")
    if config.packed:
        return [PackedTokenSource(d, config) for d in datasets]
    return [TokenSource(d, config) for d in datasets]


def first_batch_apart(plan: EpochPlan) -> EpochPlan:
    """``plan`` with its first batch's sequences fetched on their own, first.

    A read group is about 16 MB; the first batch of 8 sequences of 2,049 ``uint16`` tokens
    is 32 kB. The prefetcher fetches only the chunks the first batch needs before it is
    out, so with its sequences as the first chunk (one ranged read per run of them) the
    first batch waits for its own bytes, not for a whole group; the rest of the groups it
    came from follow as the next chunks. Every sequence is still fetched once (bytes per
    epoch unchanged, a few more GETs), and the batches and their order are the plan's.
    """
    if not plan.mine or not plan.chunks:
        return plan
    first = plan.batches[plan.mine[0]]
    need = chunks_covering(plan.chunks, first)
    head = plan.chunks[:need]
    rest = [chunk[~np.isin(chunk, first)] for chunk in head]
    if sum(len(chunk) for chunk in rest) == 0:
        return plan  # the first batch is its groups already
    own = np.concatenate([chunk[np.isin(chunk, first)] for chunk in head])
    chunks = [own, *(chunk for chunk in rest if len(chunk)), *plan.chunks[need:]]
    return replace(plan, chunks=chunks)
