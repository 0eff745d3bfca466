"""Ray Data: a ``ray.data.Dataset`` whose read tasks are stoker's read groups.

::

    ds = read_dataset(url, seed=0, epoch=3, transform=RandomResizedCrop(224))
    for batch in ds.iter_torch_batches(batch_size=256, collate_fn=TorchCollateFn()):
        ...  # batch["image"]: (256, 224, 224, 3) uint8 tensor; batch["key"]: list of str

The epoch's order is stoker's (:func:`~stoker.pipeline.plan.resolve_order` and
:func:`~stoker.pipeline.order.epoch_order` for ``(seed, epoch)``, as a
:class:`stoker.Loader` of one rank orders it), cut into its read groups. A Ray read task
reads ``groups_per_task`` consecutive groups (2 by default): the ranged GETs of their
blocks (one per block, adjacent samples joined) all go out at once, every sample is
checked against its CRC-32 by stoker's own reader, and each group becomes one block, the
later ones arriving while the first is decoded. Decoding and the
transform run in the ``map_batches`` tasks that follow, on any node of the cluster, with
the Loader's decode stage (:class:`~stoker.pipeline.batching.BatchAssembler`): every field
of a record comes as the Loader gives it, the same crop for a sample in a given epoch
wherever it is decoded. A read task reserves a CPU (``read_num_cpus``), as the decoding
does, so Ray runs the reads and their decoding as one task on one worker: no bytes
cross the object store before they are decoded, and a cluster keeps one worker process
per CPU. ``read_num_cpus=0.25`` makes reads tasks of their own, four per CPU, whose
network waits overlap the decoding of other groups, at the cost of more worker processes
(each importing Ray Data and stoker when it starts).

The dataset delivers every sample of the epoch once, in the epoch's order when consumed
in one stream (``preserve_order`` is set on its context). For Ray Train, pass it in
``datasets=`` and read ``ray.train.get_dataset_shard(name)`` in each worker: Ray splits
the stream over the workers, each sample to one of them. Iterating a dataset again
repeats its order and its crops: make the next epoch with ``epoch=epoch + 1``, or make
one dataset of ``epochs`` consecutive epochs (each row says its ``epoch``), which a
Ray Train worker iterates once.

Each Ray worker process opens the dataset once (its ``index.json`` and ``index.bin``)
and keeps it for the tasks it runs after; it refuses a dataset whose shards are not those
the driver planned from (rewritten in between).

A Parquet table read in place (``read_dataset(SourceConfig(url, columns=[...]))``) is read
the same way, its row groups the blocks; its rows come in the epoch's order of read groups,
without the Loader's window that mixes several read groups (a table not written in random
order is mixed by Ray's ``iter_batches(local_shuffle_buffer_size=...)``).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from stoker.core.metrics import Stages
from stoker.integrations.ray_tasks import (
    NEEDS_RAY,
    GroupRead,
    Where,
    decode_block,
    fingerprint,
)
from stoker.integrations.ray_tasks import batch_table as batch_table  # public here too
from stoker.pipeline.batcher import BatcherSettings
from stoker.pipeline.batching import BatchAssembler
from stoker.pipeline.config import SAMPLE_PAGE_BYTES, DecodeConfig, SourceConfig, config_or_default
from stoker.pipeline.order import EpochOrder, OrderConfig
from stoker.pipeline.plan import resolve_order
from stoker.pipeline.source import Source
from stoker.pipeline.sources import open_source

try:
    import ray
    import ray.data
    from ray.data.block import BlockMetadata
    from ray.data.collate_fn import NumpyBatchCollateFn
    from ray.data.datasource import Datasource, ReadTask
except ImportError as exc:  # pragma: no cover - the extra names itself
    raise ImportError(NEEDS_RAY) from exc


logger = logging.getLogger(__name__)

#: CPUs a read task reserves by default: as many as the decoding, so that Ray fuses the two
#: into one task. A quarter of a CPU made 0.81x and 0.48x the images/s in two smoke runs of
#: benchmarks/ray_read.py (2 cores, 20 ms proxy): Ray starts, and stops when idle, the
#: extra workers that reads of their own need, and hands every group through its object
#: store.
READ_NUM_CPUS = 1.0
#: Read groups a read task fetches by default (see ``read_dataset``'s ``groups_per_task``).
GROUPS_PER_TASK = 2


def read_dataset(
    source: str | os.PathLike[str] | SourceConfig,
    *,
    seed: int = 0,
    epoch: int = 0,
    epochs: int = 1,
    transform: Any = None,
    batch_size: int | None = None,
    order: OrderConfig | None = None,
    decode: DecodeConfig | None = None,
    storage_options: Mapping[str, Any] | None = None,
    read_num_cpus: float = READ_NUM_CPUS,
    groups_per_task: int = GROUPS_PER_TASK,
) -> Any:
    """One epoch of a packed dataset or a Parquet table read in place (or several epochs)
    as a ``ray.data.Dataset``, a row a sample.

    Rows hold ``key`` (str), ``label``, ``index`` (the sample's number in the dataset),
    ``epoch``, ``image`` where the samples have one (through ``transform``), and every
    other field of the record decoded as the Loader decodes it (``txt`` a str, ``json`` its
    object, ``npy`` an array, ...; ``decode.fields`` chooses and renames).

    Args:
        source: URL or local path of a packed dataset, or of a Parquet file or folder read
            in place (``SourceConfig(url, columns=[...])`` to read some of its columns; see
            :mod:`stoker.pipeline.parquet_source`), or ``SourceConfig(url, video=...)``
            (a row a clip). Unpacked folders, mixes, windows and tokens are refused.
        seed: Seed of the order and of the augmentations.
        epoch: The epoch whose order (and crops) the dataset delivers.
        epochs: Epochs the dataset holds, from ``epoch`` on, one after the other.
        transform: As :class:`stoker.Loader`'s: a built-in transform (images come out
            ``(H, W, 3)`` uint8 of its size), a callable taking a ``PIL.Image``, or None
            (full-size images).
        batch_size: Samples each decoding call takes; None: one read group (a block of the
            read tasks).
        order: Shuffle settings; unset ones are derived from the data as the Loader does.
        decode: Which fields, the decompression-bomb guard and ``on_error`` (its
            ``threads`` and ``method`` are Ray's business here: one thread per task).
        storage_options: See :func:`stoker.open_store`; they travel to the workers with the
            tasks, so credentials given here reach them.
        read_num_cpus: CPUs each read task reserves.
        groups_per_task: Consecutive read groups a read task fetches: their GETs go out
            together, so the later ones arrive while the first is decoded.

    Returns:
        A ``ray.data.Dataset`` of each epoch's samples, each once, in its order.

    Raises:
        FileNotFoundError: No packed dataset or Parquet at ``source``.
        TypeError, ValueError: A setting out of range, as the Loader raises them.
    """
    _check_arguments(batch_size, epochs, groups_per_task, read_num_cpus)
    decode = config_or_default("decode", decode, DecodeConfig)
    options = dict(storage_options or {})
    config = source if isinstance(source, SourceConfig) else SourceConfig(source)
    opened = _open(config, options)
    epochs_held = range(epoch, epoch + epochs)
    settings, orders = _plan(opened, order, seed, epochs_held, transform, decode)
    where = Where(opened.url, options, fingerprint(opened), _columns(config), config.video)
    datasource = StokerDatasource(opened, where, orders, groups_per_task=groups_per_task)
    groups = sum(order.groups for order in orders.values())
    # As many blocks as read tasks: Ray otherwise splits each task's output to reach its own
    # count (about 200), and decodes the pieces in tasks of a few samples each.
    ds = ray.data.read_datasource(
        datasource, num_cpus=read_num_cpus, override_num_blocks=-(-groups // groups_per_task)
    )
    ds = ds.map_batches(
        decode_block,
        batch_size=batch_size,
        batch_format="pyarrow",
        zero_copy_batch=True,
        fn_kwargs={
            "where": datasource.where,
            "transform": transform,
            "seed": settings.seed_value,
            "decode": decode,
        },
    )
    ds.context.execution_options.preserve_order = True
    return ds


def _check_arguments(
    batch_size: int | None, epochs: int, groups_per_task: int, read_num_cpus: float
) -> None:
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"batch_size must be None or >= 1, got {batch_size!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    if isinstance(groups_per_task, bool) or not isinstance(groups_per_task, int):
        raise TypeError(f"groups_per_task must be an int, got {groups_per_task!r}")
    if groups_per_task < 1:
        raise ValueError(f"groups_per_task must be >= 1, got {groups_per_task}")
    if read_num_cpus <= 0:
        raise ValueError(f"read_num_cpus must be > 0, got {read_num_cpus}")


def _open(config: SourceConfig, options: dict[str, Any]) -> Source:
    """The one packed dataset or Parquet table that ``config`` names, opened.

    Raises:
        ValueError: It names a mix, windows, side tables, token sequences or an unpacked
            image folder.
    """
    if config.mix is not None or config.window is not None or config.side_tables:
        raise ValueError("read_dataset reads one dataset: no mix, windows or side tables")
    if config.tokens is not None:
        raise ValueError("read_dataset reads samples; token sequences are TokenLoader's")
    opened = open_source(config, storage_options=options, cache=None, page_bytes=SAMPLE_PAGE_BYTES)
    if opened.one_get_per_unit or opened.row_fields is not None:
        raise ValueError(
            f"{opened.url}: an unpacked folder or a token dataset; read_dataset reads a packed "
            "dataset or a Parquet table: pack it first (`stoker pack`)"
        )
    return opened


def _columns(config: SourceConfig) -> tuple[str, ...] | None:
    return None if config.columns is None else tuple(config.columns)


def _plan(
    opened: Source,
    order: OrderConfig | None,
    seed: int,
    epochs: range,
    transform: Any,
    decode: DecodeConfig,
) -> tuple[OrderConfig, dict[int, EpochOrder]]:
    """The order settings, resolved as the Loader resolves them, and each epoch's order;
    ``transform`` is checked against the records on the way."""
    order = opened.order_defaults(
        order or OrderConfig(), units=opened.units(), unit_bytes=opened.unit_bytes()
    )
    settings = resolve_order(
        order,
        seed=seed,
        units=opened.units(),
        unit_bytes=opened.unit_bytes(),
        shuffled=opened.shuffled(),
    )
    # Checked here, on the driver, so a transform for records without images fails now.
    BatchAssembler.for_source(
        opened,
        BatcherSettings(
            transform=transform, seed=settings.seed_value, decode=decode, stages=Stages(), threads=1
        ),
    ).close()
    orders = {e: opened.epoch_order(settings, e) for e in epochs}
    return settings, orders


class StokerDatasource(Datasource):
    """The read groups of epochs of a source (a packed dataset, a Parquet table),
    ``groups_per_task`` to a Ray read task.

    A task's block holds each sample's ``index``, ``epoch``, ``key``, ``label``, its
    members' raw bytes (columns ``member:<ext>``, null where a sample lacks one) and
    ``error`` (what a sample that failed its CRC-32 or whose members are malformed failed
    with, else null); :func:`read_dataset` decodes it.

    Args:
        source: The opened source (the driver's; workers open their own at ``where``).
        where: Where the workers find it.
        orders: Each epoch's order, by epoch number, in the order delivered.
        groups_per_task: Consecutive read groups a task reads.
    """

    def __init__(
        self,
        source: Source,
        where: Where,
        orders: Mapping[int, EpochOrder],
        *,
        groups_per_task: int = 1,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Ray's is untyped
        self.where = where
        self._source = source
        self._orders = dict(orders)
        self._groups_per_task = groups_per_task
        counts = source.datasets[0].member_counts()
        self._members = tuple(sorted(counts)) if counts else ()

    def get_name(self) -> str:
        """Ray's name for the read operator."""
        return "StokerReadGroups"

    def estimate_inmemory_data_size(self) -> int:
        """Bytes of the epochs' samples in their shards."""
        return sum(self._source.nbytes(o.samples.tolist()) for o in self._orders.values())

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[Any]:
        """Tasks of ``groups_per_task`` consecutive read groups each, in the epochs' order
        (``parallelism`` is not used: the groups are the unit of reading)."""
        groups = [
            (epoch, order.samples[begin:end])
            for epoch, order in self._orders.items()
            for begin, end in itertools.pairwise(order.group_starts.tolist())
        ]
        tasks = []
        for first in range(0, len(groups), self._groups_per_task):
            part = groups[first : first + self._groups_per_task]
            ids = np.concatenate([g for _, g in part])
            metadata = BlockMetadata(
                num_rows=len(ids),
                size_bytes=self._source.nbytes(ids.tolist()),
                input_files=None,
                exec_stats=None,
            )
            read = GroupRead(self.where, part, self._members)
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks


class TorchCollateFn(NumpyBatchCollateFn):
    """``collate_fn`` for ``iter_torch_batches``: batches as :class:`TorchLoader` gives them::

        ds.iter_torch_batches(batch_size=256, collate_fn=TorchCollateFn())

    Arrays of numbers become tensors; a column of arrays of different shapes a list of
    tensors; text, bytes and objects (parsed JSON) lists of their values; arrays torch has
    no dtype for (strings in an ``npy``) stay arrays. Ray's own conversion makes tensors
    only, and stops at the first string column (``key``).
    """

    def __call__(self, batch: Mapping[str, np.ndarray]) -> Any:
        """The batch with its numbers as tensors and the rest as lists."""
        from stoker.integrations.torch_tensors import to_tensors

        out: dict[str, Any] = {}
        for name, value in batch.items():
            if isinstance(value, np.ndarray) and value.dtype == object:
                out[name] = list(value)
            elif isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "US":
                out[name] = value.tolist()
            else:
                out[name] = value
        return to_tensors(out)
