"""The two systems of ``torch_epochs.py``, each in a process of its own (``harness.py``).

    python benchmarks/torch_epochs_children.py stoker URL TRANSFORM CACHE EPOCHS OPTIONS_JSON
    python benchmarks/torch_epochs_children.py webdataset URLS_FILE TRANSFORM CACHE EPOCHS

Each runs ``EPOCHS`` epochs with two persistent worker processes and a disk cache in
``CACHE``, prints an ``epoch`` event at the end of each (the harness reads the proxy's
counters then) and a result: images of all epochs, the first batch and the last one
(``time.time()``), the start method of its workers, and per epoch its first batch's wait
(from ``iter()``), steady batch interval, images/s and, for stoker, the bytes its workers
read from the disk cache.

- stoker: ``TorchLoader(num_workers=2, cache=CacheConfig(dir=CACHE))`` on its defaults
  (its workers start with ``spawn``, TorchLoader's default), as the benchmark always ran it;
- WebDataset: ``DataLoader(wds.WebDataset(urls, cache_dir=CACHE).shuffle(1000).map(...)
  .batched(256), batch_size=None, num_workers=2, persistent_workers=True)`` over presigned
  URLs of the same shards, its workers started with the platform's default method (fork
  on Linux).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import default_start_method, emit, event, peak_rss_mb

BATCH = 256
WORKERS = 2


def _transform(kind: str) -> Any:
    from stoker.pipeline.transforms import RandomResizedCrop, Resize

    return RandomResizedCrop(224, flip=True) if kind == "crop" else Resize((224, 224), flip=True)


def _epochs(
    loader: Iterable[Any],
    epochs: int,
    set_epoch: Callable[[int], None],
    cache_bytes: Callable[[], int | None],
) -> list[dict[str, Any]]:
    out = []
    for epoch in range(epochs):
        set_epoch(epoch)
        hit = cache_bytes()
        started = time.time()
        arrivals: list[float] = []
        images = 0
        for batch in loader:
            arrivals.append(time.time())
            images += len(batch["label"]) if isinstance(batch, dict) else len(batch[1])
        ended = time.time()
        after = cache_bytes()
        # Workers hand over batches in bursts (each has some ready): the steady interval
        # is the mean time per batch after the first, not the median gap between two.
        steady = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) if len(arrivals) > 1 else 0.0
        row = {
            "epoch": epoch + 1,
            "images": images,
            "batches": len(arrivals),
            "iter_at": started,
            "first_at": arrivals[0] if arrivals else ended,
            "last_at": ended,
            "seconds": ended - started,
            "images_per_s": images / (ended - started),
            "first_batch_s": (arrivals[0] if arrivals else ended) - started,
            "steady_interval_s": steady,
            "cache_bytes": None if after is None or hit is None else after - hit,
        }
        event("epoch", epoch=epoch + 1)
        out.append(row)
    return out


def _result(rows: list[dict[str, Any]], start_method: str) -> dict[str, Any]:
    units = sum(r["images"] for r in rows)
    return {
        "units": units,
        "first_batch_at": rows[0]["first_at"],
        "ended_at": rows[-1]["last_at"],
        "images_per_s": units / (rows[-1]["last_at"] - rows[0]["iter_at"]),
        "epochs": rows,
        "start_method": start_method,
        "peak_rss_mb": peak_rss_mb(),
    }


def run_stoker(
    url: str, kind: str, cache: str, epochs: int, options: dict[str, Any]
) -> dict[str, Any]:
    from stoker.integrations.torch import TorchLoader
    from stoker.pipeline.config import CacheConfig

    with TorchLoader(
        url,
        batch_size=BATCH,
        num_workers=WORKERS,
        transform=_transform(kind),
        cache=CacheConfig(dir=cache),
        storage_options=options,
        seed=0,
    ) as loader:

        def hit() -> int:
            return int(loader.stats().disk_cache.get("cache.bytes_hit", 0))

        rows = _epochs(loader, epochs, loader.set_epoch, hit)
        start_method = str(loader.multiprocessing_context)
    return _result(rows, f"{start_method} (TorchLoader's default)")


def run_webdataset(urls_file: str, kind: str, cache: str, epochs: int) -> dict[str, Any]:
    import webdataset as wds
    from torch.utils.data import DataLoader

    from loader_baselines import WdsMap

    Path(cache).mkdir(parents=True, exist_ok=True)
    urls = json.loads(Path(urls_file).read_text())
    pipeline = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False, cache_dir=cache)
        .shuffle(1000)
        .map(WdsMap(_transform(kind)))
        .batched(BATCH)
    )
    # No multiprocessing_context: the platform's default, as a user's DataLoader gets.
    loader = DataLoader(pipeline, batch_size=None, num_workers=WORKERS, persistent_workers=True)
    rows = _epochs(loader, epochs, lambda _epoch: None, lambda: None)
    del loader  # its workers stop
    return _result(rows, f"{default_start_method()} (the platform's default)")


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "stoker":
        result = run_stoker(args[0], args[1], args[2], int(args[3]), json.loads(args[4]))
    elif command == "webdataset":
        result = run_webdataset(args[0], args[1], args[2], int(args[3]))
    else:
        raise SystemExit(f"unknown command {command!r}")
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
