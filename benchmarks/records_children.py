"""The methods of ``records.py`` that read a bucket, each in a process of its own, timed
from its start (``harness.py``): stoker's Loader over records of any fields, and
WebDataset in a torch DataLoader.

    python benchmarks/records_children.py URL TRANSFORM SAMPLES
    python benchmarks/records_children.py webdataset URLS_FILE SAMPLES
    python benchmarks/records_children.py --warm     # import what a run imports, and exit

WebDataset: the tars over presigned URLs, ``shuffle(1000)``, PIL decode with the same crop
and resize as ``loader.py``'s WebDataset row, the caption decoded, the JSON parsed,
``batched(256)``, ``DataLoader(num_workers=2)`` with the platform's default start method.

``TRANSFORM`` is ``crop`` (RandomResizedCrop(224)) or ``none``; ``SAMPLES`` 0 is one whole
epoch. The Loader runs on its defaults, every field of every sample in the batch (images
through the transform, ``txt`` as str, ``json`` parsed, ``npy`` stacked). It prints one JSON
line: samples, seconds (from the first ``next()`` to the last batch), samples/s,
``first_batch_at`` (``time.time()`` of the first batch: the parent subtracts the moment it
started the process; ``imported_at`` and ``opened_at`` split it), the order's window and
block sizes, peak RSS, CPU seconds, the fields of the first batch, what the loader
counted of its own reads and its stage times; ``started_at``, taken before anything else is
imported, splits the interpreter's start from the imports. The store comes from the
``AWS_*`` variables. Only stoker is imported, so the first batch counts what a user's
process would import.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # before any other import: the interpreter's start ends here

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import default_start_method, emit, peak_rss_mb  # noqa: E402

BATCH = 256
SIZE = 224


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, list):
        inner = type(value[0]).__name__ if value else "empty"
        return f"list[{inner}]"
    return type(value).__name__


def run(url: str, transform_kind: str, samples: int) -> dict[str, Any]:
    """One cold epoch (or ``samples`` of it) of the Loader on its defaults."""
    from stoker.pipeline.loader import Loader
    from stoker.pipeline.transforms import RandomResizedCrop

    imported_at = time.time()
    transform = RandomResizedCrop(SIZE) if transform_kind == "crop" else None
    with Loader(url, batch_size=BATCH, transform=transform) as loader:
        loader.read_ahead = False  # one epoch is measured: its bytes, not the next one's
        opened_at = time.time()
        started, cpu_started = time.perf_counter(), time.process_time()
        first_at, seen, fields = 0.0, 0, {}
        for batch in loader:
            if not seen:
                first_at = time.time()
                fields = {name: _describe(value) for name, value in batch.items()}
            seen += len(batch["key"])
            if samples and seen >= samples:
                break
        ended_at = time.time()
        seconds = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        stats = loader.stats()
    return {
        "samples": seen,
        "units": seen,
        "ended_at": ended_at,
        "seconds": seconds,
        "cpu_s": cpu_s,
        "samples_per_s": seen / seconds,
        "first_batch_at": first_at,
        "imported_at": imported_at,
        "opened_at": opened_at,
        "started_at": STARTED_AT,
        "window": loader.order_config.windows,
        "block_size": loader.order_config.blocks,
        "group_blocks": loader.order_config.groups,
        "peak_rss_mb": peak_rss_mb(),
        "fields": fields,
        "own_bytes_read": stats.requests.get("bytes.read", 0),
        "own_gets": stats.requests.get("requests.get", 0),
        "threads": stats.threads,
        "prefetch": stats.prefetch,
        "stages": {name: [t.seconds, t.calls] for name, t in stats.stages.items()},
    }


class WdsRecords:
    """WebDataset's per-sample work on a pair: PIL decode, crop and resize (as
    ``loader.py``'s WebDataset row), the caption as str, the JSON parsed."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, str, Any]:
        import random

        from loader_baselines import pil_transform

        image = pil_transform(sample["jpg"], random.Random(sample["__key__"]), self.transform)
        return image, sample["txt"].decode("utf-8"), json.loads(sample["json"])


def run_webdataset(urls_file: str, samples: int) -> dict[str, Any]:
    """The pairs through WebDataset in a DataLoader of 2 workers, every field decoded."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    from loader_baselines import time_loader
    from stoker.pipeline.transforms import RandomResizedCrop

    urls = json.loads(Path(urls_file).read_text())
    pipeline = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .shuffle(1000)
        .map(WdsRecords(RandomResizedCrop(SIZE)))
        .batched(BATCH)
    )
    loader = DataLoader(pipeline, batch_size=None, num_workers=2)
    timed = time_loader(loader, samples or 1 << 62)
    return {
        "samples": timed["images"],
        "units": timed["images"],
        "seconds": timed["seconds"],
        "samples_per_s": timed["images_per_s"],
        "first_batch_at": timed["first_batch_at"],
        "ended_at": timed["ended_at"],
        "start_method": f"{default_start_method()} (the platform's default)",
    }


def main(argv: list[str]) -> int:
    if argv == ["--warm"]:
        import webdataset  # noqa: F401
        from torch.utils.data import DataLoader  # noqa: F401

        import loader_baselines  # noqa: F401
        from stoker.pipeline.loader import Loader  # noqa: F401
        from stoker.pipeline.transforms import RandomResizedCrop  # noqa: F401

        return 0
    if argv[0] == "webdataset":
        result = run_webdataset(argv[1], int(argv[2]))
    else:
        result = run(argv[0], argv[1], int(argv[2]))
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
