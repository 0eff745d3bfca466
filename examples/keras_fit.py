"""Train a small Keras model on images streamed from a bucket, with validation data.

Runs as is against a throwaway SeaweedFS server (needs `pip install 'stoker[demo,tf]'`).
The images are random, so accuracy stays near chance: the point is the plumbing.

    python examples/keras_fit.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import keras

import stoker
from stoker import OrderConfig
from stoker.integrations.tensorflow import make_dataset
from stoker.pipeline.transforms import CenterCrop, RandomResizedCrop
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import SeaweedServer


def main() -> None:
    with SeaweedServer() as server, tempfile.TemporaryDirectory() as scratch:
        server.create_bucket("example")
        options = server.storage_options()

        # 320 training and 64 validation JPEGs (40x40, 4 classes), packed into the bucket.
        for split, files in (("train", 320), ("val", 64)):
            write_image_folder(Path(scratch, split), files=files, classes=4, width=40, height=40)
            stoker.pack(
                Path(scratch, split),
                f"s3://example/{split}",
                storage_options=options,
                config=stoker.PackConfig(samples_per_shard=64),
            )

        # tf.data datasets of (uint8 images, int64 labels); each pass is a new epoch.
        train = make_dataset(
            "s3://example/train",
            batch_size=32,
            transform=RandomResizedCrop(32, scale=(0.5, 1.0), flip=True),
            storage_options=options,
        )
        val = make_dataset(
            "s3://example/val",
            batch_size=32,
            transform=CenterCrop(32),
            storage_options=options,
            order=OrderConfig(mode="none"),
        )

        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((32, 32, 3), dtype="uint8"),
                keras.layers.Rescaling(1 / 255),  # the loader delivers uint8
                keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(4),
            ]
        )
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        # shuffle=False: stoker shuffles (Keras cannot shuffle a tf.data.Dataset anyway).
        history = model.fit(
            train,
            epochs=2,
            steps_per_epoch=len(train),
            validation_data=val,
            shuffle=False,
            verbose=0,
        )
        for epoch, (loss, val_loss) in enumerate(
            zip(history.history["loss"], history.history["val_loss"], strict=True)
        ):
            print(f"epoch {epoch}: {len(train)} steps, loss {loss:.3f}, val_loss {val_loss:.3f}")


if __name__ == "__main__":
    main()
