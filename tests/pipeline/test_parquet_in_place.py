"""Parquet read in place (issue 34): Hugging Face-layout files in a bucket stream row for
row as pyarrow reads them, fetching only the chosen columns' chunks, each footer once."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from stoker.pipeline.loader import Loader
from stoker.pipeline.parquet_source import open_parquet
from stoker.pipeline.world import World
from stoker.testing.images import make_jpeg

FILES, ROWS, GROUP = 3, 20, 7  # row groups of 7, 7 and 6 rows in each file


def _table(file: int) -> pa.Table:
    rng = np.random.default_rng(file)
    images = [
        # Noise: incompressible, so the image chunks are most of each file.
        {"bytes": make_jpeg(rng, width=96, height=64, quality=95), "path": f"{file}_{i}.jpg"}
        for i in range(ROWS)
    ]
    return pa.table(
        {
            "image": images,
            "caption": [f"photo {i} of file {file}" for i in range(ROWS)],
            "label": [(file + i) % 4 for i in range(ROWS)],
            "tokens": [list(range(i % 5 + 1)) for i in range(ROWS)],
        }
    )


@pytest.fixture
def hf_bucket(s3_bucket: Any) -> tuple[str, dict[str, Any], dict[str, pa.Table]]:
    """``data/train-0000N-of-00003.parquet`` in a bucket, with a README beside them."""
    store = s3_bucket.store()
    tables = {}
    for file in range(FILES):
        name = f"data/train-{file:05d}-of-{FILES:05d}.parquet"
        out = io.BytesIO()
        pq.write_table(_table(file), out, row_group_size=GROUP)
        store.put(name, out.getvalue())
        tables[name] = _table(file)
    store.put("README.md", b"# a dataset card")
    return f"{s3_bucket.url}/data", s3_bucket.options(), tables


def _expected(tables: dict[str, pa.Table]) -> dict[str, dict[str, Any]]:
    rows = {}
    for name, table in tables.items():
        stem = name.removeprefix("data/").removesuffix(".parquet")
        for i, row in enumerate(table.to_pylist()):
            rows[f"{stem}_{i:08d}"] = row
    return rows


def _samples(loader: Loader) -> list[dict[str, Any]]:
    out = []
    for batch in loader:
        for n, key in enumerate(batch["key"]):
            out.append({name: value[n] for name, value in batch.items()} | {"key": key})
    return out


def test_rows_stream_as_pyarrow_reads_them(hf_bucket: Any) -> None:
    url, options, tables = hf_bucket
    expected = _expected(tables)
    source = open_parquet(url, storage_options=options)
    with Loader(source, batch_size=8, seed=3) as loader:
        samples = _samples(loader)
    assert sorted(s["key"] for s in samples) == sorted(expected)
    for sample in samples:
        row = expected[sample["key"]]
        assert sample["txt"] == row["caption"]
        assert sample["label"] == row["label"]
        assert list(sample["tokens.npy"]) == row["tokens"]
        image = np.asarray(Image.open(io.BytesIO(row["image"]["bytes"])).convert("RGB"))
        assert np.array_equal(sample["image"], image)
    assert source.dataset.class_names == []  # no ClassLabel in the files' metadata


def test_two_ranks_read_every_row_once_and_whole_row_groups(hf_bucket: Any) -> None:
    url, options, tables = hf_bucket
    keys: Counter[str] = Counter()
    groups = []
    for rank in range(2):
        source = open_parquet(url, storage_options=options, columns=["caption", "label"])
        world = World(rank=rank, world_size=2)
        with Loader(source, batch_size=4, seed=1, drop_last=False, world=world) as loader:
            batches = list(loader)
            padded = loader.stats().padded
        keys.update(k for b in batches for k in b["key"])
        groups.append({source.shard_of(i) for b in batches for i in b["index"]})
        assert len(batches) == len(loader)
    assert set(keys) == set(_expected(tables))
    assert keys.total() == FILES * ROWS + padded
    assert padded < 2
    # A row group is read by one rank, but for the one that the two ranks' pieces of the
    # epoch cut (and the one a padded row repeats).
    assert len(groups[0] & groups[1]) <= 1 + padded
    assert len(groups[0] | groups[1]) == FILES * 3


def test_a_resume_mid_epoch_equals_the_uninterrupted_rest(hf_bucket: Any) -> None:
    url, options, _ = hf_bucket
    settings = {"batch_size": 4, "seed": 5, "drop_last": False}

    def source() -> Any:
        return open_parquet(url, storage_options=options, columns=["label"])

    with Loader(source(), **settings) as loader:
        whole = [list(b["key"]) for b in loader]
    with Loader(source(), **settings) as loader:
        it = iter(loader)
        seen = [list(next(it)["key"]) for _ in range(4)]
        state = loader.state_dict()
        it.close()  # type: ignore[attr-defined]
    with Loader(source(), **settings) as loader:
        loader.load_state_dict(state)
        rest = [list(b["key"]) for b in loader]
    assert seen == whole[:4]
    assert rest == whole[4:]


def test_only_the_chosen_columns_chunks_are_fetched_and_each_footer_once(
    hf_bucket: Any,
) -> None:
    url, options, tables = hf_bucket
    source = open_parquet(url, storage_options=options, columns=["caption", "label"])
    dataset = source.dataset
    store = dataset.store
    opened = store.counters.snapshot()  # listing and the footers
    chunks = sum(dataset.reader.chunk_bytes(g.location, g.group) for g in dataset.groups)
    with Loader(source, batch_size=8, seed=0) as loader:
        loader.read_ahead = False
        samples = _samples(loader)
    assert len(samples) == FILES * ROWS
    assert set(samples[0]) >= {"txt", "label"}
    assert "image" not in samples[0]
    first = store.counters.snapshot()
    with Loader(source, batch_size=8, seed=0) as loader:
        loader.read_ahead = False
        loader.set_epoch(1)
        assert len(_samples(loader)) == FILES * ROWS
    second = store.counters.snapshot()

    def read(before: dict[str, int], after: dict[str, int], name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    # Never more than the chosen columns' chunks, as the footers record them, every epoch
    # (a row group read twice in a row is decoded once); at most a GET a chunk: no footer
    # is read again once the files are open.
    leaves = 2 * len(dataset.groups)  # caption and label: one chunk each a row group
    for before, after in ((opened, first), (first, second)):
        assert 0 < read(before, after, "bytes.read") <= chunks
        assert read(before, after, "requests.get") <= leaves
    image_bytes = sum(len(r["image"]["bytes"]) for t in tables.values() for r in t.to_pylist())
    assert chunks < image_bytes / 20


def test_a_node_reads_the_listing_and_footers_once_through_its_disk_cache(
    hf_bucket: Any, tmp_path: Any
) -> None:
    url, options, tables = hf_bucket
    first = open_parquet(url, storage_options=options, cache_dir=tmp_path / "cache")
    opened = first.dataset.store.counters.snapshot()
    assert opened.get("requests.list", 0) >= 1
    assert opened.get("requests.get", 0) >= FILES  # a footer a file
    # Another process of the node (another rank or loader worker) opening the table: no
    # listing and no footer; the captions alone need nothing more at open (the labels
    # would be read whole, for every row's label).
    again = open_parquet(
        url, storage_options=options, cache_dir=tmp_path / "cache", columns=["caption"]
    )
    counted = again.dataset.store.counters.snapshot()
    assert counted.get("requests.list", 0) == 0
    assert counted.get("requests.get", 0) == 0
    assert again.dataset.keys == first.dataset.keys
    with Loader(again, batch_size=8, seed=1) as loader:
        samples = _samples(loader)
    expected = _expected(tables)
    assert sorted(s["key"] for s in samples) == sorted(expected)
    assert all(s["txt"] == expected[s["key"]]["caption"] for s in samples)
    assert "label" not in samples[0] or samples[0]["label"] == -1


def test_a_table_of_millions_of_rows_opens_without_a_reference_per_row(tmp_path: Any) -> None:
    import tracemalloc

    rows = 2_000_000
    pq.write_table(
        pa.table({"x": np.arange(rows, dtype=np.int32)}),
        tmp_path / "big.parquet",
        row_group_size=250_000,
    )
    tracemalloc.start()
    try:
        source = open_parquet(str(tmp_path / "big.parquet"), storage_options=None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(source.dataset) == rows
    assert source.dataset.group_rows == [250_000] * 8
    # A reference a row (its key, location and row numbers) took over 300 bytes a row; the
    # table costs its row groups and eight bytes a row (the bytes each row fetches).
    assert peak < 40 * rows
    assert source.dataset.read_many([1_999_999])[0]["x.json"] == b"1999999"


def test_read_groups_of_large_row_groups_hold_one_or_a_few(tmp_path: Any) -> None:
    from stoker.pipeline.order import OrderConfig
    from stoker.pipeline.plan import GROUP_TARGET_BYTES, resolve_order

    rng = np.random.default_rng(0)
    blobs = [rng.bytes(200_000) for _ in range(200)]  # 4 MB row groups of 20 rows
    pq.write_table(pa.table({"blob": blobs}), tmp_path / "t.parquet", row_group_size=20)
    source = open_parquet(str(tmp_path / "t.parquet"), storage_options=None)
    units, unit_bytes = source.units(), source.unit_bytes()
    order = resolve_order(
        source.order_defaults(OrderConfig(), units=units, unit_bytes=unit_bytes),
        seed=0,
        units=units,
        unit_bytes=unit_bytes,
    )
    assert order.block_size == 20  # a block is a row group
    group_bytes = order.blocks * order.group_blocks * unit_bytes
    assert group_bytes <= GROUP_TARGET_BYTES * 1.01  # not 16 row groups (64 MB) a group
    assert order.group_blocks >= 1


@pytest.mark.parametrize(
    ("pattern", "files"),
    [
        ("data/train-0000[02]-of-00003.parquet", (0, 2)),
        ("data/train-*.parquet", (0, 1, 2)),
        ("**/train-00001-*.parquet", (1,)),
    ],
)
def test_a_glob_reads_the_files_it_matches(hf_bucket: Any, pattern: str, files: Any) -> None:
    url, options, tables = hf_bucket
    bucket = url.removesuffix("/data")
    with Loader(f"{bucket}/{pattern}", batch_size=8, storage_options=options) as loader:
        # Keys name each file from the pattern's fixed folder: the bucket, for **/...
        keys = sorted(k.removeprefix("data/") for b in loader for k in b["key"])
    assert keys == sorted(k for k in _expected(tables) if int(k.split("-")[1]) in files)


def test_a_glob_that_matches_nothing_or_names_a_bucket_is_refused(hf_bucket: Any) -> None:
    from stoker.errors import SourceError

    url, options, _ = hf_bucket
    with pytest.raises(SourceError, match=r"test-\*\.parquet: no \.parquet files found"):
        Loader(f"{url}/test-*.parquet", batch_size=8, storage_options=options)
    with pytest.raises(SourceError, match="a pattern must come after the bucket's name"):
        Loader("s3://nobucket*/x.parquet", batch_size=8, storage_options=options)


def test_a_local_file_streams_and_ragged_lists_pad_with_their_lengths(tmp_path: Any) -> None:
    from stoker.pipeline.config import DecodeConfig
    from stoker.pipeline.fields import FieldsConfig
    from stoker.pipeline.order import OrderConfig

    path = tmp_path / "ragged.parquet"
    pq.write_table(pa.table({"tokens": [list(range(n % 4 + 1)) for n in range(6)]}), path)
    fields = FieldsConfig(pad={"tokens.npy": -1})
    with Loader(
        str(path), batch_size=3, decode=DecodeConfig(fields=fields), order=OrderConfig(mode="none")
    ) as loader:
        batches = list(loader)
    assert batches[0]["tokens.npy"].tolist() == [[0, -1, -1], [0, 1, -1], [0, 1, 2]]
    assert batches[0]["tokens.npy_lengths"].tolist() == [1, 2, 3]
    assert batches[1]["tokens.npy_lengths"].tolist() == [4, 1, 2]
