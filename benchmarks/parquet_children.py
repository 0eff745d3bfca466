"""The methods of ``parquet.py``, each in a process of its own, timed from its start
(``harness.py``).

    python benchmarks/parquet_children.py stoker URL COLUMNS     # COLUMNS: image,caption or -
    python benchmarks/parquet_children.py datasets URL ENDPOINT [reshard]
    python benchmarks/parquet_children.py pyarrow URL ENDPOINT
    python benchmarks/parquet_children.py --warm stoker|datasets|pyarrow

Every method reads one cold epoch of the ``image`` and ``caption`` columns, decodes each
image, crops it as ``RandomResizedCrop(224)`` with a random horizontal flip and delivers
batches of 256: uint8 images and the captions as strings.

- stoker: the Loader on its defaults (autotune on), ``SourceConfig(URL,
  columns=["image", "caption"])`` on the Parquet files in place, or the packed copy's URL
  with ``-``; stoker's own crop-aware decode; ``read_ahead`` off, so that the bytes counted
  are one epoch's.
- datasets: ``load_dataset("parquet", data_files=URL/*.parquet, split="train",
  streaming=True, columns=[...], storage_options=...)`` over s3fs, then what the
  ``datasets`` docs show for streaming into a torch DataLoader: the files as shards (at
  least as many as the workers), ``shuffle(seed=0, buffer_size=1000)`` (the default
  buffer; it also shuffles the shards), ``map`` of the PIL decode and crop,
  ``DataLoader(batch_size=256, num_workers=2)`` with the platform's default start method.
  With ``reshard``, ``reshard()`` first (a shard per row group: what the docs suggest for
  few files and better shuffling; here it reads each file's bytes several times over). The
  image column is read undecoded (``Image(decode=False)``) and opened with PIL in the map:
  the same work as the ``Image`` feature's decode and the crop after it.
- pyarrow: ``pyarrow.dataset.dataset(..., format="parquet", filesystem=S3FileSystem(
  endpoint_override=...))``, ``to_batches(columns=[...], batch_size=256,
  use_threads=True)`` with its default read-ahead, rows re-batched to 256, each image
  decoded and cropped with PIL in a thread pool of one thread per core, two batches in
  flight. No shuffle (a scan reads in file order).

The baselines' crop is torchvision's ``RandomResizedCrop`` algorithm (scale 0.08-1, ratio
3/4-4/3, ten tries, then a centre crop) in plain Python, then PIL's bilinear resize of the
box, as torchvision does with PIL images (torchvision does not load here); they import
neither stoker nor torchvision. A run prints one JSON line: samples (``units``),
``first_batch_at`` and ``ended_at`` (``time.time()``: the harness counts both from the
moment it started the process), the loop's seconds and rate, CPU seconds of this process,
peak RSS, and what the first batch held. The store's credentials come from the ``AWS_*``
variables.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # before any other import: the interpreter's start ends here

import io  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import default_start_method, emit, peak_rss_mb  # noqa: E402

BATCH = 256
SIZE = 224
COLUMNS = ["image", "caption"]
SHUFFLE_BUFFER = 1000  # IterableDataset.shuffle's default


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, list | tuple):
        inner = type(value[0]).__name__ if value else "empty"
        return f"list[{inner}]"
    return type(value).__name__


def _timed(batches: Any, count: Any, image: str, text: str) -> dict[str, Any]:
    """Iterate ``batches`` to their end: samples, the loop's seconds and rate (from its
    first ``next()``), the first and last batch's ``time.time()``, CPU, the first batch's
    fields (its ``image`` and ``text`` checked)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    first_at, seen, fields = 0.0, 0, {}
    for batch in batches:
        if not seen:
            first_at = time.time()
            fields = {name: _describe(value) for name, value in batch.items()}
            if tuple(batch[image].shape[1:]) != (SIZE, SIZE, 3):
                raise RuntimeError(f"images of shape {tuple(batch[image].shape)}")
            if not isinstance(batch[text][0], str):
                raise RuntimeError(f"captions of type {type(batch[text][0]).__name__}")
        seen += count(batch)
    ended_at = time.time()
    seconds = time.perf_counter() - started
    return {
        "samples": seen,
        "units": seen,
        "seconds": seconds,
        "cpu_s": time.process_time() - cpu_started,
        "samples_per_s": seen / seconds,
        "first_batch_at": first_at,
        "ended_at": ended_at,
        "fields": fields,
    }


# --- stoker ------------------------------------------------------------------------------


def run_stoker(url: str, columns: str) -> dict[str, Any]:
    """One cold epoch of the Loader on its defaults: the Parquet files in place with
    ``columns``, or (``-``) a packed dataset."""
    from stoker.pipeline.config import SourceConfig
    from stoker.pipeline.loader import Loader
    from stoker.pipeline.transforms import RandomResizedCrop

    imported_at = time.time()
    source: Any = url if columns == "-" else SourceConfig(url, columns=columns.split(","))
    transform = RandomResizedCrop(SIZE, flip=True)
    with Loader(source, batch_size=BATCH, transform=transform) as loader:
        loader.read_ahead = False  # one epoch is measured: its bytes, not the next one's
        opened_at = time.time()
        result = _timed(loader, lambda b: len(b["key"]), "image", "txt")
        stats = loader.stats()
        result.update(
            window=loader.order_config.windows,
            block_size=loader.order_config.blocks,
            group_blocks=loader.order_config.groups,
            own_bytes_read=stats.requests.get("bytes.read", 0),
            own_gets=stats.requests.get("requests.get", 0),
            threads=stats.threads,
            prefetch=stats.prefetch,
            autotune=stats.autotune,
            stages={name: [t.seconds, t.calls] for name, t in stats.stages.items()},
        )
    result.update(
        imported_at=imported_at,
        opened_at=opened_at,
        started_at=STARTED_AT,
        peak_rss_mb=peak_rss_mb(),
    )
    return result


# --- the baselines' decode and crop (PIL, no torchvision) ---------------------------------


def crop_box(width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``: (left, top, width, height)."""
    area = width * height
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    ratio = width / height
    if ratio < 3 / 4:
        w, h = width, round(width / (3 / 4))
    elif ratio > 4 / 3:
        w, h = round(height * (4 / 3)), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def pil_crop(data: bytes, rng: random.Random) -> Any:
    """Full PIL decode to RGB, the random crop resized to 224x224 (bilinear), a random
    horizontal flip: a writable uint8 array."""
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        rgb = image.convert("RGB")
    left, top, w, h = crop_box(rgb.width, rgb.height, rng)
    out = rgb.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.array(out)


# --- datasets -----------------------------------------------------------------------------


def _hf_map(example: dict[str, Any]) -> dict[str, Any]:
    """``datasets``' map: the image's bytes decoded and cropped, the caption kept."""
    image = example["image"]
    rng = random.Random(image["path"])
    return {"image": pil_crop(image["bytes"], rng), "caption": example["caption"]}


def s3fs_options(endpoint: str) -> dict[str, Any]:
    """s3fs's options for the bucket behind ``endpoint``."""
    return {
        "key": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {"endpoint_url": endpoint, "region_name": os.environ["AWS_REGION"]},
    }


def run_datasets(url: str, endpoint: str, reshard: bool = False) -> dict[str, Any]:
    """``datasets`` streaming the Parquet files into a DataLoader of two workers (with
    ``reshard``, a shard per row group)."""
    from datasets import Image, load_dataset
    from torch.utils.data import DataLoader

    imported_at = time.time()
    dataset = load_dataset(
        "parquet",
        data_files={"train": f"{url}/*.parquet"},
        split="train",
        streaming=True,
        columns=COLUMNS,
        storage_options=s3fs_options(endpoint),
    )
    dataset = dataset.cast_column("image", Image(decode=False))
    files = dataset.num_shards
    if reshard:
        dataset = dataset.reshard()
    dataset = dataset.shuffle(seed=0, buffer_size=SHUFFLE_BUFFER)
    dataset = dataset.map(_hf_map)
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=2)
    opened_at = time.time()
    result = _timed(loader, lambda b: len(b["caption"]), "image", "caption")
    result.update(
        imported_at=imported_at,
        opened_at=opened_at,
        started_at=STARTED_AT,
        shards=dataset.num_shards,
        files=files,
        shuffle_buffer=SHUFFLE_BUFFER,
        start_method=f"{default_start_method()} (the platform's default)",
        peak_rss_mb=peak_rss_mb(),  # the training process's; its workers are apart
    )
    return result


# --- pyarrow.dataset ----------------------------------------------------------------------


def _pyarrow_batches(scanner: Any, threads: int) -> Any:
    """The scan's rows in batches of 256, decoded and cropped in a pool of ``threads``,
    two batches in flight."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    rng = random.Random(0)

    def crop_into(out: Any, i: int, data: bytes, seed: int) -> None:
        out[i] = pil_crop(data, random.Random(seed))

    def rows() -> Any:
        chunk: list[tuple[bytes, str]] = []
        for record_batch in scanner:
            images = record_batch.column("image").field("bytes").to_pylist()
            captions = record_batch.column("caption").to_pylist()
            chunk.extend(zip(images, captions, strict=True))
            while len(chunk) >= BATCH:
                yield chunk[:BATCH]
                chunk = chunk[BATCH:]
        if chunk:
            yield chunk

    inflight: deque[tuple[Any, list[str], list[Any]]] = deque()
    with ThreadPoolExecutor(threads) as pool:
        for chunk in rows():
            out = np.empty((len(chunk), SIZE, SIZE, 3), dtype=np.uint8)
            jobs = [
                pool.submit(crop_into, out, i, data, rng.getrandbits(64))
                for i, (data, _) in enumerate(chunk)
            ]
            inflight.append((out, [caption for _, caption in chunk], jobs))
            if len(inflight) > 2:
                out, captions, jobs = inflight.popleft()
                for job in jobs:
                    job.result()
                yield {"image": out, "caption": captions}
        while inflight:
            out, captions, jobs = inflight.popleft()
            for job in jobs:
                job.result()
            yield {"image": out, "caption": captions}


def run_pyarrow(url: str, endpoint: str) -> dict[str, Any]:
    """``pyarrow.dataset`` scanning record batches of the two columns through its own S3
    filesystem, decoded and cropped in a thread pool."""
    import pyarrow.dataset as pads
    from pyarrow import fs

    imported_at = time.time()
    scheme, _, host = endpoint.partition("://")
    s3 = fs.S3FileSystem(
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        region=os.environ["AWS_REGION"],
        endpoint_override=host,
        scheme=scheme,
    )
    dataset = pads.dataset(url.removeprefix("s3://"), format="parquet", filesystem=s3)
    scanner = dataset.to_batches(columns=COLUMNS, batch_size=BATCH, use_threads=True)
    opened_at = time.time()
    threads = os.cpu_count() or 2
    result = _timed(
        _pyarrow_batches(scanner, threads), lambda b: len(b["caption"]), "image", "caption"
    )
    result.update(
        imported_at=imported_at,
        opened_at=opened_at,
        started_at=STARTED_AT,
        files=len(dataset.files),
        decode_threads=threads,
        peak_rss_mb=peak_rss_mb(),
    )
    return result


def warm(method: str) -> None:
    """Import what ``method`` imports (compiling it), and exit."""
    if method == "stoker":
        from stoker.pipeline.config import SourceConfig  # noqa: F401
        from stoker.pipeline.loader import Loader  # noqa: F401
        from stoker.pipeline.transforms import RandomResizedCrop  # noqa: F401
    elif method == "datasets":
        import s3fs  # noqa: F401
        from datasets import load_dataset  # noqa: F401
        from torch.utils.data import DataLoader  # noqa: F401
    else:
        import pyarrow.dataset  # noqa: F401
        from pyarrow import fs  # noqa: F401
    import numpy  # noqa: F401
    from PIL import Image  # noqa: F401


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "--warm":
        warm(args[0])
        return 0
    if command == "stoker":
        result = run_stoker(args[0], args[1])
    elif command == "datasets":
        result = run_datasets(args[0], args[1], args[2:3] == ["reshard"])
    elif command == "pyarrow":
        result = run_pyarrow(args[0], args[1])
    else:
        raise SystemExit(f"unknown command {command!r}")
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
