"""The Parquet files of ``parquet.py``: the photos of ``loader_sets``' set a with captions
and labels as image-caption rows in the Hugging Face layout, written once (kept in
benchmarks/out/data), uploaded into the bucket of this run's server and packed by stoker.

The layout is what ``datasets`` pushes to the Hub: ``data/train-0000N-of-0000M.parquet``,
an ``image`` column of ``{bytes, path}`` structs, a ``caption`` string and a ``label``
integer, the features (``Image``, ``Value``, ``ClassLabel``) in the schema's
``huggingface`` metadata. Files are cut as ``push_to_hub`` cuts them (``MAX_SHARD_SIZE``,
500 MB: one file more than the data's size over that; two at least here, so that both
DataLoader workers of the ``datasets`` row get a file without resharding). Row groups hold
``ROW_GROUP_ROWS`` rows: what the Hub's Parquet export (the dataset viewer's
``refs/convert/parquet``, huggingface/dataset-viewer#833) and earlier ``datasets``
releases (huggingface/datasets#5935, ``config.PARQUET_ROW_GROUP_SIZE_FOR_IMAGE_DATASETS =
100``) write for image datasets. ``datasets`` 5.x sets that constant to None and sizes row groups
to ~100 MB uncompressed, at most ``DEFAULT_MAX_BATCH_SIZE`` (1,000) rows: ~970 rows of
these photos; ``--row-group-rows`` writes that layout instead.

``datasets`` reads a bucket through s3fs, whose aiobotocore pins a botocore older than the
one boto3 needs in this project's environment; :func:`s3fs_path` installs s3fs, aiobotocore
and that botocore once into benchmarks/out/libs/s3fs (``pip install --target --no-deps``),
which only the ``datasets`` child puts on its ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from loader_sets import SETS, SHARD_BYTES, _generated
from records_data import WORDS
from stoker.pack.packer import PackConfig, pack
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, upload
from stoker.testing.seaweed import SeaweedServer

OUT = Path(__file__).resolve().parent / "out"
BUCKET = "bench-parquet"
#: Rows per row group (see the module docstring).
ROW_GROUP_ROWS = 100
#: ``datasets``' ``config.MAX_SHARD_SIZE``: the most bytes of one file of a push.
MAX_SHARD_BYTES = 500_000_000
#: The columns every method reads.
COLUMNS = ("image", "caption")
#: What :func:`s3fs_path` installs (the newest s3fs, and the botocore its aiobotocore takes).
S3FS_LIBS = ("s3fs==2026.9.0", "aiobotocore==3.10.0", "botocore==1.43.117")
LIBS = OUT / "libs" / "s3fs"


@dataclass(frozen=True)
class ParquetSet:
    """The rows, as Parquet files local and in the bucket, and packed by stoker.

    Attributes:
        key: Their prefix in the bucket and their folder under benchmarks/out/data.
        local: That folder (``data/train-*.parquet`` under it).
        rows: Rows.
        files: Parquet files.
        row_groups: Row groups, all files.
        file_bytes: Bytes of the files.
        column_bytes: Bytes of the chosen columns' chunks (``COLUMNS``), as the footers
            record them: what a reader of those columns has to fetch.
        footer_bytes: Bytes of the files' footers (and their 8-byte tails).
        packed_bytes: Bytes of the packed shards (``packed/<key>/shard-*``).
    """

    key: str
    local: Path
    rows: int
    files: int
    row_groups: int
    file_bytes: int
    column_bytes: int
    footer_bytes: int
    packed_bytes: int

    @property
    def url(self) -> str:
        """The files' folder in the bucket (``data/`` of the dataset's repository)."""
        return f"s3://{BUCKET}/{self.key}/data"

    @property
    def packed_url(self) -> str:
        return f"s3://{BUCKET}/packed/{self.key}"


def _caption(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))).capitalize() + "."


def _photos(rows: int) -> list[Path]:
    """``rows`` photos of set a, in the order they were made (classes interleaved): the
    first of the full set where it has been made (``loader.py`` keeps it), else a set of
    their own."""
    spec = SETS["a"]
    full = OUT / "data" / "a"
    if rows <= spec["files"] and (full / f".complete-{spec['files']}").exists():
        source = full
    else:
        source = _generated("a" if rows == spec["files"] else f"a-{rows}", spec, rows)
    paths = sorted(source.rglob("*.jpg"), key=lambda p: p.name)
    if len(paths) < rows:
        raise RuntimeError(f"{source}: {len(paths)} photos, {rows} wanted")
    return paths[:rows]


def _hf_schema(classes: int) -> pa.Schema:
    features = {
        "image": {"_type": "Image"},
        "caption": {"dtype": "string", "_type": "Value"},
        "label": {"names": [f"class_{i:03d}" for i in range(classes)], "_type": "ClassLabel"},
    }
    schema = pa.schema(
        [
            ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            ("caption", pa.string()),
            ("label", pa.int64()),
        ]
    )
    return schema.with_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def _write(dest: Path, paths: list[Path], row_group_rows: int) -> None:
    """The photos as ``dest/data/train-*-of-*.parquet`` (see the module docstring)."""
    total = sum(p.stat().st_size for p in paths)
    files = max(2, total // MAX_SHARD_BYTES + 1)
    classes = SETS["a"].get("classes", 100)
    schema = _hf_schema(classes)
    (dest / "data").mkdir(parents=True, exist_ok=True)
    per_file = -(-len(paths) // files)
    for n in range(files):
        chunk = paths[n * per_file : (n + 1) * per_file]
        images, captions, labels = [], [], []
        for path in chunk:
            images.append({"bytes": path.read_bytes(), "path": path.name})
            captions.append(_caption(random.Random(path.name)))
            labels.append(int(path.parent.name.removeprefix("class_")))
        table = pa.table({"image": images, "caption": captions, "label": labels}, schema=schema)
        name = dest / "data" / f"train-{n:05d}-of-{files:05d}.parquet"
        pq.write_table(table, name, row_group_size=row_group_rows)


def footer_figures(files: list[Path], columns: tuple[str, ...]) -> tuple[int, int]:
    """(bytes of ``columns``' chunks, bytes of the footers) of the files, from their
    footers."""
    chunks = footers = 0
    for path in files:
        meta = pq.ParquetFile(path).metadata
        footers += meta.serialized_size + 8
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for i in range(group.num_columns):
                chunk = group.column(i)
                if chunk.path_in_schema.split(".")[0] in columns:
                    chunks += chunk.total_compressed_size
    return chunks, footers


def prepare(rows: int, server: SeaweedServer, row_group_rows: int = ROW_GROUP_ROWS) -> ParquetSet:
    """Write the Parquet files (once, kept), upload them and pack them into the bucket."""
    key = f"parquet-a-{rows}-rg{row_group_rows}"
    local = OUT / "data" / key
    marker = local / ".complete"
    if not marker.exists():
        paths = _photos(rows)
        print(f"[parquet] writing {rows} rows, row groups of {row_group_rows}", flush=True)
        started = time.perf_counter()
        _write(local, paths, row_group_rows)
        marker.touch()
        print(f"[parquet] written in {time.perf_counter() - started:.0f} s", flush=True)
    files = sorted((local / "data").glob("*.parquet"))
    direct = server.storage_options()
    started = time.perf_counter()
    upload(
        local,
        open_store(f"s3://{BUCKET}/{key}", storage_options=direct),
        config=TransferConfig(workers=16, include=("*.parquet",)),
    )
    uploaded_s = time.perf_counter() - started
    started = time.perf_counter()
    packed = f"s3://{BUCKET}/packed/{key}"
    # From the local files (the same bytes as in the bucket): pyarrow reads them whole.
    pack(
        local / "data",
        packed,
        storage_options=direct,
        config=PackConfig(max_shard_bytes=SHARD_BYTES),
    )
    store = open_store(packed, storage_options=direct)
    packed_bytes = sum(
        info.size for info in store.list("") if info.key.rpartition("/")[2].startswith("shard-")
    )
    column_bytes, footer_bytes = footer_figures(files, COLUMNS)
    groups = sum(pq.ParquetFile(f).metadata.num_row_groups for f in files)
    result = ParquetSet(
        key=key,
        local=local,
        rows=rows,
        files=len(files),
        row_groups=groups,
        file_bytes=sum(f.stat().st_size for f in files),
        column_bytes=column_bytes,
        footer_bytes=footer_bytes,
        packed_bytes=packed_bytes,
    )
    print(
        f"[parquet] {rows} rows in {len(files)} files, {groups} row groups, "
        f"{result.file_bytes / 1e6:,.0f} MB (image + caption chunks {column_bytes / 1e6:,.0f} MB), "
        f"uploaded in {uploaded_s:.1f} s, packed in {time.perf_counter() - started:.1f} s "
        f"({packed_bytes / 1e6:,.0f} MB)",
        flush=True,
    )
    return result


def s3fs_path() -> Path:
    """A folder with s3fs, aiobotocore and the botocore it takes, for the ``datasets`` child's
    ``PYTHONPATH`` (installed once; see the module docstring)."""
    if not (LIBS / ".complete").exists():
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target"]
        command += [str(LIBS), *S3FS_LIBS]
        print(f"[parquet] installing {' '.join(S3FS_LIBS)} into {LIBS}", flush=True)
        subprocess.run(command, check=True)
        (LIBS / ".complete").touch()
    return LIBS


def licences(path: Path) -> dict[str, str]:
    """The licence each library of the baselines ships in its wheel (its dist-info's
    licence file's first words), read with ``path`` (s3fs's folder) on the import path."""
    probe = (
        "import importlib.metadata as md, json\n"
        "out = {}\n"
        "for name in ('datasets', 'fsspec', 's3fs', 'aiobotocore', 'pyarrow', 'torch'):\n"
        "    dist = md.distribution(name)\n"
        "    text = ''\n"
        "    for f in dist.files or []:\n"
        "        if 'licen' in f.name.lower():\n"
        "            text = f.read_text() or ''\n"
        "            break\n"
        "    words = ' '.join(text.replace('\\ufeff', '').split())[:60]\n"
        "    meta = dist.metadata\n"
        "    field = meta.get('License-Expression') or meta.get('License') or ''\n"
        "    out[name] = f'{dist.version}: {field[:80]} ({words})'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"},
    )
    if done.returncode:
        return {"error": done.stderr[-500:]}
    found: dict[str, str] = json.loads(done.stdout)
    return found
