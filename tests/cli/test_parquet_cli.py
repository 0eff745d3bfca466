"""stoker inspect of Parquet read in place: rows, row groups, files and each column's type,
field and bytes, from the footers alone (one GET a file), on the test server."""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from stoker.cli.main import cli


@pytest.fixture
def env(s3_bucket: Any) -> dict[str, str]:
    options = s3_bucket.options()
    return {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


def test_inspect_summarises_a_parquet_table_from_its_footers(
    s3_bucket: Any, env: dict[str, str]
) -> None:
    store = s3_bucket.store()
    tables = []
    for file in range(2):
        table = pa.table(
            {
                "image": [{"bytes": bytes([file, i]) * 400, "path": None} for i in range(30)],
                "caption": [f"caption {i}" if i % 5 else None for i in range(30)],
                "label": list(range(30)),
            }
        )
        out = io.BytesIO()
        pq.write_table(table, out, row_group_size=8)
        store.put(f"data/train-{file:05d}-of-00002.parquet", out.getvalue())
        tables.append(pq.ParquetFile(io.BytesIO(out.getvalue())).metadata)
    url = f"{s3_bucket.url}/data"
    result = CliRunner(env=env).invoke(cli, ["inspect", url, "--json"])
    assert result.exit_code == 0, result.output
    seen = json.loads(result.output)
    assert (seen["rows"], seen["row_groups"], len(seen["files"])) == (60, 8, 2)
    assert seen["requests"]["requests.get"] <= 2 * 2  # a footer a file (at most two reads)
    columns = {c["name"]: c for c in seen["columns"]}
    assert columns["caption"]["field"] == "txt"
    assert columns["caption"]["nulls"] == 12
    assert columns["label"]["field"] == "label (cls)"
    stored = sum(
        m.row_group(g).column(i).total_compressed_size
        for m in tables
        for g in range(m.num_row_groups)
        for i in range(m.num_columns)
    )
    assert sum(c["stored_bytes"] for c in seen["columns"]) == stored
    text = CliRunner(env=env).invoke(cli, ["inspect", url])
    assert text.exit_code == 0, text.output
    assert "60 rows in 8 row groups of 2 files" in text.output


def test_show_and_bench_read_a_parquet_table_in_place(
    s3_bucket: Any, env: dict[str, str], tmp_path: Any
) -> None:
    import numpy as np

    from stoker.testing.images import make_jpeg

    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "image": [
                {"bytes": make_jpeg(rng, width=32, height=24), "path": None} for _ in range(20)
            ],
            "label": [i % 2 for i in range(20)],
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=5)
    s3_bucket.store().put("data/train.parquet", out.getvalue())
    url = f"{s3_bucket.url}/data"
    runner = CliRunner(env=env)
    shown = runner.invoke(cli, ["show", url, "--out", str(tmp_path / "grid.png")])
    assert shown.exit_code == 0, shown.output
    assert (tmp_path / "grid.png").stat().st_size > 0
    timed = runner.invoke(cli, ["bench", url, "--batches", "2", "--batch-size", "4", "--json"])
    assert timed.exit_code == 0, timed.output
    report = json.loads(timed.output)
    assert report["samples"] == 8
    # The order of 4 row groups of 5 rows, shuffled: neighbours apart, batches over groups.
    assert report["shuffle"]["mean_neighbour_distance"] > 0
    assert report["shuffle"]["mean_shards_per_batch"] >= 1
