"""Run by test_torch_small_shm.py in a private mount namespace: read a dataset through
DataLoader workers with a 64 MiB tmpfs mounted over /dev/shm (Docker's default size).

Usage: python small_shm_child.py URL MODE SIZE, where MODE is ``torch_loader``
(``TorchLoader(num_workers=2)``) or ``data_loader`` (a ``StokerIterableDataset`` in a plain
``DataLoader(num_workers=2)``) and SIZE the tmpfs size ("64m"). Prints one JSON object: the
sample indices delivered, or what the iteration raised. Exit status 3 means the tmpfs could
not be mounted. The mount lives only as long as this process's namespace.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from typing import Any

from torch.utils.data import DataLoader

from stoker.integrations.torch import StokerIterableDataset, TorchLoader
from stoker.pipeline.transforms import RandomResizedCrop

#: 256 images of 224 x 224 x 3: 36.8 MiB a batch, as in the README's example.
BATCH_SIZE = 256


def _mount(size: str) -> None:
    mount = shutil.which("mount") or "/bin/mount"
    result = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size}", "tmpfs", "/dev/shm"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        print(f"mount: {result.stderr.strip()}", file=sys.stderr)
        sys.exit(3)


def _indices(batches: Any) -> list[int]:
    return [int(i) for batch in batches for i in batch["index"]]


def main() -> None:
    url, mode, size = sys.argv[1:4]
    _mount(size)
    logging.basicConfig(level=logging.WARNING)
    options: dict[str, Any] = {"batch_size": BATCH_SIZE, "transform": RandomResizedCrop(224)}
    try:
        if mode == "torch_loader":
            with TorchLoader(url, num_workers=2, **options) as loader:
                indices = _indices(loader)
        else:
            dataset = StokerIterableDataset(url, **options)
            indices = _indices(DataLoader(dataset, batch_size=None, num_workers=2))
    except Exception as exc:  # reported to the test, which says what it expected
        print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
        return
    print(json.dumps({"indices": indices}))


if __name__ == "__main__":
    main()
