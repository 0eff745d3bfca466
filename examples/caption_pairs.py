"""Image-caption pairs from a bucket into a toy CLIP-like model, on the CPU.

The pairs start as files grouped by name (``0001.jpg`` beside ``0001.txt``: the WebDataset
layout before tarring), are packed into shards, and stream back with every field: the
batches carry the images and their captions as a list of strings. A small image encoder
and a bag-of-words text encoder learn to match them with a contrastive (InfoNCE) loss.

Runs as is against a throwaway SeaweedFS server (needs `pip install 'stoker[demo,torch]'`):

    python examples/caption_pairs.py
"""

from __future__ import annotations

import io
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import stoker
from stoker.integrations.torch import TorchLoader
from stoker.testing.seaweed import SeaweedServer

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (40, 60, 220),
    "yellow": (230, 220, 50),
}
SHAPES = ("square", "stripe")
VOCABULARY = 64


def write_pairs(folder: Path, count: int) -> None:
    """``count`` coloured pictures, each with a caption saying what it shows."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    names = list(COLOURS)
    for i in range(count):
        colour, shape = names[i % len(names)], SHAPES[(i // len(names)) % len(SHAPES)]
        pixels = rng.integers(0, 40, (48, 48, 3)).astype(np.uint8)
        if shape == "square":
            pixels[12:36, 12:36] = COLOURS[colour]
        else:
            pixels[20:28, :] = COLOURS[colour]
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG", quality=90)
        (folder / f"{i:04d}.jpg").write_bytes(out.getvalue())
        (folder / f"{i:04d}.txt").write_text(f"a {colour} {shape} on a dark ground")


def tokens(captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Word ids (hashed into a small vocabulary) and offsets, for ``nn.EmbeddingBag``."""
    ids, offsets = [], []
    for caption in captions:
        offsets.append(len(ids))
        ids += [zlib.crc32(word.encode()) % VOCABULARY for word in caption.split()]
    return torch.tensor(ids), torch.tensor(offsets)


class ToyClip(torch.nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.image = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Linear(16 * 16, width),
        )
        self.text = torch.nn.EmbeddingBag(VOCABULARY, width)
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
        pixels = images.permute(0, 3, 1, 2).float() / 255
        image = torch.nn.functional.normalize(self.image(pixels), dim=1)
        text = torch.nn.functional.normalize(self.text(*tokens(captions)), dim=1)
        logits = self.scale.exp() * image @ text.T
        target = torch.arange(len(captions))
        return (
            torch.nn.functional.cross_entropy(logits, target)
            + torch.nn.functional.cross_entropy(logits.T, target)
        ) / 2


def main() -> None:
    with SeaweedServer() as server, tempfile.TemporaryDirectory() as scratch:
        server.create_bucket("example")
        options = server.storage_options()
        write_pairs(Path(scratch, "pairs"), 256)
        report = stoker.pack(Path(scratch, "pairs"), "s3://example/pairs", storage_options=options)
        print(f"packed {report.samples} image-caption pairs ({report.source_format})")

        model = ToyClip()
        optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
        loader = TorchLoader(
            "s3://example/pairs",
            batch_size=32,
            transform=stoker.transforms.RandomResizedCrop(32, scale=(0.7, 1.0)),
            storage_options=options,
        )
        for epoch in range(6):
            loader.set_epoch(epoch)
            losses = []
            for batch in loader:
                # Images are a uint8 tensor; captions a list of strings, one per image.
                loss = model(batch["image"], batch["txt"])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                losses.append(loss.item())
            print(f"epoch {epoch}: contrastive loss {np.mean(losses):.3f}")
        print("first batch's captions:", batch["txt"][:3])


if __name__ == "__main__":
    main()
