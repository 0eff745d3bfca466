"""The two photo sets of ``loader.py`` and ``autotune.py``: generated once (kept in
benchmarks/out/data), then uploaded, packed and (for tf.data) written as TFRecords into
the bucket of this run's server."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.transforms import PlannedTransform, RandomResizedCrop, Resize
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, upload
from stoker.testing.photos import write_photo_folder
from stoker.testing.seaweed import SeaweedServer

OUT = Path(__file__).resolve().parent / "out"
CHILDREN = Path(__file__).resolve().parent / "loader_children.py"
BUCKET = "bench-loader"
BATCH = 256
SHARD_BYTES = 32_000_000
SETS: dict[str, dict[str, Any]] = {
    "a": {
        "files": 20_000,
        "width": 500,
        "height": 375,
        "quality": 95,
        "grain": 8.0,
        "transform": "crop",
    },
    "b": {
        "files": 25_000,
        "width": 150,
        "height": 150,
        "quality": 90,
        "grain": 3.0,
        "transform": "resize",
    },
}
TRANSFORMS: dict[str, PlannedTransform] = {
    "crop": RandomResizedCrop(224, flip=True),
    "resize": Resize((224, 224), flip=True),
}


@dataclass(frozen=True)
class Prepared:
    """One set, in the bucket.

    Attributes:
        key: Its prefix in the bucket and its folder under benchmarks/out/data.
        source: The local photos (class folders).
        paths: The photos, sorted.
        mean_kb: Mean photo size.
        raw_bytes: Bytes of all photos.
        shard_bytes: Bytes of the packed tar shards (``key/shards/shard-*``).
        tfrecord_bytes: Bytes of the TFRecord shards (``key/tfrecord/``), 0 if not written.
        transform: ``"crop"`` or ``"resize"`` (a key of ``TRANSFORMS``).
    """

    key: str
    source: Path
    paths: list[Path]
    mean_kb: float
    raw_bytes: int
    shard_bytes: int
    tfrecord_bytes: int
    transform: str

    @property
    def files(self) -> int:
        return len(self.paths)


def _generated(key: str, spec: dict[str, Any], files: int) -> Path:
    source = OUT / "data" / key
    marker = source / f".complete-{files}"
    if not marker.exists():
        shutil.rmtree(source, ignore_errors=True)
        print(f"[{key}] generating {files} photos", flush=True)
        write_photo_folder(
            source,
            files=files,
            width=spec["width"],
            height=spec["height"],
            quality=spec["quality"],
            grain=spec["grain"],
        )
        marker.touch()
    return source


def _tfrecords(key: str, source: Path, files: int) -> Path:
    """The set as TFRecord shards of about the tar shards' size (written once, kept)."""
    dest = OUT / "data" / f"{key}-tfrecord"
    marker = dest / f".complete-{files}"
    if not marker.exists():
        shutil.rmtree(dest, ignore_errors=True)
        print(f"[{key}] writing TFRecords", flush=True)
        command = ["write-tfrecords", str(source), str(dest), str(SHARD_BYTES)]
        subprocess.run([sys.executable, str(CHILDREN), *command], check=True)
        marker.touch()
    return dest


def prepare_set(
    name: str, server: SeaweedServer, *, files: int | None = None, tfrecords: bool = False
) -> Prepared:
    """Generate set ``name`` (once), upload it and pack it; with ``tfrecords``, write and
    upload its TFRecord shards too. ``files`` other than the set's own count makes a
    smaller (or larger) set, kept apart (``a-1500``)."""
    spec = SETS[name]
    count = files or spec["files"]
    key = name if count == spec["files"] else f"{name}-{count}"
    source = _generated(key, spec, count)
    paths = sorted(source.rglob("*.jpg"))
    raw_bytes = sum(p.stat().st_size for p in paths)
    direct = server.storage_options()
    upload(
        source,
        open_store(f"s3://{BUCKET}/{key}/raw", storage_options=direct),
        config=TransferConfig(workers=64, exclude=(".complete-*",)),
    )
    shards = f"s3://{BUCKET}/{key}/shards"
    pack(
        f"s3://{BUCKET}/{key}/raw",
        shards,
        storage_options=direct,
        config=PackConfig(max_shard_bytes=SHARD_BYTES),
    )
    store = open_store(shards, storage_options=direct)
    shard_bytes = sum(
        info.size for info in store.list("") if info.key.rpartition("/")[2].startswith("shard-")
    )
    tfrecord_bytes = 0
    if tfrecords:
        local = _tfrecords(key, source, count)
        upload(
            local,
            open_store(f"s3://{BUCKET}/{key}/tfrecord", storage_options=direct),
            config=TransferConfig(workers=16, exclude=(".complete-*",)),
        )
        tfrecord_bytes = sum(p.stat().st_size for p in local.glob("*.tfrecord"))
    mean_kb = raw_bytes / len(paths) / 1000
    print(f"[{key}] {len(paths)} photos, mean {mean_kb:.1f} kB, packed", flush=True)
    return Prepared(
        key=key,
        source=source,
        paths=paths,
        mean_kb=mean_kb,
        raw_bytes=raw_bytes,
        shard_bytes=shard_bytes,
        tfrecord_bytes=tfrecord_bytes,
        transform=spec["transform"],
    )
