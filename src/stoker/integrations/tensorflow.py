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

Token sequences take the same function, with :class:`stoker.TokenLoader`'s settings; each
element is then ``(input_ids, targets)``, the ``(x, y)`` of a Keras language model that
scores every position against the next token::

    train = make_dataset("s3://bucket/tokens", seq_len=2048, batch_size=8)
    model.fit(train, epochs=1)  # logits (8, 2048, vocab); sparse categorical cross-entropy

A ``tf.data.Dataset`` has no ``stats()``: the loaders behind it are made inside TensorFlow's
generator, one per pass. To see stage times, requests and a trace, run ``stoker doctor`` on
the dataset, or a :class:`stoker.Loader` with the same settings and its ``stats()``.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Unpack

import numpy as np
import tensorflow as tf

from stoker.errors import BucketNotFoundError
from stoker.format.reader import open_dataset
from stoker.pipeline.config import AdapterOptions, LoaderOptions, SourceConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.sources import SourceLike
from stoker.pipeline.token_loader import loader_arguments
from stoker.pipeline.transforms import PlannedTransform
from stoker.pipeline.world import World

#: The fields every batch has, whose specs are known before any sample is read.
FIELDS = ("image", "label", "index", "key")
#: The elements of a token dataset by default: inputs and their next tokens.
TOKEN_FIELDS = ("input_ids", "targets")

#: What ``fields`` may be: a batch field's name, or a tuple of these (a nested element, as
#: ``(("image", "txt"), "label")`` for a model with two inputs).
FieldTree = str | tuple["FieldTree", ...]


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


def output_signature(
    transform: Any,
    fields: Sequence[FieldTree] = ("image", "label"),
    example: Mapping[str, Any] | None = None,
) -> tuple[Any, ...]:
    """The ``tf.TypeSpec`` of each field of a batch element.

    Images are ``uint8`` ``(None, H, W, 3)`` when ``transform`` has a fixed output size,
    ``(None, None, None, 3)`` otherwise; labels and indices are ``int64`` ``(None,)``;
    keys are ``tf.string`` ``(None,)``. Any other field takes its spec from ``example``, a
    batch of the same loader: arrays keep their dtype (every dimension but the batch's
    left open), arrays of different lengths become a ``tf.RaggedTensorSpec``, text and
    bytes ``tf.string``, numbers ``int64`` or ``float64``, and other objects (parsed JSON)
    ``tf.string`` holding their JSON text.

    Args:
        transform: The loader's transform.
        fields: Names of batch fields, or tuples of them for a nested element.
        example: A batch, for fields other than :data:`FIELDS`.

    Raises:
        ValueError: A repeated field, or one the example batch does not have.
    """
    names = list(_leaves(tuple(fields)))
    if not names or len(set(names)) != len(names):
        raise ValueError(f"fields must be distinct batch field names, got {list(fields)}")
    size = transform.output_size if isinstance(transform, PlannedTransform) else None
    height, width = size if size is not None else (None, None)
    specs = {
        "image": tf.TensorSpec((None, height, width, 3), tf.uint8, name="image"),
        "label": tf.TensorSpec((None,), tf.int64, name="label"),
        "index": tf.TensorSpec((None,), tf.int64, name="index"),
        "key": tf.TensorSpec((None,), tf.string, name="key"),
    }
    for name in names:
        if name not in specs:
            if example is None or name not in example:
                have = sorted(example) if example is not None else list(FIELDS)
                raise ValueError(f"no field {name!r} in the batches; they have {have}")
            specs[name] = _spec(name, example[name])
    return tuple(_map(branch, specs.__getitem__) for branch in fields)


def _leaves(tree: FieldTree) -> Iterator[str]:
    if isinstance(tree, str):
        yield tree
    else:
        for branch in tree:
            yield from _leaves(branch)


def _map(tree: Any, function: Any) -> Any:
    if isinstance(tree, str):
        return function(tree)
    return tuple(_map(branch, function) for branch in tree)


def _spec(name: str, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OUS":
            return tf.TensorSpec((None,) * value.ndim, tf.string, name=name)
        return tf.TensorSpec((None,) * value.ndim, _tf_dtype(name, value.dtype), name=name)
    items = list(value)
    arrays = [v for v in items if isinstance(v, np.ndarray)]
    if arrays and len(arrays) == len(items):
        dtype = _tf_dtype(name, arrays[0].dtype)
        return tf.RaggedTensorSpec((None, None, *arrays[0].shape[1:]), dtype, ragged_rank=1)
    return tf.TensorSpec((None,), tf.string, name=name)


def _tf_dtype(name: str, dtype: np.dtype[Any]) -> Any:
    """TensorFlow's dtype for a field's numpy dtype.

    Raises:
        TypeError: TensorFlow has none (``longdouble``, ``datetime64``, a structured
            dtype); the message names the field.
    """
    try:
        return tf.as_dtype(dtype)
    except TypeError as exc:
        raise TypeError(
            f"field {name!r}: TensorFlow has no dtype for numpy's {dtype} ({exc}); convert it "
            "in a field transform (DecodeConfig(fields=FieldsConfig(transforms=...)))"
        ) from None


def make_dataset(
    source: SourceLike,
    *,
    batch_size: int,
    fields: Sequence[FieldTree] | None = None,
    input_context: Any = None,
    epoch: int = 0,
    **options: Unpack[AdapterOptions],
) -> Any:
    """A ``tf.data.Dataset`` of batches, for ``model.fit`` or a custom loop.

    Each element is a tuple of ``fields``: by default ``(image, label)``, the ``(x, y)``
    that Keras expects; images stay ``uint8`` (rescale in the model). Token sequences
    (``seq_len``, or a ``SourceConfig`` with ``tokens``) give ``(input_ids, targets)`` by
    default, ``(N, seq_len)`` int64 each (any field of :class:`stoker.TokenLoader`'s
    batches may be named). The first pass over
    the dataset is epoch ``epoch``, each later pass the next epoch. ``len(dataset)`` is the
    number of batches per epoch. With ``steps_per_epoch`` smaller than that, Keras goes on
    with the same pass in its next epoch; ``dataset.repeat()`` is an endless stream of
    epochs.

    Args:
        source: What :class:`stoker.Loader` takes: a dataset URL or path, an unpacked
            folder of class folders, an opened
            :class:`~stoker.format.reader.ShardDataset`, several URLs, a
            :class:`~stoker.pipeline.config.SourceConfig`; with ``seq_len``, what
            :class:`stoker.TokenLoader` takes.
        batch_size: Samples (or sequences) per batch (per input pipeline: with
            ``tf.distribute``, use
            ``input_context.get_per_replica_batch_size(global_batch_size)``).
        fields: What each element holds: ``image``, ``label``, ``index`` (sample number
            in the dataset), ``key``, or any other field of the batches (``txt``,
            ``json``, ``npy``, ...), each a tensor as :func:`output_signature` says; a tuple
            of names nests, so ``(("image", "txt"), "label")`` feeds a model with two
            inputs.
        input_context: A ``tf.distribute.InputContext``: this pipeline reads the share of
            rank ``input_pipeline_id`` of ``num_input_pipelines``.
        epoch: Epoch of the first pass (to continue a run at Keras' ``initial_epoch``).
        **options: :class:`stoker.Loader`'s settings (``transform``, ``seed``, ``order``,
            ``drop_last``, ``decode``, ``cache``, ``storage_options``, ``world``, ...),
            and :class:`stoker.TokenLoader`'s ``seq_len``, ``documents`` and ``dtype`` to
            read token sequences (``drop_last`` then defaults to true, as there).

    Returns:
        A ``tf.data.Dataset`` with a known length.

    Raises:
        ValueError: Unknown ``fields``, or both ``input_context`` and ``world``.
    """
    source, loader_options = loader_arguments(source, options)
    if input_context is not None:
        if loader_options.get("world") is not None:
            raise ValueError("give either input_context or world, not both")
        rank, world_size = detect_world(input_context)
        loader_options["world"] = World(rank=rank, world_size=world_size)
    if fields is None:
        tokens = isinstance(source, SourceConfig) and source.tokens is not None
        fields = TOKEN_FIELDS if tokens else ("image", "label")
    tree = tuple(fields)
    opened = _opened(source, loader_options.get("storage_options"))
    steps, url, example = _probe(opened, batch_size, loader_options, tree)
    signature = output_signature(loader_options.get("transform"), tree, example)
    epochs = itertools.count(epoch)

    def batches() -> Iterator[tuple[Any, ...]]:
        with Loader(opened, batch_size=batch_size, **loader_options) as each:
            each.set_epoch(next(epochs))
            for batch in each:
                yield _map(tree, functools.partial(_column, batch, url=url))

    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(steps))
    world = loader_options.get("world")
    if world is not None and world.world_size > 1:
        dataset = _unsharded(dataset)
    # One batch ahead, so the conversion into tensors overlaps the training step.
    return dataset.prefetch(1)


def _probe(
    opened: SourceLike, batch_size: int, loader_options: LoaderOptions, tree: tuple[FieldTree, ...]
) -> tuple[int, str, dict[str, Any] | None]:
    """A Loader made now, so that bad options raise here, not inside TensorFlow's generator
    thread: its batches per epoch, its URL, and a first batch where ``tree`` names fields
    whose specs are read off one (else None)."""
    probe = Loader(opened, batch_size=batch_size, **loader_options)
    steps = len(probe)
    url = probe.source.url
    example = None
    if any(name not in FIELDS for name in _leaves(tree)):
        # Specs of other fields are read off a first batch.
        with probe:
            example = next(iter(probe), None)
    return steps, url, example


def _unsharded(dataset: Any) -> Any:
    """``dataset`` that ``tf.distribute`` does not shard: the loader already reads this
    rank's share."""
    sharding = tf.data.Options()
    sharding.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(sharding)


def _opened(source: SourceLike, storage_options: Mapping[str, Any] | None) -> SourceLike:
    """A packed dataset's index read once for every pass; anything else as given (the
    Loader of each pass opens it: an unpacked folder is listed then)."""
    if not isinstance(source, str | os.PathLike):
        return source
    try:
        return open_dataset(source, storage_options=storage_options)
    except BucketNotFoundError:
        raise
    except FileNotFoundError:  # no index: the Loader streams a folder, or says what is wrong
        return source


def _column(batch: Mapping[str, Any], name: str, url: str) -> Any:
    value = batch[name]
    if name == "key":
        return np.asarray(value, dtype=object)
    if name == "image" and (not isinstance(value, np.ndarray) or value.dtype != np.uint8):
        raise ValueError(
            f"{url}: images of one batch must form one uint8 array to become a tensor; use "
            "a transform with a fixed output size, such as RandomResizedCrop(224)"
        )
    if isinstance(value, np.ndarray):
        return value
    items = list(value)
    if items and all(isinstance(v, np.ndarray) for v in items):
        return tf.ragged.constant([v.tolist() for v in items], dtype=tf.as_dtype(items[0].dtype))
    return np.asarray([_text(v, name, url) for v in items], dtype=object)


def _text(value: Any, name: str, url: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        raise ValueError(f"{url}: field {name!r} is missing in a sample; a tf.string has no None")
    return json.dumps(value).encode("utf-8")
