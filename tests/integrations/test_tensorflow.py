"""The TensorFlow adapter: Keras model.fit over a bucket, epochs, tf.distribute shares.

TensorFlow runs in one child process (this file, run as a script), which does the
TensorFlow side and saves what it saw; the tests compare that with the numpy loader here.
It cannot run in the test process: the ``tfrecord`` package, the reference the TFRecord
tests use, registers the same protobuf names as TensorFlow (``tensorflow.BytesList``, ...),
and a process that imports both fails with "duplicate symbol".
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from stoker import World
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import CenterCrop, RandomResizedCrop, Resize

CLASSES = 4
SIZES = {"train": 200, "val": 64}
BATCH_SIZE, EPOCHS = 32, 3
ORDER = OrderConfig(block_size=4, group_blocks=2)
# Class c is a distinct colour, so a model can only learn if images and labels stay paired.
COLOURS = np.array([[230, 40, 40], [40, 200, 40], [40, 40, 230], [220, 220, 60]])


def train_options(storage_options: dict[str, Any]) -> dict[str, Any]:
    return {
        "transform": RandomResizedCrop(24, scale=(0.6, 1.0)),
        "seed": 5,
        "order": ORDER,
        "storage_options": storage_options,
    }


def share_options(storage_options: dict[str, Any]) -> dict[str, Any]:
    return {"order": ORDER, "drop_last": True, "storage_options": storage_options}


# -- the child: everything that needs TensorFlow -----------------------------------------


def child(bucket: str, storage_options: dict[str, Any], out: Path) -> None:
    import keras
    import tensorflow as tf

    from stoker.integrations.tensorflow import detect_world, make_dataset, output_signature

    saved: dict[str, Any] = {}
    facts: dict[str, Any] = {}

    class Recording(keras.Sequential):
        """Keeps every (images, labels) batch it trains on."""

        def __init__(self, layers: list[Any]) -> None:
            super().__init__(layers)
            self.seen: list[tuple[np.ndarray, np.ndarray]] = []

        def train_step(self, data: Any) -> Any:
            images, labels = data
            self.seen.append((np.asarray(images), np.asarray(labels)))
            return super().train_step(data)

    train = make_dataset(f"{bucket}/train", batch_size=BATCH_SIZE, **train_options(storage_options))
    val = make_dataset(
        f"{bucket}/val",
        batch_size=BATCH_SIZE,
        transform=CenterCrop(24),
        storage_options=storage_options,
        order=OrderConfig(mode="none"),
    )
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
        epochs=EPOCHS,
        steps_per_epoch=len(train),
        validation_data=val,
        shuffle=False,
        verbose=0,
    )
    facts["steps"], facts["val_steps"] = len(train), len(val)
    facts["history"] = history.history
    saved["fit_images"] = np.concatenate([images for images, _ in model.seen])
    saved["fit_labels"] = np.concatenate([labels for _, labels in model.seen])
    saved["fit_batch_sizes"] = np.array([len(labels) for _, labels in model.seen])

    # tf.distribute: an InputContext per input pipeline.
    for pipeline in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2
        )
        dataset = make_dataset(
            f"{bucket}/train",
            batch_size=16,
            fields=("index", "key"),
            input_context=context,
            **share_options(storage_options),
        )
        batches = [(index.numpy(), keys.numpy()) for index, keys in dataset]
        saved[f"share{pipeline}_index"] = np.concatenate([index for index, _ in batches])
        saved[f"share{pipeline}_sizes"] = np.array([len(index) for index, _ in batches])
        facts[f"share{pipeline}"] = {
            "world": detect_world(context),
            "length": len(dataset),
            "keys": [k.decode() for _, keys in batches for k in keys],
            "policy": dataset.options().experimental_distribute.auto_shard_policy.name,
        }
    try:
        make_dataset(f"{bucket}/val", batch_size=4, input_context=context, world=World(rank=0))
    except ValueError as exc:
        facts["conflict"] = str(exc)

    # tf.distribute: distribute_datasets_from_function calls us with its context.
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    contexts: list[Any] = []

    def dataset_fn(context: Any) -> Any:
        contexts.append(context)
        return make_dataset(
            f"{bucket}/val",
            batch_size=context.get_per_replica_batch_size(16),
            fields=("label", "index"),
            input_context=context,
            storage_options=storage_options,
        )

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    saved["distributed_index"] = np.concatenate([index.numpy() for _, index in distributed])
    facts["contexts"] = len(contexts)

    fixed = output_signature(RandomResizedCrop((24, 32)), ("image", "label", "key"))
    (free,) = output_signature(Resize(16), ("image",))
    facts["signature"] = [[s.shape.as_list(), s.dtype.name] for s in [*fixed, free]]
    facts["bad_fields"] = []
    for bad in [("image", "image"), ("pixels",), ()]:
        try:
            output_signature(None, bad)
        except ValueError as exc:
            facts["bad_fields"].append(str(exc))
    np.savez(out / "saved.npz", **saved)
    (out / "facts.json").write_text(json.dumps(facts))


# -- the tests -----------------------------------------------------------------------------


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
def run(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Pack train and validation sets into a bucket, then run the TensorFlow child once."""
    if importlib.util.find_spec("tensorflow") is None:  # not imported: see the module's doc
        pytest.skip("tensorflow is not installed (pip install -e '.[test]')")
    root = tmp_path_factory.mktemp("tf")
    s3_server.create_bucket("tf-adapter")
    options = s3_server.storage_options()
    for seed, (split, files) in enumerate(SIZES.items()):
        write_coloured_folder(root / split, files=files, seed=seed)
        pack(
            root / split,
            f"s3://tf-adapter/{split}",
            storage_options=options,
            config=PackConfig(samples_per_shard=48),
        )
    command = [sys.executable, __file__, "s3://tf-adapter", json.dumps(options), str(root)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    with np.load(root / "saved.npz") as saved:
        arrays = dict(saved)
    return {
        "options": options,
        "facts": json.loads((root / "facts.json").read_text()),
        **arrays,
    }


def test_keras_fit_trains_with_validation(run: dict[str, Any]) -> None:
    facts = run["facts"]
    assert facts["steps"] == -(-SIZES["train"] // BATCH_SIZE)
    assert facts["val_steps"] == -(-SIZES["val"] // BATCH_SIZE)
    assert len(run["fit_batch_sizes"]) == EPOCHS * facts["steps"]
    assert len(facts["history"]["val_loss"]) == EPOCHS
    # Colour decides the class: the model learns only if every label sits with its image.
    assert facts["history"]["val_accuracy"][-1] > 0.9


def test_each_keras_epoch_is_the_loaders_next_epoch(run: dict[str, Any]) -> None:
    reference = Loader(
        "s3://tf-adapter/train", batch_size=BATCH_SIZE, **train_options(run["options"])
    )
    labels = reference.dataset.labels
    expected: list[dict[str, Any]] = []
    orders = []
    for epoch in range(EPOCHS):
        reference.set_epoch(epoch)
        batches = list(reference)
        expected += batches
        order = np.concatenate([b["index"] for b in batches])
        assert sorted(order.tolist()) == list(range(SIZES["train"]))
        orders.append(order)
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[1], orders[2])
    assert run["fit_batch_sizes"].tolist() == [len(b["label"]) for b in expected]
    images = np.concatenate([b["image"] for b in expected])
    assert np.array_equal(run["fit_images"], images)
    assert np.array_equal(run["fit_labels"], np.concatenate([b["label"] for b in expected]))
    # The labels are the dataset's, and the class folders the samples came from.
    indices = np.concatenate([b["index"] for b in expected])
    assert np.array_equal(run["fit_labels"], labels[indices])
    keys = [k for b in expected for k in b["key"]]
    assert [f"class_{c:02d}" for c in run["fit_labels"]] == [k.split("/")[0] for k in keys]


def test_input_context_selects_the_share(run: dict[str, Any]) -> None:
    facts = run["facts"]
    seen: list[int] = []
    for pipeline in range(2):
        share = facts[f"share{pipeline}"]
        assert share["world"] == [pipeline, 2]
        # The loader already splits; tf.distribute must not shard a second time.
        assert share["policy"] == "OFF"
        expected = list(
            Loader(
                "s3://tf-adapter/train",
                batch_size=16,
                **share_options(run["options"]),
                world=World(rank=pipeline, world_size=2),
            )
        )
        assert share["length"] == len(expected) > 0
        assert run[f"share{pipeline}_sizes"].tolist() == [len(b["index"]) for b in expected]
        index = run[f"share{pipeline}_index"]
        assert np.array_equal(index, np.concatenate([b["index"] for b in expected]))
        assert share["keys"] == [k for b in expected for k in b["key"]]
        seen += index.tolist()
    assert len(seen) == len(set(seen))
    assert "input_context" in facts["conflict"]


def test_distribute_datasets_from_function_reads_everything_once(run: dict[str, Any]) -> None:
    assert run["facts"]["contexts"] == 1
    assert sorted(run["distributed_index"].tolist()) == list(range(SIZES["val"]))


def test_output_signature(run: dict[str, Any]) -> None:
    assert run["facts"]["signature"] == [
        [[None, 24, 32, 3], "uint8"],
        [[None], "int64"],
        [[None], "string"],
        [[None, None, None, 3], "uint8"],
    ]
    errors = run["facts"]["bad_fields"]
    assert len(errors) == 3
    assert all("fields must be distinct names" in e for e in errors)


if __name__ == "__main__":
    child(sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3]))
