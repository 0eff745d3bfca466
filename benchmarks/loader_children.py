"""The methods of ``loader.py``, each in a process of its own, timed from its start
(``harness.py``).

    python benchmarks/loader_children.py stoker URL TRANSFORM IMAGES [CACHE_DIR]
    python benchmarks/loader_children.py tfdata BUCKET PREFIX DIR TRANSFORM IMAGES
    python benchmarks/loader_children.py per-object ENDPOINT BUCKET KEYS_FILE TRANSFORM IMAGES
    python benchmarks/loader_children.py download-folder URL DIR TRANSFORM IMAGES OPTIONS_JSON
    python benchmarks/loader_children.py webdataset URLS_FILE TRANSFORM IMAGES
    python benchmarks/loader_children.py write-tfrecords SOURCE DEST SHARD_BYTES

``TRANSFORM`` is ``crop`` (RandomResizedCrop(224) + flip) or ``resize`` (Resize to 224x224
+ flip); ``IMAGES`` 0 is one whole epoch. A run prints one JSON line: images (``units``),
seconds (from the first ``next()`` to the last batch), images/s over those,
``first_batch_at`` and ``ended_at`` (``time.time()`` of the first and the last batch: the
harness counts both from the moment it started the process), peak RSS, and what the
process counted of its own reads. The store comes from the ``AWS_*`` variables. The torch
DataLoader baselines (one GET per image; download then a folder; WebDataset) run with
``num_workers=2`` and the platform's default start method (fork on Linux); each imports
only what it uses.

tf.data is written as TensorFlow's data performance guide writes an input pipeline: the
TFRecord shards downloaded to local disk in parallel first (boto3, 16 at once), then
files shuffled, ``interleave`` of ``TFRecordDataset``, a shuffle buffer, ``map`` of
parse + ``sample_distorted_bounding_box`` + ``decode_and_crop_jpeg`` (or decode + resize),
``tf.image.resize`` to 224x224, random flip, with ``num_parallel_calls=AUTOTUNE``, batches
of 256, ``prefetch(AUTOTUNE)``. Images are cast to uint8, as stoker delivers them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import default_start_method, emit, peak_rss_mb

BATCH = 256
SIZE = 224


def _transform(kind: str) -> Any:
    from stoker.pipeline.transforms import RandomResizedCrop, Resize

    return RandomResizedCrop(SIZE, flip=True) if kind == "crop" else Resize((SIZE, SIZE), flip=True)


def run_stoker(
    url: str, transform_kind: str, images: int, cache_dir: str | None = None
) -> dict[str, Any]:
    """stoker's Loader on its defaults (autotune on), cold; with ``cache_dir``, a disk
    cache there, and the second epoch timed (read from the cache, as tf.data's epoch reads
    the disk it downloaded to)."""
    from stoker.pipeline.config import CacheConfig
    from stoker.pipeline.loader import Loader

    transform = _transform(transform_kind)
    cache = CacheConfig(dir=cache_dir) if cache_dir else None
    with Loader(url, batch_size=BATCH, transform=transform, cache=cache) as loader:
        # One cold epoch is measured: its bytes, not the next epoch's read ahead at its end.
        # From the cache, epochs run back to back, so each reads its successor's start.
        loader.read_ahead = bool(cache_dir)
        first_epoch_s = 0.0
        if cache_dir:
            started = time.perf_counter()
            for _ in loader:
                pass
            first_epoch_s = time.perf_counter() - started
        before = loader.stats().requests
        started, cpu_started = time.perf_counter(), time.process_time()
        first_at, seen = 0.0, 0
        for batch in loader:
            if not seen:
                first_at = time.time()
            seen += len(batch["label"])
            if images and seen >= images:
                break
        ended_at = time.time()
        seconds = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        stats = loader.stats()
    if cache_dir:  # what the timed epoch itself read from the store
        stats.requests = {k: v - before.get(k, 0) for k, v in stats.requests.items()}
    return {
        "first_epoch_s": first_epoch_s,
        "images": seen,
        "seconds": seconds,
        "cpu_s": cpu_s,
        "images_per_s": seen / seconds,
        "units": seen,
        "first_batch_at": first_at,
        "ended_at": ended_at,
        "peak_rss_mb": peak_rss_mb(),
        "own_bytes_read": stats.requests.get("bytes.read", 0),
        "own_gets": stats.requests.get("requests.get", 0),
        "threads": stats.threads,
        "prefetch": stats.prefetch,
        "autotune": stats.autotune,
    }


def _s3() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", config=Config(s3={"addressing_style": "path"}, max_pool_connections=32)
    )


def download_parallel(bucket: str, prefix: str, local: Path) -> list[Path]:
    """Every object under ``prefix`` to ``local``, 16 at once (boto3's own ranged parts)."""
    from concurrent.futures import ThreadPoolExecutor

    client = _s3()
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    ]
    local.mkdir(parents=True, exist_ok=True)
    paths = [local / key.rpartition("/")[2] for key in keys]
    with ThreadPoolExecutor(16) as pool:
        jobs = zip(keys, paths, strict=True)
        list(pool.map(lambda job: client.download_file(bucket, job[0], str(job[1])), jobs))
    return paths


def run_tfdata(
    bucket: str, prefix: str, local: Path, transform_kind: str, images: int
) -> dict[str, Any]:
    """Download the TFRecord shards, then the guide's tf.data pipeline over them."""
    import tensorflow as tf

    started_download = time.perf_counter()
    files = download_parallel(bucket, prefix, local)
    download_s = time.perf_counter() - started_download
    autotune = tf.data.AUTOTUNE
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    whole = tf.constant([0.0, 0.0, 1.0, 1.0], dtype=tf.float32, shape=[1, 1, 4])

    def crop(encoded: Any) -> Any:
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(encoded),
            bounding_boxes=whole,
            area_range=(0.08, 1.0),
            aspect_ratio_range=(3 / 4, 4 / 3),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size)
        return tf.image.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=3)

    def parse(record: Any) -> Any:
        example = tf.io.parse_single_example(record, features)
        if transform_kind == "crop":
            image = crop(example["image"])
        else:
            image = tf.io.decode_jpeg(example["image"], channels=3)
        image = tf.image.resize(image, [SIZE, SIZE])
        image = tf.image.random_flip_left_right(image)
        return tf.cast(tf.clip_by_value(image, 0.0, 255.0), tf.uint8), example["label"]

    dataset = (
        tf.data.Dataset.from_tensor_slices([str(f) for f in files])
        .shuffle(len(files))
        .interleave(
            tf.data.TFRecordDataset,
            num_parallel_calls=autotune,
            deterministic=False,
        )
        .shuffle(1024)
        .map(parse, num_parallel_calls=autotune, deterministic=False)
        .batch(BATCH)
        .prefetch(autotune)
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    first_at, seen = 0.0, 0
    for batch, _labels in dataset:
        if not seen:
            first_at = time.time()
        seen += int(batch.shape[0])
        if images and seen >= images:
            break
    ended_at = time.time()
    seconds = time.perf_counter() - started
    return {
        "images": seen,
        "units": seen,
        "seconds": seconds,
        "cpu_s": time.process_time() - cpu_started,
        "images_per_s": seen / seconds,
        "first_batch_at": first_at,
        "ended_at": ended_at,
        "download_s": download_s,
        "peak_rss_mb": peak_rss_mb(),
    }


def _data_loader(dataset: Any, images: int, **more: Any) -> dict[str, Any]:
    """``DataLoader(dataset, num_workers=2)`` with the platform's default start method,
    timed to ``images`` (0: the whole dataset)."""
    from torch.utils.data import DataLoader

    from loader_baselines import time_loader

    loader = DataLoader(dataset, num_workers=2, **more)
    cpu_started = time.process_time()
    result = time_loader(loader, images or 1 << 62)
    result.update(
        units=result["images"],
        cpu_s=time.process_time() - cpu_started,  # the training process's share only
        start_method=f"{default_start_method()} (the platform's default)",
        peak_rss_mb=peak_rss_mb(),
    )
    return result


def run_per_object(
    endpoint: str, bucket: str, keys_file: str, kind: str, images: int
) -> dict[str, Any]:
    """One boto3 GET per image in a DataLoader's workers (only the timed images listed)."""
    from loader_baselines import PerObject

    keys = json.loads(Path(keys_file).read_text())
    return _data_loader(
        PerObject(endpoint, bucket, keys, _transform(kind)), images, batch_size=BATCH
    )


def run_download_folder(
    url: str, local: str, kind: str, images: int, options: dict[str, Any]
) -> dict[str, Any]:
    """``stoker download`` of the originals, then a DataLoader reading the local files."""
    import random

    from loader_baselines import LocalFiles
    from stoker.storage import open_store
    from stoker.storage.transfer import download

    started = time.perf_counter()
    download(open_store(url, storage_options=options), Path(local))
    download_s = time.perf_counter() - started
    paths = sorted(Path(local).rglob("*.jpg"))
    random.Random(0).shuffle(paths)
    result = _data_loader(LocalFiles(paths, _transform(kind)), images, batch_size=BATCH)
    result["download_s"] = download_s
    return result


def run_webdataset(urls_file: str, kind: str, images: int) -> dict[str, Any]:
    """WebDataset over presigned URLs of the shards, ``shuffle(1000)``, PIL decode."""
    import webdataset as wds

    from loader_baselines import WdsMap

    urls = json.loads(Path(urls_file).read_text())
    pipeline = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .shuffle(1000)
        .map(WdsMap(_transform(kind)))
        .batched(BATCH)
    )
    return _data_loader(pipeline, images, batch_size=None)


def write_tfrecords(source: Path, dest: Path, shard_bytes: int) -> None:
    """The JPEGs of class folders under ``source`` as TFRecord shards of about
    ``shard_bytes`` (``tf.train.Example`` with ``image`` and ``label``), in ``dest``."""
    import tensorflow as tf

    dest.mkdir(parents=True, exist_ok=True)
    classes = sorted(p.name for p in source.iterdir() if p.is_dir())
    shard, written, writer = 0, 0, None
    for label, name in enumerate(classes):
        for path in sorted((source / name).glob("*.jpg")):
            if writer is None or written >= shard_bytes:
                if writer is not None:
                    writer.close()
                writer = tf.io.TFRecordWriter(str(dest / f"shard-{shard:06d}.tfrecord"))
                shard, written = shard + 1, 0
            data = path.read_bytes()
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    }
                )
            )
            writer.write(example.SerializeToString())
            written += len(data)
    if writer is not None:
        writer.close()


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "stoker":
        result = run_stoker(args[0], args[1], int(args[2]), *args[3:4])
    elif command == "tfdata":
        result = run_tfdata(args[0], args[1], Path(args[2]), args[3], int(args[4]))
    elif command == "per-object":
        result = run_per_object(args[0], args[1], args[2], args[3], int(args[4]))
    elif command == "download-folder":
        result = run_download_folder(args[0], args[1], args[2], int(args[3]), json.loads(args[4]))
    elif command == "webdataset":
        result = run_webdataset(args[0], args[1], int(args[2]))
    elif command == "write-tfrecords":
        write_tfrecords(Path(args[0]), Path(args[1]), int(args[2]))
        return 0
    else:
        raise SystemExit(f"unknown command {command!r}")
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
