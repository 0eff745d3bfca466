"""Bad Parquet read in place is named (issue 34, item 4): a truncated file, a footer that
claims offsets past the object, files whose schemas differ, a row group that fails to
decode and a column asked for that does not exist; a row group's failure is its rows'
error, which on_error="skip" counts and lists. Nothing hangs."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker import CacheConfig, DecodeConfig, SourceConfig
from stoker.errors import SourceError
from stoker.pipeline.loader import Loader

ROWS, GROUP = 24, 8


def _bytes(table: pa.Table, **options: Any) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=GROUP, **options)
    return out.getvalue()


def _table(seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "caption": [f"row {i} " + "x" * int(rng.integers(50, 90)) for i in range(ROWS)],
            "label": [i % 3 for i in range(ROWS)],
        }
    )


def _put(bucket: Any, files: dict[str, bytes]) -> tuple[str, dict[str, Any]]:
    store = bucket.store()
    for name, data in files.items():
        store.put(f"data/{name}", data)
    return f"{bucket.url}/data", bucket.options()


def _keys(url: str | SourceConfig, options: dict[str, Any], **settings: Any) -> list[str]:
    source = SourceConfig(url) if isinstance(url, str) else url
    with Loader(source, storage_options=options, batch_size=4, **settings) as loader:
        return [key for batch in loader for key in batch["key"]]


def _chunk_start(data: bytes, group: int) -> int:
    column = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(group).column(0)
    return int(column.dictionary_page_offset or column.data_page_offset)


def test_a_truncated_file_is_named(s3_bucket: Any) -> None:
    good = _bytes(_table())
    url, options = _put(s3_bucket, {"a.parquet": good, "b.parquet": good[: len(good) // 2]})
    with pytest.raises(SourceError, match=r"data/b\.parquet: cannot read as Parquet"):
        _keys(url, options)


def test_a_footer_claiming_offsets_past_the_object_fails_its_rows_named(
    s3_bucket: Any,
) -> None:
    good = _bytes(_table())
    # The footer of the whole file behind only the first row group: the other row groups'
    # offsets now point past the end of the object.
    cut = _chunk_start(good, 1)
    footer = int.from_bytes(good[-8:-4], "little") + 8
    lying = good[:cut] + good[-footer:]
    url, options = _put(s3_bucket, {"a.parquet": lying})
    # The label column is read whole when the file is opened (every row's label): named.
    with pytest.raises(SourceError, match=r"a\.parquet: cannot read column 'label'"):
        _keys(url, options)
    # The captions alone: the rows of the row groups past the end fail, named.
    captions = SourceConfig(url, columns=["caption"])
    with pytest.raises(ValueError, match=r"(?s)sample 'a_000000\d\d'.*a\.parquet: cannot read row"):
        _keys(captions, options)
    kept = _keys(captions, options, decode=DecodeConfig(on_error="skip"))
    assert sorted(kept) == [f"a_{i:08d}" for i in range(GROUP)]  # the first row group only


def test_files_whose_columns_differ_are_named(s3_bucket: Any) -> None:
    other = _table().append_column("extra", pa.array(range(ROWS)))
    url, options = _put(s3_bucket, {"a.parquet": _bytes(_table()), "b.parquet": _bytes(other)})
    with pytest.raises(SourceError, match=r"b\.parquet: its columns differ from .*a\.parquet"):
        _keys(url, options)


def test_a_row_group_that_fails_to_decode_is_named_and_skipped_with_its_rows(
    s3_bucket: Any, tmp_path: Any
) -> None:
    good = _bytes(_table(), compression="snappy")
    start = _chunk_start(good, 1)
    broken = good[:start] + bytes([0xFF] * 24) + good[start + 24 :]  # its page header
    url, options = _put(s3_bucket, {"a.parquet": broken})
    with pytest.raises(
        ValueError, match=r"(?s)sample 'a_000000\d\d'.*a\.parquet: cannot read row group 1"
    ):
        _keys(url, options)
    listed = tmp_path / "skipped.jsonl"
    decode = DecodeConfig(on_error="skip", skipped_file=listed)
    kept = _keys(url, options, decode=decode)
    assert sorted(kept) == [f"a_{i:08d}" for i in range(ROWS) if not GROUP <= i < 2 * GROUP]
    lines = listed.read_text().splitlines()
    assert len(lines) == GROUP
    assert all("row group 1" in line for line in lines)


def test_a_missing_column_is_named_with_the_columns_there(s3_bucket: Any) -> None:
    url, options = _put(s3_bucket, {"a.parquet": _bytes(_table())})
    with pytest.raises(
        SourceError, match=r"a\.parquet: no column 'labels'; it has \['caption', 'label'\]"
    ):
        Loader(
            SourceConfig(url, columns=["caption", "labels"]),
            storage_options=options,
            batch_size=4,
        )


def test_a_footer_claiming_more_than_the_object_is_refused_before_it_is_read(
    s3_bucket: Any, tmp_path: Any
) -> None:
    good = _bytes(_table())
    lying = good[:-8] + (1 << 30).to_bytes(4, "little") + b"PAR1"  # claims a 1 GiB footer
    url, options = _put(s3_bucket, {"a.parquet": lying})
    cache = CacheConfig(dir=str(tmp_path / "cache"))
    with pytest.raises(SourceError, match=r"a\.parquet: .*footer claims 1,073,741,824 bytes"):
        Loader(SourceConfig(url), storage_options=options, batch_size=4, cache=cache)
