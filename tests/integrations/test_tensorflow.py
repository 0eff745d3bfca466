"""The TensorFlow adapter: Keras model.fit over a bucket, epochs, tf.distribute shares."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from stoker.integrations.tensorflow import detect_world, make_dataset, output_signature
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import CenterCrop, RandomResizedCrop, Resize
from stoker.testing.seaweed import SeaweedServer

CLASSES = 4
ORDER = OrderConfig(block_size=4, group_blocks=2)
# Class c is a distinct colour, so a model can only learn if images and labels stay paired.
COLOURS = np.array([[230, 40, 40], [40, 200, 40], [40, 40, 230], [220, 220, 60]])


def write_coloured_folder(root: Path, *, files: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for i in range(files):
        label = i % CLASSES
        pixels = COLOURS[label] + rng.normal(0, 25, size=(40, 40, 3))
        out = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, format="JPEG")
        folder = root / f"class_{label:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{i:06d}.jpg").write_bytes(out.getvalue())


@pytest.fixture(scope="module")
def splits(s3_server: SeaweedServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Train (200 samples) and validation (64) datasets packed into a bucket."""
    root = tmp_path_factory.mktemp("tf")
    s3_server.create_bucket("tf-adapter")
    options = s3_server.storage_options()
    sizes = {"train": 200, "val": 64}
    for seed, (split, files) in enumerate(sizes.items()):
        write_coloured_folder(root / split, files=files, seed=seed)
        pack(
            root / split,
            f"s3://tf-adapter/{split}",
            storage_options=options,
            config=PackConfig(samples_per_shard=48),
        )
    return {"options": options, "sizes": sizes}


class Recording(keras.Sequential):
    """A Sequential model that keeps every (images, labels) batch it trains on."""

    def __init__(self, layers: list[Any]) -> None:
        super().__init__(layers)
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []

    def train_step(self, data: Any) -> Any:
        images, labels = data
        self.seen.append((np.asarray(images), np.asarray(labels)))
        return super().train_step(data)


def test_keras_fit_with_validation_reshuffles_every_epoch(splits: dict[str, Any]) -> None:
    options, sizes = splits["options"], splits["sizes"]
    batch_size, epochs = 32, 3
    train_options: dict[str, Any] = {
        "transform": RandomResizedCrop(24, scale=(0.6, 1.0)),
        "seed": 5,
        "order": ORDER,
        "storage_options": options,
    }
    train = make_dataset("s3://tf-adapter/train", batch_size=batch_size, **train_options)
    val = make_dataset(
        "s3://tf-adapter/val",
        batch_size=batch_size,
        transform=CenterCrop(24),
        shuffle=False,
        storage_options=options,
    )
    steps = len(train)
    assert steps == -(-sizes["train"] // batch_size)
    assert len(val) == -(-sizes["val"] // batch_size)

    keras.utils.set_random_seed(0)
    model = Recording(
        [
            keras.Input((24, 24, 3), dtype="uint8"),
            keras.layers.Rescaling(1 / 255),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        run_eagerly=True,  # so that train_step sees concrete batches
    )
    history = model.fit(
        train,
        epochs=epochs,
        steps_per_epoch=steps,
        validation_data=val,
        shuffle=False,
        verbose=0,
    )
    assert len(model.seen) == epochs * steps
    assert len(history.history["val_loss"]) == epochs
    # Colour decides the class: the model learns only if every label sits with its image.
    assert history.history["val_accuracy"][-1] > 0.9

    reference = Loader("s3://tf-adapter/train", batch_size=batch_size, **train_options)
    labels = reference.dataset.labels
    orders = []
    for epoch in range(epochs):
        reference.set_epoch(epoch)
        expected = list(reference)
        trained = model.seen[epoch * steps : (epoch + 1) * steps]
        for (images, got_labels), batch in zip(trained, expected, strict=True):
            assert np.array_equal(images, batch["image"])
            assert np.array_equal(got_labels, batch["label"])
            assert np.array_equal(got_labels, labels[batch["index"]])
            assert [f"class_{c:02d}" for c in got_labels] == [k.split("/")[0] for k in batch["key"]]
        order = np.concatenate([b["index"] for b in expected])
        assert sorted(order.tolist()) == list(range(sizes["train"]))
        orders.append(order)
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[1], orders[2])


def test_input_context_selects_the_share(splits: dict[str, Any]) -> None:
    options, total = splits["options"], splits["sizes"]["train"]
    url = "s3://tf-adapter/train"
    seen: list[int] = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2
        )
        assert detect_world(context) == (pipeline, 2)
        dataset = make_dataset(
            url,
            batch_size=16,
            fields=("index", "key"),
            input_context=context,
            order=ORDER,
            drop_last=True,
            storage_options=options,
        )
        policy = dataset.options().experimental_distribute.auto_shard_policy
        assert policy == tf.data.experimental.AutoShardPolicy.OFF
        share = Loader(
            url,
            batch_size=16,
            rank=pipeline,
            world_size=2,
            order=ORDER,
            drop_last=True,
            storage_options=options,
        )
        expected = list(share)
        got = [(i.numpy(), k.numpy()) for i, k in dataset]
        assert len(got) == len(dataset) == len(expected) > 0
        for (index, keys), batch in zip(got, expected, strict=True):
            assert np.array_equal(index, batch["index"])
            assert [k.decode() for k in keys] == batch["key"]
        seen += [int(i) for index, _ in got for i in index]
    assert len(seen) == len(set(seen)) <= total
    with pytest.raises(ValueError, match="input_context"):
        make_dataset(url, batch_size=4, input_context=context, rank=0, storage_options=options)


def test_distribute_datasets_from_function(splits: dict[str, Any]) -> None:
    options, total = splits["options"], splits["sizes"]["val"]
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    contexts: list[Any] = []

    def dataset_fn(context: Any) -> Any:
        contexts.append(context)
        return make_dataset(
            "s3://tf-adapter/val",
            batch_size=context.get_per_replica_batch_size(16),
            fields=("label", "index"),
            input_context=context,
            storage_options=options,
        )

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    indices = [int(i) for _, index in distributed for i in index.numpy()]
    assert len(contexts) == 1
    assert sorted(indices) == list(range(total))


def test_output_signature() -> None:
    fixed = output_signature(RandomResizedCrop((24, 32)), ("image", "label", "key"))
    assert [s.shape.as_list() for s in fixed] == [[None, 24, 32, 3], [None], [None]]
    assert [s.dtype for s in fixed] == [tf.uint8, tf.int64, tf.string]
    (free,) = output_signature(Resize(16), ("image",))
    assert free.shape.as_list() == [None, None, None, 3]
    for bad in [("image", "image"), ("pixels",), ()]:
        with pytest.raises(ValueError, match="fields"):
            output_signature(None, bad)
