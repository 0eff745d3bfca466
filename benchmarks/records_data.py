"""The record sets of ``records.py``: WebDataset tars written once by webdataset's own
``TarWriter`` (kept in benchmarks/out/data), then uploaded into the bucket of this run's
server, indexed in place and packed.

- pairs: image-caption-JSON records (``jpg``, ``txt``, ``json``), the photos of
  ``loader_sets``' set a (500x375, ~100 kB, from scikit-image's sample photos);
- arrays: ``npy`` records of 10,000 float32 (40 kB) with a ``cls`` label.
"""

from __future__ import annotations

import random
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import webdataset as wds

from loader_sets import SETS, SHARD_BYTES
from stoker.pack.indexer import index_webdataset
from stoker.pack.packer import PackConfig, pack
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, upload
from stoker.testing.photos import make_photo, source_photos
from stoker.testing.seaweed import SeaweedServer

OUT = Path(__file__).resolve().parent / "out"
BUCKET = "bench-records"
ARRAY_VALUES = 10_000  # float32: 40,000 bytes of data a record
CAPTION_WORDS = (
    "a photo of the small red large blue old young dog cat bird car house tree street river "
    "mountain beach city night sunset morning people child woman man standing sitting on in "
    "near with under over next to field garden window kitchen table plate food coffee cup "
    "bicycle motorcycle rocket sky star cloud snow rain forest lake boat bridge road sign "
    "green yellow white black wooden stone metal glass two three many close-up view from"
)
WORDS = CAPTION_WORDS.split()


def _caption(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))).capitalize() + "."


def _pair(photos: list[Any], i: int) -> dict[str, Any]:
    spec = SETS["a"]
    rng = random.Random(i)
    jpg = make_photo(
        photos,
        rng,
        width=spec["width"],
        height=spec["height"],
        quality=spec["quality"],
        grain=spec["grain"],
    )
    caption = _caption(rng)
    meta = {
        "key": f"{i:07d}",
        "url": f"https://images.example.com/{rng.getrandbits(48):012x}.jpg",
        "width": spec["width"],
        "height": spec["height"],
        "similarity": round(rng.uniform(0.25, 0.45), 4),
        "punsafe": round(rng.random() * 0.1, 5),
        "tags": rng.sample(WORDS, rng.randint(0, 6)),
        "caption_words": caption.count(" ") + 1,
    }
    return {"__key__": f"{i:07d}", "jpg": jpg, "txt": caption, "json": meta}


def _array(i: int) -> dict[str, Any]:
    values = np.random.default_rng(i).standard_normal(ARRAY_VALUES, dtype=np.float32)
    return {"__key__": f"{i:07d}", "npy": values, "cls": i % 100}


def _write_tars(dest: Path, name: str, count: int) -> None:
    """``count`` records as tars of about SHARD_BYTES, with webdataset's own TarWriter."""
    dest.mkdir(parents=True, exist_ok=True)
    photos = source_photos(max_side=4096) if name == "pairs" else []

    def make(i: int) -> dict[str, Any]:
        return _pair(photos, i) if name == "pairs" else _array(i)

    shard, written = 0, 0
    sink = wds.TarWriter(str(dest / f"{name}-{shard:06d}.tar"))
    with ThreadPoolExecutor(4) as pool:
        for record in pool.map(make, range(count)):
            if written >= SHARD_BYTES:
                sink.close()
                shard, written = shard + 1, 0
                sink = wds.TarWriter(str(dest / f"{name}-{shard:06d}.tar"))
            written += sink.write(record)
    sink.close()


@dataclass(frozen=True)
class RecordSet:
    """One set of tars, local and in the bucket (indexed in place in both), and the same
    records packed by stoker into the bucket.

    Attributes:
        name: ``"pairs"`` or ``"arrays"``.
        key: The tars' prefix in the bucket and their folder under benchmarks/out/data.
        local: That folder.
        count: Records.
        shard_bytes: Bytes of the tars.
        packed_bytes: Bytes of the packed shards (``packed/<key>/shard-*``).
    """

    name: str
    key: str
    local: Path
    count: int
    shard_bytes: int
    packed_bytes: int

    @property
    def url(self) -> str:
        return f"s3://{BUCKET}/{self.key}"

    @property
    def packed_url(self) -> str:
        return f"s3://{BUCKET}/packed/{self.key}"


def prepare(name: str, count: int, server: SeaweedServer) -> RecordSet:
    """Write the set's tars (once, kept in benchmarks/out/data), upload them and index them
    in place; pack the same tars into the bucket (``stoker.pack``: every field, in a seeded
    random order)."""
    key = f"records-{name}-{count}"
    local = OUT / "data" / key
    marker = local / ".complete"
    if not marker.exists():
        print(f"[{name}] writing {count} records", flush=True)
        started = time.perf_counter()
        _write_tars(local, name, count)
        index_webdataset(local)
        marker.touch()
        print(f"[{name}] written in {time.perf_counter() - started:.0f} s", flush=True)
    direct = server.storage_options()
    upload(
        local,
        open_store(f"s3://{BUCKET}/{key}", storage_options=direct),
        config=TransferConfig(workers=16, include=("*.tar",)),
    )
    started = time.perf_counter()
    indexed = index_webdataset(f"s3://{BUCKET}/{key}", storage_options=direct)
    indexed_s = time.perf_counter() - started
    shard_bytes = sum(p.stat().st_size for p in local.glob("*.tar"))
    started = time.perf_counter()
    packed = f"s3://{BUCKET}/packed/{key}"
    # From the local tars: from the bucket, pack read every sample with a GET of its own
    # (10,063 GETs, 881 MB for the 440 MB of 10,000 arrays: 94 s against 11 s).
    pack(
        local,
        packed,
        source_format="webdataset",
        storage_options=direct,
        config=PackConfig(max_shard_bytes=SHARD_BYTES),
    )
    store = open_store(packed, storage_options=direct)
    packed_bytes = sum(
        info.size for info in store.list("") if info.key.rpartition("/")[2].startswith("shard-")
    )
    print(
        f"[{name}] {indexed.samples} records in {indexed.shards} tars, "
        f"{shard_bytes / 1e6:,.0f} MB, indexed in place in {indexed_s:.1f} s, packed in "
        f"{time.perf_counter() - started:.1f} s ({packed_bytes / 1e6:,.0f} MB)",
        flush=True,
    )
    return RecordSet(name, key, local, count, shard_bytes, packed_bytes)


def in_ram_members(local: Path) -> list[tuple[bytes, bytes]]:
    """The (npy, cls) members of every record of the local tars, in RAM."""
    records: dict[str, dict[str, bytes]] = {}
    for path in sorted(local.glob("*.tar")):
        with tarfile.open(path) as tar:
            for member in tar:
                stem, _, ext = member.name.partition(".")
                file = tar.extractfile(member)
                if file is not None:
                    records.setdefault(stem, {})[ext] = file.read()
    return [(r["npy"], r["cls"]) for r in records.values()]
