"""Train a small JAX model on images streamed from a bucket, batches sharded over devices.

Runs as is against a throwaway SeaweedFS server (needs `pip install 'stoker[demo,jax]'`).
The images are random, so the loss only falls as far as memorising allows: the point is
the plumbing. In multi-process JAX the same code reads one share per process.

    python examples/jax_train.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import stoker
from stoker.integrations.jax import JaxLoader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import SeaweedServer

CLASSES = 4


def loss_fn(params: dict[str, Any], images: jax.Array, labels: jax.Array) -> jax.Array:
    features = images.astype(jnp.float32).reshape(images.shape[0], -1) / 255.0
    logits = features @ params["w"] + params["b"]
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)
    return -jnp.mean(picked)


@jax.jit
def train_step(
    params: dict[str, Any], images: jax.Array, labels: jax.Array
) -> tuple[dict[str, Any], jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
    params = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
    return params, loss


def main() -> None:
    with SeaweedServer() as server, tempfile.TemporaryDirectory() as scratch:
        server.create_bucket("example")
        options = server.storage_options()
        write_image_folder(Path(scratch, "src"), files=256, classes=CLASSES, width=40, height=40)
        stoker.pack(
            Path(scratch, "src"),
            "s3://example/train",
            storage_options=options,
            config=stoker.PackConfig(samples_per_shard=64),
        )

        # Batches as jax.Arrays, split over the devices along the batch axis.
        loader = JaxLoader(
            "s3://example/train",
            batch_size=32,
            transform=RandomResizedCrop(16, scale=(0.5, 1.0)),
            storage_options=options,
        )
        params = {"w": jnp.zeros((16 * 16 * 3, CLASSES)), "b": jnp.zeros(CLASSES)}
        for epoch in range(2):
            loader.set_epoch(epoch)  # a new order every epoch
            losses = []
            for batch in loader:
                params, loss = train_step(params, batch["image"], batch["label"])
                losses.append(float(loss))
            print(
                f"epoch {epoch}: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
                f"images {batch['image'].shape} on {batch['image'].sharding}"
            )
        loader.close()


if __name__ == "__main__":
    main()
