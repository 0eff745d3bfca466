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

from stoker import DecodeConfig, World
from stoker.pack.indexer import index_webdataset
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.fields import FieldsConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import CenterCrop, RandomResizedCrop, Resize
from stoker.testing.images import make_jpeg

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
    records(out, facts, saved)
    unpacked(out / "val", facts)
    facts["bad_fields"] = []
    for bad in [("image", "image"), ("pixels",), ()]:
        try:
            output_signature(None, bad)
        except ValueError as exc:
            facts["bad_fields"].append(str(exc))
    np.savez(out / "saved.npz", **saved)
    (out / "facts.json").write_text(json.dumps(facts))


def unpacked(folder: Path, facts: dict[str, Any]) -> None:
    """An unpacked class folder, as stoker.Loader streams it."""
    from stoker.integrations.tensorflow import make_dataset

    dataset = make_dataset(folder, batch_size=16, transform=CenterCrop(8), fields=("label", "key"))
    facts["folder_length"] = len(dataset)
    facts["folder_keys"] = [
        [label, key.decode()]
        for labels, keys in dataset
        for label, key in zip(labels.numpy().tolist(), keys.numpy().tolist(), strict=True)
    ]


def records(out: Path, facts: dict[str, Any], saved: dict[str, Any]) -> None:
    """Every field of image-caption-JSON-array records: Keras fits on images and strings."""
    import keras

    from stoker.integrations.tensorflow import make_dataset

    url = str(out / "captioned")
    order = OrderConfig(mode="none")
    pairs = make_dataset(
        url, batch_size=4, transform=CenterCrop(16), order=order, fields=(("image", "txt"), "label")
    )
    image_in = keras.Input((16, 16, 3), dtype="uint8")
    text_in = keras.Input((), dtype="string")
    pixels = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(image_in))
    words = keras.layers.Embedding(8, 4)(keras.layers.Hashing(num_bins=8)(text_in))
    joined = keras.layers.Concatenate()([pixels, words])
    model = keras.Model([image_in, text_in], keras.layers.Dense(3, activation="softmax")(joined))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    history = model.fit(pairs, epochs=2, verbose=0)
    facts["records_loss"] = history.history["loss"]
    texts, shapes = [], []
    for (images, text), _ in pairs:
        texts += [t.decode() for t in text.numpy().tolist()]
        shapes.append(list(images.shape))
    facts["records_texts"], facts["records_shapes"] = texts, shapes
    rest = make_dataset(url, batch_size=4, order=order, fields=("key", "json", "npy", "label"))
    facts["records_signature"] = [type(s).__name__ for s in rest.element_spec]
    facts["records_json"], lengths = [], []
    for keys, meta, arrays, cls in rest:
        facts["records_json"] += [json.loads(m) for m in meta.numpy().tolist()]
        lengths += arrays.row_lengths().numpy().tolist()
        saved.setdefault("records_values", []).extend(arrays.flat_values.numpy().tolist())
        assert cls.dtype.name == "int64"
        assert keys.dtype.name == "string"
    facts["records_lengths"] = lengths
    widened = DecodeConfig(fields=FieldsConfig(transforms={"npy": _longdouble}))
    try:
        make_dataset(url, batch_size=4, order=order, fields=("npy",), decode=widened)
        facts["longdouble_error"] = None
    except TypeError as exc:
        facts["longdouble_error"] = str(exc)


def _longdouble(array: np.ndarray) -> np.ndarray:
    return array.astype(np.longdouble)


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
    write_records(root / "captioned")
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


def test_make_dataset_streams_an_unpacked_folder(run: dict[str, Any]) -> None:
    facts = run["facts"]
    assert facts["folder_length"] == SIZES["val"] // 16
    pairs = sorted(facts["folder_keys"])
    assert len(pairs) == SIZES["val"]
    assert [f"class_{label:02d}" for label, _ in pairs] == [key.split("/")[0] for _, key in pairs]


def test_output_signature(run: dict[str, Any]) -> None:
    assert run["facts"]["signature"] == [
        [[None, 24, 32, 3], "uint8"],
        [[None], "int64"],
        [[None], "string"],
        [[None, None, None, 3], "uint8"],
    ]
    errors = run["facts"]["bad_fields"]
    assert len(errors) == 3
    assert "fields must be distinct batch field names" in errors[0]
    assert "no field 'pixels' in the batches" in errors[1]
    assert "fields must be distinct batch field names" in errors[2]


RECORDS = 10


def record(i: int) -> dict[str, Any]:
    return {
        "__key__": f"{i:04d}",
        "jpg": make_jpeg(np.random.default_rng(i), width=20, height=20),
        "txt": f"caption {i} ✓",
        "json": {"i": i, "tags": ["x"] * (i % 3)},
        "npy": np.arange(i % 4 + 1, dtype=np.float32) + i,
        "cls": i % 3,
    }


def write_records(root: Path) -> None:
    import webdataset as wds

    root.mkdir()
    with wds.TarWriter(str(root / "records-0000.tar")) as sink:
        for i in range(RECORDS):
            sink.write(record(i))
    index_webdataset(root)


def test_keras_fits_on_images_and_strings(run: dict[str, Any]) -> None:
    facts = run["facts"]
    assert len(facts["records_loss"]) == 2
    assert facts["records_texts"] == [record(i)["txt"] for i in range(RECORDS)]
    assert facts["records_shapes"] == [[4, 16, 16, 3], [4, 16, 16, 3], [2, 16, 16, 3]]


def test_json_and_ragged_arrays_become_tensors(run: dict[str, Any]) -> None:
    facts = run["facts"]
    assert facts["records_signature"] == [
        "TensorSpec",
        "TensorSpec",
        "RaggedTensorSpec",
        "TensorSpec",
    ]
    assert facts["records_json"] == [record(i)["json"] for i in range(RECORDS)]
    assert facts["records_lengths"] == [i % 4 + 1 for i in range(RECORDS)]
    expected = np.concatenate([record(i)["npy"] for i in range(RECORDS)])
    assert np.array_equal(run["records_values"], expected)


def test_a_field_tensorflow_has_no_dtype_for_is_named(run: dict[str, Any]) -> None:
    error = run["facts"]["longdouble_error"]
    assert error is not None
    assert "field 'npy'" in error
    assert "float128" in error or "longdouble" in error


if __name__ == "__main__":
    child(sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3]))
