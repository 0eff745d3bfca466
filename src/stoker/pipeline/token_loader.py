"""TokenLoader: fixed-length sequences of a packed token stream, for language-model training.

A :class:`~stoker.Loader` over a :class:`~stoker.pipeline.tokens.TokenSource`: the order,
its partition over ranks and workers, prefetch, the disk cache, ``state_dict`` and
``load_state_dict`` are the Loader's. What is the token stream's is its source's, which
the Loader asks: sequences of ``seq_len + 1`` tokens, their batcher
(:class:`~stoker.pipeline.token_batcher.TokenBatcher`), their order's block sizes, and an
epoch's first batch read on its own, ahead of its read groups. TokenLoader only passes
the sequences' settings on and names what an epoch leaves out. See docs/tokens.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from stoker.core.checks import check_bool
from stoker.format.reader import ShardDataset
from stoker.pipeline.autotune import AutotuneConfig
from stoker.pipeline.config import AdapterOptions, CacheConfig, LoaderOptions, SourceConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.plan import DropLast, rank_units
from stoker.pipeline.source import Source
from stoker.pipeline.sources import SourceLike, mix_parts
from stoker.pipeline.token_batcher import TokenConfig
from stoker.pipeline.token_packing import DEFAULT_PACKING_WINDOW, PackingMode
from stoker.pipeline.tokens import stream_tokens, token_parts
from stoker.pipeline.world import World

logger = logging.getLogger(__name__)


class TokenLoader(Loader):
    """Batches of ``seq_len`` tokens and their next tokens, from a packed token dataset.

    The stream (every shard's documents, concatenated) is cut into sequences of
    ``seq_len + 1`` tokens; sequence ``k`` is tokens ``[k * (seq_len + 1), (k + 1) *
    (seq_len + 1))``. Sequences are shuffled in blocks of consecutive ones (one ranged read
    of about 4 MB each) and dealt to ranks in equal counts, dropping fewer than
    ``world_size`` sequences to even them out::

        loader = TokenLoader("s3://bucket/tokens", seq_len=2048, batch_size=8)
        for batch in loader:
            batch["input_ids"]  # (8, 2048) int64: a sequence's first seq_len tokens
            batch["labels"]     # equal to input_ids: a Hugging Face causal LM shifts them
            batch["targets"]    # its last seq_len tokens, already shifted:
                                # targets[:, :-1] == input_ids[:, 1:]

    ``model(input_ids=b["input_ids"], labels=b["labels"])`` of a Hugging Face causal LM
    learns the next token; so does ``cross_entropy(logits, b["targets"])`` over every
    position. Every batch also has ``index``, the sequence ids (mixed ids in a mix, with
    ``source``).
    With ``documents=True`` it has ``position_ids`` (restarting at each document),
    ``doc_lens`` (each row's document pieces), ``cu_seqlens`` and ``max_seqlen``
    (FlashAttention's varlen form over the flattened batch), all from the index.

    ``state_dict()`` is the Loader's few integers: resume is exact, onto another world size
    too (the sequences the old ranks consumed are left out, the rest dealt anew). Every
    batch has ``batch_size`` rows (one shape for a compiled model) unless ``drop_last`` is
    false. An epoch leaves out the tokens after the last sequence, fewer than
    ``world_size`` sequences to even out the ranks, and each rank's last, incomplete
    batch (:attr:`dropped_sequences`, :attr:`dropped_tokens`, logged once).

    Args:
        source: A token dataset's URL or path, or a
            :class:`~stoker.pipeline.config.SourceConfig` of several with ``mix`` (a
            :class:`~stoker.pipeline.mixing.MixConfig` by tokens: every source's sequences
            hold ``seq_len + 1`` tokens).
        seq_len: Tokens per row of ``input_ids``.
        batch_size: Sequences per batch.
        seed: Seed of the order (0 by default).
        drop_last: Leave out each rank's last batch when it is incomplete; false delivers
            it, short (the same number of rows on every rank). Ranks are evened out by
            dropping fewer than ``world_size`` sequences either way, never by repeats.
        documents: Add document boundaries (see above).
        dtype: dtype of ``input_ids``, ``labels`` and ``targets``: ``"int64"`` (what
            torch embeddings take), ``"int32"``, ``"uint32"`` or ``"uint16"``.
        packing: ``"concat"`` (or None): sequences cut from the concatenated stream;
            ``"best-fit"``: documents placed whole into sequences of ``seq_len + 1``
            tokens (best-fit decreasing within windows of ``packing_window`` documents, a
            longer document cut into pieces of ``seq_len + 1``), the rest padded with
            ``pad_id`` and ``-100`` in ``labels`` and ``targets`` (a signed ``dtype``). See
            docs/tokens.md.
        pad_id: The padding id of ``input_ids`` with ``"best-fit"``; None: the dataset's
            end-of-text id.
        packing_window: Documents, consecutive in the stream, packed together.
        order: Shuffle settings; unset block and group sizes give blocks of about 4 MB and
            read groups of about 16 MB.
        world: This rank (and loader worker); default rank 0 of 1.
        prefetch: Read groups held ahead, or ``"auto"``.
        autotune: The autotuner's budgets.
        cache: A node-local disk cache (``cache.dir``) and an in-memory cache.
        storage_options: See :func:`stoker.open_store`.

    Raises:
        ValueError: Not a token dataset, a setting out of range, fewer tokens than one
            sequence, or a dtype too narrow for the dataset's ids.
    """

    def __init__(
        self,
        source: SourceLike,
        *,
        seq_len: int,
        batch_size: int,
        seed: int | None = None,
        drop_last: bool = True,
        documents: bool = False,
        dtype: str = "int64",
        packing: PackingMode | None = "concat",
        pad_id: int | None = None,
        packing_window: int = DEFAULT_PACKING_WINDOW,
        order: OrderConfig | None = None,
        world: World | None = None,
        prefetch: int | Literal["auto"] = "auto",
        autotune: AutotuneConfig | None = None,
        cache: CacheConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokens_config = TokenConfig(
            seq_len=seq_len,
            documents=documents,
            dtype=dtype,
            packing=packing,
            pad_id=pad_id,
            packing_window=packing_window,
        )
        super().__init__(
            with_tokens(source, self.tokens_config),
            batch_size=batch_size,
            seed=seed,
            drop_last=token_drop_last(drop_last),
            order=order,
            world=world,
            prefetch=prefetch,
            autotune=autotune,
            cache=cache,
            storage_options=storage_options,
        )
        if token_parts(mix_parts(self.source)) is None:  # a prebuilt source of samples
            raise TypeError(f"{self.source.url}: a TokenLoader reads token datasets only")
        if self.world.rank == 0 and self.world.worker == 0:
            log_epoch(self)

    @property
    def seq_len(self) -> int:
        """Tokens per row of ``input_ids``."""
        return self.tokens_config.seq_len

    @property
    def stream_tokens(self) -> int:
        """Tokens an epoch could deliver: the whole stream, or in a mix each source's
        sequences in the epoch."""
        return stream_tokens(self.source, self.source.units(), self.tokens_config.span)

    @property
    def epoch_sequences(self) -> int:
        """Sequences all ranks deliver in a full epoch."""
        return epoch_sequences(
            self.source, world=self.world, batch_size=self.batch_size, drop_last=self.drop_last
        )

    @property
    def epoch_tokens(self) -> int:
        """Tokens (``seq_len + 1`` per sequence, padding included when packed) all ranks
        deliver in a full epoch."""
        return self.epoch_sequences * self.tokens_config.span

    @property
    def padding_tokens(self) -> int:
        """Padding in all the packed sequences of an epoch (0 unless packed)."""
        return sum(part.padding_tokens for part in token_parts(mix_parts(self.source)) or ())

    @property
    def dropped_sequences(self) -> int:
        """Sequences of the epoch no rank delivers: those that even out the ranks, and
        with ``drop_last`` each rank's last, incomplete batch."""
        return self.source.units() - self.epoch_sequences

    @property
    def dropped_tokens(self) -> int:
        """Tokens of :attr:`stream_tokens` no rank delivers in a full epoch: the stream's
        tail after the last whole sequence and :attr:`dropped_sequences` (packed, the
        sequences' padding counted with them)."""
        return self.stream_tokens + self.padding_tokens - self.epoch_tokens


def epoch_sequences(source: Source, *, world: World, batch_size: int, drop_last: DropLast) -> int:
    """Sequences of ``source`` all ranks of ``world`` deliver in a full epoch (ranks evened
    out by drops, never repeats: ``drop_last`` other than true is ``"ranks"``)."""
    drop: DropLast = True if drop_last is True else "ranks"
    size = world.world_size
    return size * rank_units(source.units(), world_size=size, batch_size=batch_size, drop_last=drop)


def token_drop_last(drop_last: bool) -> DropLast:
    """The Loader's ``drop_last`` for token sequences: ranks are evened out by dropping
    sequences, never by repeats; true also drops each rank's last, incomplete batch."""
    return True if check_bool("drop_last", drop_last) else "ranks"


#: The adapters' settings of token sequences (see :class:`~stoker.pipeline.config.AdapterOptions`).
_TOKEN_OPTIONS = ("seq_len", "documents", "dtype", "packing", "pad_id", "packing_window")


def loader_arguments(
    source: SourceLike, options: AdapterOptions
) -> tuple[SourceLike, LoaderOptions]:
    """What a Loader takes for a framework adapter's ``source`` and ``options``: with
    ``seq_len``, ``source`` read as token sequences and ``drop_last`` as
    :class:`TokenLoader` takes it (whole batches unless false); otherwise both as given.

    Raises:
        TypeError: ``documents`` or ``dtype`` without ``seq_len``.
    """
    rest = {k: v for k, v in options.items() if k not in _TOKEN_OPTIONS}
    loader_options: LoaderOptions = rest  # type: ignore[assignment]  # the token ones left out
    seq_len = options.get("seq_len")
    if seq_len is None:
        given = sorted(name for name in _TOKEN_OPTIONS[1:] if name in options)
        if given:
            raise TypeError(f"{', '.join(given)}: settings of token sequences: give seq_len")
        return source, loader_options
    packing = {name: options[name] for name in _TOKEN_OPTIONS[3:] if name in options}  # type: ignore[literal-required]
    tokens = TokenConfig(
        seq_len=seq_len,
        documents=options.get("documents", False),
        dtype=options.get("dtype", "int64"),
        **packing,
    )
    drop_last = loader_options.get("drop_last", True)
    if drop_last != "ranks":
        loader_options["drop_last"] = token_drop_last(drop_last)
    return with_tokens(source, tokens), loader_options


def with_tokens(source: SourceLike, tokens: TokenConfig) -> SourceLike:
    """``source`` read as token sequences (a prebuilt source as it is)."""
    if isinstance(source, SourceConfig):
        return replace(source, tokens=tokens)
    if isinstance(source, str | os.PathLike | ShardDataset | Sequence):
        return SourceConfig(source, tokens=tokens)
    return source


def log_epoch(loader: TokenLoader) -> None:
    """Log once what an epoch of ``loader`` delivers per rank and what it leaves out (a
    warning where no rank gets a batch)."""
    each = loader.epoch_sequences // loader.world.world_size
    full = loader.drop_last is True
    if not each:
        logger.warning(
            "%s: %d sequences of %d tokens over %d ranks give no rank a full batch of "
            "%d: an epoch delivers nothing; use a smaller batch_size or seq_len%s",
            loader.source.url,
            loader.source.units(),
            loader.tokens_config.span,
            loader.world.world_size,
            loader.batch_size,
            ", or drop_last=False for a short batch" if full else "",
        )
    short = each % loader.batch_size
    logger.info(
        "%s: %d sequences of %d tokens an epoch, %d batches of %d per rank%s; %d "
        "sequences and %d tokens (%.3g %%) left out (the stream's tail, evening out "
        "%d ranks%s)",
        loader.source.url,
        loader.source.units(),
        loader.tokens_config.span,
        -(-each // loader.batch_size),
        loader.batch_size,
        f", the last one of {short}" if short else "",
        loader.dropped_sequences,
        loader.dropped_tokens,
        100 * loader.dropped_tokens / max(loader.stream_tokens, 1),
        loader.world.world_size,
        ", and each rank's last, incomplete batch (drop_last=False delivers it)" if full else "",
    )
    if loader.tokens_config.packed:
        logger.info(
            "%s: documents packed best-fit into %d sequences of %d tokens, %d of them "
            "(%.3g %%) padding",
            loader.source.url,
            loader.source.units(),
            loader.tokens_config.span,
            loader.padding_tokens,
            100 * loader.padding_tokens / max(loader.source.units() * loader.tokens_config.span, 1),
        )
