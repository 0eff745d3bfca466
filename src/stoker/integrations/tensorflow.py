"""TensorFlow and Keras: a ``tf.data.Dataset`` of batches made by stoker's loader.

::

    train = make_dataset(url, batch_size=64, transform=RandomResizedCrop(224))
    val = make_dataset(val_url, batch_size=64, transform=CenterCrop(224),
                       order=OrderConfig(mode="none"))
    model.fit(train, epochs=10, validation_data=val)

The batches come from :class:`stoker.Loader` (ranged GETs, prefetch, a decode thread pool
that decodes only the crop) running in the Python generator behind
``tf.data.Dataset.from_generator``; TensorFlow receives finished ``uint8`` arrays and does
no loading of its own. Each pass over the dataset is the next epoch, with its own order:
every Keras epoch (or every round of ``.repeat()``) reshuffles. The dataset knows its
length, so ``len(dataset)`` is the number of steps per epoch (the same on every worker).

With ``tf.distribute``, build the dataset in the function given to
``strategy.distribute_datasets_from_function`` and pass its ``input_context``: each input
pipeline (one per worker) then reads only its share.

A ``tf.data.Dataset`` has no ``stats()``: the loaders behind it are made inside TensorFlow's
generator, one per pass. To see stage times, requests and a trace, run ``stoker doctor`` on
the dataset, or a :class:`stoker.Loader` with the same settings and its ``stats()``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Unpack

import numpy as np
import tensorflow as tf

from stoker.format.reader import ShardDataset, open_dataset
from stoker.pipeline.config import LoaderOptions
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import PlannedTransform
from stoker.pipeline.world import World

#: The fields a batch element can hold, in the order asked for.
FIELDS = ("image", "label", "index", "key")


def detect_world(input_context: Any = None) -> tuple[int, int]:
    """``(rank, world_size)`` for the loader from a ``tf.distribute.InputContext``.

    Args:
        input_context: The context ``distribute_datasets_from_function`` passes to its
            function, or None.

    Returns:
        ``(input_pipeline_id, num_input_pipelines)``, or ``(0, 1)`` without a context.
    """
    if input_context is None:
        return 0, 1
    return int(input_context.input_pipeline_id), int(input_context.num_input_pipelines)


def output_signature(transform: Any, fields: Sequence[str] = ("image", "label")) -> tuple[Any, ...]:
    """The ``tf.TensorSpec`` of each field of a batch element.

    Images are ``uint8`` ``(None, H, W, 3)`` when ``transform`` has a fixed output size,
    ``(None, None, None, 3)`` otherwise; labels and indices are ``int64`` ``(None,)``;
    keys are ``tf.string`` ``(None,)``.

    Args:
        transform: The loader's transform.
        fields: Names from ``image``, ``label``, ``index``, ``key``.

    Raises:
        ValueError: An unknown or repeated field.
    """
    unknown = [f for f in fields if f not in FIELDS]
    if unknown or not fields or len(set(fields)) != len(fields):
        raise ValueError(f"fields must be distinct names from {list(FIELDS)}, got {list(fields)}")
    size = transform.output_size if isinstance(transform, PlannedTransform) else None
    height, width = size if size is not None else (None, None)
    specs = {
        "image": tf.TensorSpec((None, height, width, 3), tf.uint8, name="image"),
        "label": tf.TensorSpec((None,), tf.int64, name="label"),
        "index": tf.TensorSpec((None,), tf.int64, name="index"),
        "key": tf.TensorSpec((None,), tf.string, name="key"),
    }
    return tuple(specs[f] for f in fields)


def make_dataset(
    source: str | os.PathLike[str] | ShardDataset,
    *,
    batch_size: int,
    fields: Sequence[str] = ("image", "label"),
    input_context: Any = None,
    epoch: int = 0,
    **options: Unpack[LoaderOptions],
) -> Any:
    """A ``tf.data.Dataset`` of batches, for ``model.fit`` or a custom loop.

    Each element is a tuple of ``fields``: by default ``(image, label)``, the ``(x, y)``
    that Keras expects; images stay ``uint8`` (rescale in the model). The first pass over
    the dataset is epoch ``epoch``, each later pass the next epoch. ``len(dataset)`` is the
    number of batches per epoch. With ``steps_per_epoch`` smaller than that, Keras goes on
    with the same pass in its next epoch; ``dataset.repeat()`` is an endless stream of
    epochs.

    Args:
        source: Dataset URL, or an opened :class:`~stoker.format.reader.ShardDataset`.
        batch_size: Samples per batch (per input pipeline: with ``tf.distribute``, use
            ``input_context.get_per_replica_batch_size(global_batch_size)``).
        fields: What each element holds, from ``image``, ``label``, ``index`` (sample
            number in the dataset) and ``key``.
        input_context: A ``tf.distribute.InputContext``: this pipeline reads the share of
            rank ``input_pipeline_id`` of ``num_input_pipelines``.
        epoch: Epoch of the first pass (to continue a run at Keras' ``initial_epoch``).
        **options: :class:`stoker.Loader`'s settings (``transform``, ``seed``, ``order``,
            ``drop_last``, ``decode``, ``cache``, ``storage_options``, ``world``, ...).

    Returns:
        A ``tf.data.Dataset`` with a known length.

    Raises:
        ValueError: Unknown ``fields``, or both ``input_context`` and ``world``.
    """
    if input_context is not None:
        if options.get("world") is not None:
            raise ValueError("give either input_context or world, not both")
        rank, world_size = detect_world(input_context)
        options["world"] = World(rank=rank, world_size=world_size)
    names = tuple(fields)
    signature = output_signature(options.get("transform"), names)
    opened = (
        source
        if isinstance(source, ShardDataset)
        else open_dataset(source, storage_options=options.get("storage_options"))
    )
    # Made here so that bad options raise now, not inside TensorFlow's generator thread.
    steps = len(Loader(opened, batch_size=batch_size, **options))
    epochs = itertools.count(epoch)

    def batches() -> Iterator[tuple[np.ndarray, ...]]:
        with Loader(opened, batch_size=batch_size, **options) as loader:
            loader.set_epoch(next(epochs))
            for batch in loader:
                yield tuple(_column(batch, name, opened.url) for name in names)

    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(steps))
    world = options.get("world")
    if world is not None and world.world_size > 1:
        # The loader already reads this rank's share; tf.distribute must not shard again.
        sharding = tf.data.Options()
        sharding.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF
        )
        dataset = dataset.with_options(sharding)
    # One batch ahead, so the conversion into tensors overlaps the training step.
    return dataset.prefetch(1)


def _column(batch: Mapping[str, Any], name: str, url: str) -> np.ndarray:
    value = batch[name]
    if name == "key":
        return np.asarray(value, dtype=object)
    if not isinstance(value, np.ndarray) or (name == "image" and value.dtype != np.uint8):
        raise ValueError(
            f"{url}: images of one batch must form one uint8 array to become a tensor; use "
            "a transform with a fixed output size, such as RandomResizedCrop(224)"
        )
    return value
