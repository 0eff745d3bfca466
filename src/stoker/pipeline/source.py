"""The Source seam: what the Loader asks of what it reads, whatever its units are.

A source says what its units are (samples, windows, mixed samples, token sequences,
objects of an unpacked folder): how an epoch orders them and which settings its order
sizes itself, how its first fetch is cut, which batcher assembles them, and how they are
read. The Loader asks; it never tests a source's class. The sources are in
:mod:`stoker.pipeline.sources`, :mod:`stoker.pipeline.tokens` and
:mod:`stoker.pipeline.folder`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from stoker.format.spec import IMAGE_FIELD_NAMES
from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.order import EpochOrder, OrderConfig
from stoker.storage.base import Store


class SourceDataset(Protocol):
    """What the Loader and its tools use of a dataset a source reads: a packed
    :class:`~stoker.format.reader.ShardDataset` or an unpacked folder's
    :class:`~stoker.pipeline.folder.FolderDataset`."""

    @property
    def url(self) -> str:
        """Where it is."""
        ...

    @property
    def store(self) -> Store:
        """Its store: counters, I/O engine and disk cache."""
        ...

    @property
    def class_names(self) -> list[str]:
        """Names of the labels, indexed by label."""
        ...

    def __len__(self) -> int: ...

    def member_counts(self) -> dict[str, int] | None:
        """Member names (``jpg``, ``txt``, ``cls``, ...) with the samples holding each;
        None where it does not say (an unpacked image folder: images only)."""
        ...

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Samples by number, in the order given."""
        ...


class Source(Protocol):
    """The loader's view of what it reads (see the module docstring)."""

    @property
    def url(self) -> str:
        """Where the data is, for messages."""
        ...

    @property
    def datasets(self) -> Sequence[SourceDataset]:
        """The datasets read (packed, or an unpacked folder)."""
        ...

    @property
    def extra_fields(self) -> tuple[str, ...]:
        """Names of the arrays each unit carries besides its image (stacked per batch)."""
        ...

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        """The order of one epoch over unit ids."""
        ...

    def units(self) -> int:
        """Units in one epoch."""
        ...

    def unit_bytes(self) -> float:
        """Mean bytes read per unit."""
        ...

    def shuffled(self) -> bool:
        """Whether the units were written in random order (consecutive ones are unrelated)."""
        ...

    def nbytes(self, ids: Sequence[int]) -> int:
        """Bytes of these units in their shards."""
        ...

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        """The units, in the order given (ids may repeat)."""
        ...

    @property
    def cut_first_batch(self) -> bool:
        """Whether an epoch's first batch is fetched on its own, ahead of the rest of its
        read groups (:func:`~stoker.pipeline.tokens.first_batch_apart`): where a unit is
        far smaller than a read group, so the first batch need not wait for a group."""
        ...

    @property
    def row_fields(self) -> tuple[str, ...] | None:
        """The batch fields with one row per unit, which an adapter may split by rows over
        devices (token batches' ``input_ids``, ``labels``, ...; not ``cu_seqlens``, sized
        by the documents); None where every array of a batch has one (samples, windows)."""
        ...

    @property
    def one_get_per_unit(self) -> bool:
        """Whether each unit is an object of its own, read with one GET (an unpacked
        folder): blocks of one, no ranged reads to make bigger."""
        ...

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        """``order`` with the settings this kind of unit sizes itself filled in, for an epoch
        of ``units`` units of ``unit_bytes``; the Loader's
        :func:`~stoker.pipeline.plan.resolve_order` fills in the rest."""
        ...

    def make_batcher(self, settings: BatcherSettings) -> Batcher:
        """The batcher of these units (decoding samples, casting sequences, ...).

        Raises:
            ValueError: A setting these units cannot take (a transform without images).
        """
        ...

    def shard_of(self, unit: int) -> str | None:
        """The shard unit ``unit`` was read from; None where the unit is an object of its
        own (its key names it) or the source does not say."""
        ...


def stores_images(source: Source) -> bool:
    """Whether the samples of ``source`` have an image: its index counts an image member,
    or does not count its members (an unpacked image folder, an older index)."""
    counts = field_counts(source)
    return counts is None or any(name in counts for name in IMAGE_FIELD_NAMES)


def field_counts(source: Source) -> dict[str, int] | None:
    """Member extensions of the source's datasets with their counts; None where a dataset
    does not say (an unpacked image folder, an index without counts)."""
    counts: dict[str, int] = {}
    for dataset in source.datasets:
        found = dataset.member_counts()
        if found is None:
            return None
        for name, count in found.items():
            counts[name] = counts.get(name, 0) + count
    return counts
