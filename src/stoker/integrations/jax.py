"""JAX: batches as ``jax.Array``, laid out over the devices by a ``jax.sharding.Sharding``.

::

    loader = JaxLoader(url, batch_size=128, transform=RandomResizedCrop(224))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            state = train_step(state, batch["image"], batch["label"])

:class:`stoker.Loader` makes each batch in numpy (threads, ranged GETs, decode of the crop
only); this module only places it. In multi-process JAX each process is one loader rank
(``jax.process_index()`` of ``jax.process_count()``) and reads only its share; its
``batch_size`` samples become its devices' part of one global array of
``batch_size * process_count`` rows. By default the batch axis is split over every device
(a one-device run uses that device alone). The next batch is copied to the devices while
the current one is used.

Token sequences take the same loader, with :class:`stoker.TokenLoader`'s settings
(``JaxLoader(url, seq_len=2048, batch_size=8)``): the fields with one row per sequence
(the source's ``row_fields``: ``input_ids``, ``labels``, ``targets``, ``index``, ...) are
sharded like images, and token ids follow the 64-bit rule of every other ``int64`` field.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Unpack

import jax
import numpy as np

from stoker.integrations.delivering import Delivering
from stoker.pipeline.config import AdapterOptions
from stoker.pipeline.loader import Loader
from stoker.pipeline.sources import SourceLike
from stoker.pipeline.token_loader import loader_arguments
from stoker.pipeline.world import World


def detect_world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process: ``(jax.process_index(), jax.process_count())``."""
    return jax.process_index(), jax.process_count()


def batch_sharding(devices: Sequence[jax.Device] | None = None) -> jax.sharding.Sharding:
    """A sharding that splits the batch (leading) axis over ``devices``.

    Args:
        devices: Devices of the batch axis; by default all devices, of every process.
            They are ordered by process, so that each process's rows are contiguous.

    Returns:
        A ``SingleDeviceSharding`` for one device, else a ``NamedSharding`` over a 1-D
        mesh with axis ``"batch"``.
    """
    chosen = list(devices) if devices is not None else jax.devices()
    if not chosen:
        raise ValueError("no devices to place batches on")
    if len(chosen) == 1:
        return jax.sharding.SingleDeviceSharding(chosen[0])
    ordered = sorted(chosen, key=lambda d: (d.process_index, d.id))
    mesh = jax.sharding.Mesh(np.array(ordered), ("batch",))
    # jax leaves PartitionSpec.__init__ unannotated.
    spec = jax.sharding.PartitionSpec("batch")  # type: ignore[no-untyped-call]
    return jax.sharding.NamedSharding(mesh, spec)


def to_arrays(
    batch: Mapping[str, Any],
    sharding: jax.sharding.Sharding,
    row_fields: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The numpy arrays of a batch as global ``jax.Array`` s laid out by ``sharding``.

    Each numeric array (of ``row_fields``, where given: the fields with one row per unit)
    is this process's rows of the global array (see
    ``jax.make_array_from_process_local_data``); everything else stays on the host as it
    is: keys, text, parsed JSON, ragged arrays (lists), arrays of strings or dates,
    numbers JAX has no type for (``longdouble``), and arrays outside ``row_fields``.
    Big-endian arrays (an ``npy`` saved as ``>f4``) are put in native order. Without
    ``jax_enable_x64`` JAX keeps 64-bit numbers in 32 bits: ``int64`` becomes ``int32``,
    ``float64`` ``float32``, as in any JAX program; a value that would change beyond that
    rounding is an error.

    Raises:
        ValueError: Images that are not one array (give a fixed-size transform), or a
            field whose 64-bit values do not fit 32 bits while ``jax_enable_x64`` is off
            (integers out of range, finite floats beyond ``float32``); it names the field.
    """
    image = batch.get("image")
    if image is not None and not isinstance(image, np.ndarray):
        raise ValueError(
            "images of one batch must form one array to become a jax.Array; use a "
            "transform with a fixed output size, such as RandomResizedCrop(224)"
        )
    # jax leaves make_array_from_process_local_data unannotated.
    place: Any = jax.make_array_from_process_local_data
    placed = {}
    for name, value in batch.items():
        rows = isinstance(value, np.ndarray) and (row_fields is None or name in row_fields)
        array = _as_jax_stores(name, value) if rows else None
        placed[name] = value if array is None else place(sharding, array)
    return placed


def _as_jax_stores(name: str, value: np.ndarray) -> np.ndarray | None:
    """``value`` in the dtype JAX gives it (native order, 32 bits without x64), or None
    for an array JAX has no type for."""
    dtype = value.dtype
    if dtype.kind not in "biufc" or dtype.itemsize > (16 if dtype.kind == "c" else 8):
        return None
    if not dtype.isnative:
        dtype = dtype.newbyteorder("=")
        value = value.astype(dtype)
    stored = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if stored == dtype or value.size == 0:
        return value
    if dtype.kind in "iu":
        info = np.iinfo(stored)
        low, high = value.min(), value.max()
        if low < info.min or high > info.max:
            raise ValueError(
                f"field {name!r}: {dtype} values from {low} to {high} do not fit {stored}, "
                "which JAX keeps them in while jax_enable_x64 is off; turn it on "
                f"(jax.config.update('jax_enable_x64', True)) or cast the field "
                f"(FieldsConfig(transforms={{{name!r}: ...}}))"
            )
        return value.astype(stored)
    with np.errstate(over="ignore"):
        narrowed = value.astype(stored)
    if not np.array_equal(np.isfinite(narrowed), np.isfinite(value)):
        raise ValueError(
            f"field {name!r}: {dtype} values beyond the range of {stored}, which JAX keeps "
            "them in while jax_enable_x64 is off; turn it on "
            f"(jax.config.update('jax_enable_x64', True)) or scale the field "
            f"(FieldsConfig(transforms={{{name!r}: ...}}))"
        )
    return narrowed


class JaxLoader(Delivering):
    """Batches of ``jax.Array`` s for a JAX training loop.

    Batches are dicts like :class:`stoker.Loader`'s: ``image`` (``uint8`` ``(N, H, W, 3)``),
    ``label`` and ``index`` (``int32`` unless ``jax_enable_x64`` is on), ``key`` (a
    list of this process's keys), and every other field of the samples: numeric arrays as
    ``jax.Array`` s sharded like the images (64-bit ones in 32 bits unless
    ``jax_enable_x64`` is on, and an error naming the field if a value does not fit), the
    rest (text, JSON, ragged arrays) on the host, as :func:`to_arrays` says. ``state_dict``
    counts the batches delivered, not the one already on its way to the devices.

    With ``seq_len`` the batches are token sequences' (:class:`stoker.TokenLoader`'s):
    ``input_ids``, ``labels``, ``targets``, ``index`` (``source`` in a mix,
    ``position_ids`` with ``documents=True``) are sharded, ``int64`` kept in 64 bits with
    ``jax_enable_x64`` and in 32 without, as every field is; ``cu_seqlens``, ``doc_lens``
    and ``max_seqlen`` (sized by the documents) stay on the host.

    Args:
        source: What :class:`stoker.Loader` takes (a dataset URL or path, an opened
            :class:`~stoker.format.reader.ShardDataset`, a
            :class:`~stoker.pipeline.config.SourceConfig`); with ``seq_len``, what
            :class:`stoker.TokenLoader` takes.
        batch_size: Samples (or sequences) per batch of this process; every local device
            of the batch axis gets an equal part, so it must divide evenly.
        sharding: Where batches go; default :func:`batch_sharding` over all devices. It is
            applied to every array of a batch, so name only the leading axis in it.
        **options: :class:`stoker.Loader`'s settings (``transform``, ``seed``, ``order``,
            ``decode``, ``cache``, ``storage_options``, ...), and
            :class:`stoker.TokenLoader`'s ``seq_len``, ``documents`` and ``dtype`` to read
            token sequences. ``world`` defaults to the rank of :func:`detect_world`; give
            one when processes share data (replicas). ``drop_last`` defaults to True here,
            as shapes that change make ``jit`` compile again.

    Attributes:
        loader: The :class:`stoker.Loader` making the batches (``loader.stats()``, ...).
        sharding: Where batches go.
    """

    def __init__(
        self,
        source: SourceLike,
        *,
        batch_size: int,
        sharding: jax.sharding.Sharding | None = None,
        **options: Unpack[AdapterOptions],
    ) -> None:
        # Shapes that change make jit compile again: drop the last incomplete batch.
        options.setdefault("drop_last", True)
        source, loader_options = loader_arguments(source, options)
        if loader_options.get("world") is None:
            rank, world_size = detect_world()
            loader_options["world"] = World(rank=rank, world_size=world_size)
        self.sharding = sharding if sharding is not None else batch_sharding()
        self.loader = Loader(source, batch_size=batch_size, **loader_options)
        self.row_fields = self.loader.source.row_fields

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Placing is asynchronous: each copy runs while the caller uses the last batch.
        return self._delivered(
            lambda batch: to_arrays(batch, self.sharding, self.row_fields), ahead=True
        )
