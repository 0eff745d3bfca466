"""A mix of sources in one epoch (:class:`MixedSource`): several packed datasets, Parquet
tables read in place, or token sources, in the proportions of a
:class:`~stoker.pipeline.mixing.MixConfig` (or along its schedule), each unit tagged with
its ``source``; :mod:`.mix_epochs` says which order each epoch takes and what a Loader's
state holds of the mix."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.mix_epochs import MixEpochs, Resumed
from stoker.pipeline.mix_resume import Member
from stoker.pipeline.mixing import MixConfig, MixedOrder, mixed_epoch_order, source_counts
from stoker.pipeline.order import EpochOrder, OrderConfig
from stoker.pipeline.source import Source, SourceDataset


class MixPart(Source, Protocol):
    """A source a mix can take: its units in shards (blocks never cross them), and the
    batcher of a mix of it and others of its kind."""

    @property
    def shard_sizes(self) -> list[int]:
        """Units in each shard (a Parquet table's row groups)."""
        ...

    def mix_batcher(
        self, mix: Source, parts: Sequence[object], settings: BatcherSettings
    ) -> Batcher:
        """The batcher of ``mix``, a mix of this source and ``parts``."""
        ...


class MixedSource:
    """Several dataset (or token) sources in one epoch, in the proportions of ``mix``.

    Unit ids are mixed ids (see :mod:`stoker.pipeline.mixing`); each unit carries the
    ``source`` it came from. Every source uses the loader's order settings with its own
    block size (its blocks hold about as many bytes as the loader aims for). Token sources
    of one ``seq_len`` have units of equal tokens, so proportions of units are proportions
    of tokens. A mix with stages plans its epochs for a world size and batch size
    (:func:`bind_mix`).

    Args:
        sources: The sources, in the order of ``mix``'s weights or counts.
        mix: How much of each source an epoch holds.
        block_sizes: Each source's samples per block.
    """

    def __init__(
        self,
        sources: Sequence[MixPart],
        mix: MixConfig,
        block_sizes: Sequence[int],
    ) -> None:
        if mix.sources != len(sources):
            raise ValueError(f"mix is for {mix.sources} sources, but {len(sources)} were given")
        if len({s.row_fields is None for s in sources}) > 1:  # token rows, or samples
            raise ValueError("a mix's sources must have units of one kind (samples or tokens)")
        self.sources: list[MixPart] = list(sources)
        self.mix = mix
        self.block_sizes = list(block_sizes)
        sizes = [s.units() for s in self.sources]
        self._offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self._last: tuple[tuple[OrderConfig, int], MixedOrder] | None = None
        members = [
            Member(s.url, n, tuple(s.shard_sizes), b)
            for s, n, b in zip(self.sources, sizes, self.block_sizes, strict=True)
        ]
        unit_bytes = [s.unit_bytes() for s in self.sources]
        self.epochs = MixEpochs(members, unit_bytes, mix, self._static_order)

    @property
    def url(self) -> str:
        return " + ".join(s.url for s in self.sources)

    @property
    def datasets(self) -> list[SourceDataset]:
        return [d for s in self.sources for d in s.datasets]

    @property
    def extra_fields(self) -> tuple[str, ...]:
        names = [set(s.extra_fields) for s in self.sources]
        common = set.intersection(*names) if names else set()
        return ("source", *sorted(common))

    def mixed_order(self, config: OrderConfig, epoch: int) -> MixedOrder:
        """The mixed epoch with each source's share (see :class:`MixedOrder`)."""
        if self._last is not None and self._last[0] == (config, epoch):
            return self._last[1]
        mixed = self.epochs.mixed_order(config, epoch)
        self._last = ((config, epoch), mixed)
        return mixed

    def _static_order(self, config: OrderConfig, epoch: int) -> MixedOrder:
        """Epoch ``epoch`` of the mix as a mix without stages draws it."""
        orders = [replace(config, block_size=b) for b in self.block_sizes]
        return mixed_epoch_order(
            [s.shard_sizes for s in self.sources], orders=orders, mix=self.mix, epoch=epoch
        )

    def bind(self, world_size: int, batch_size: int) -> None:
        """Plan epochs for ``world_size`` ranks of ``batch_size`` (see :func:`bind_mix`)."""
        self._last = None
        self.epochs.bind(world_size, batch_size)

    def resume(self, state: Mapping[str, Any], config: OrderConfig) -> Resumed | None:
        """Take up a state's ``"mix"`` entry (see :meth:`MixEpochs.resume`)."""
        self._last = None
        return self.epochs.resume(state, config)

    @property
    def cut_first_batch(self) -> bool:
        return self.sources[0].cut_first_batch

    @property
    def row_fields(self) -> tuple[str, ...] | None:
        fields = self.sources[0].row_fields
        return None if fields is None else (*fields, "source")

    one_get_per_unit = False

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        return self.sources[0].order_defaults(order, units=units, unit_bytes=unit_bytes)

    def make_batcher(self, settings: BatcherSettings) -> Batcher:
        return self.sources[0].mix_batcher(self, self.sources, settings)

    def shard_of(self, unit: int) -> str | None:
        which, local = self._locate([unit])
        return self.sources[int(which[0])].shard_of(int(local[0]))

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        return self.mixed_order(config, epoch).order

    def units(self) -> int:
        return sum(source_counts([s.units() for s in self.sources], self.mix))

    def shuffled(self) -> bool:
        return all(s.shuffled() for s in self.sources)

    def _locate(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        offsets = self._offsets
        values = np.asarray(ids, dtype=np.int64) % max(int(offsets[-1]), 1)
        which = np.searchsorted(offsets[1:], values, side="right").astype(np.int64)
        return which, values - offsets[which]

    def unit_bytes(self) -> float:
        weights = np.asarray([s.units() for s in self.sources], dtype=np.float64)
        sizes = np.asarray([s.unit_bytes() for s in self.sources])
        return float((weights * sizes).sum() / max(weights.sum(), 1.0))

    def nbytes(self, ids: Sequence[int]) -> int:
        which, local = self._locate(ids)
        return sum(
            self.sources[k].nbytes(local[which == k].tolist()) for k in range(len(self.sources))
        )

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        which, local = self._locate(ids)
        parts = await asyncio.gather(
            *(s.read_async(local[which == k].tolist()) for k, s in enumerate(self.sources))
        )
        cursors = [iter(part) for part in parts]
        out = []
        for k in which.tolist():
            unit = dict(next(cursors[k]))  # a repeat must not share its dict with the first
            unit["source"] = k
            out.append(unit)
        return out


def mixed_order(source: Source, config: OrderConfig, epoch: int) -> MixedOrder:
    """The mixed epoch of ``source`` (see :class:`MixedOrder`).

    Raises:
        ValueError: ``source`` is no mix.
    """
    if not isinstance(source, MixedSource):
        raise ValueError("mix_shares() needs a loader over several datasets with mix=")
    return source.mixed_order(config, epoch)


def bind_mix(source: Source, world_size: int, batch_size: int) -> None:
    """Have a mix (with stages, or resumed from one) plan its epochs for ``world_size``
    ranks of ``batch_size`` batches; any other source is left as it is."""
    if isinstance(source, MixedSource):
        source.bind(world_size, batch_size)


def mix_state(
    source: Source, config: OrderConfig, epoch: int, batches: int, segments: Sequence[object]
) -> dict[str, Any]:
    """``{"mix": entry}`` for a Loader's state at batch ``batches`` of epoch ``epoch`` (after
    ``segments`` run on earlier world sizes), or ``{}`` (no mix, or nothing to say). See
    :mod:`stoker.pipeline.mix_resume`."""
    if not isinstance(source, MixedSource):
        return {}
    entry = source.epochs.state_entry(config, epoch, batches, bool(segments))
    return {} if entry is None else {"mix": entry}


def resume_mix(source: Source, state: Mapping[str, Any], config: OrderConfig) -> Resumed | None:
    """What a state's ``"mix"`` entry does to the Loader's epoch (see :class:`Resumed`), or
    None where it does nothing.

    Raises:
        TypeError, ValueError: An entry that cannot be honoured, naming the source; an entry
            for a loader that mixes nothing.
    """
    if not isinstance(source, MixedSource):
        if state.get("mix") is not None:
            raise ValueError(
                "the state is a mix's (it has a 'mix' entry), but this loader mixes nothing"
            )
        return None
    return source.resume(state, config)


def mix_parts(source: Source) -> list[Source]:
    """The sources ``source`` mixes, or ``[source]`` for one that mixes none."""
    return list(source.sources) if isinstance(source, MixedSource) else [source]
