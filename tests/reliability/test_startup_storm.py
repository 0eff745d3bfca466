"""Start-up storms: sixteen ranks of one node opening one dataset at once behind a
throttling proxy (issue 32 item 8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stoker.pack.packer import PackConfig, pack
from stoker.storage import open_store
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import SeaweedServer
from stoker.testing.storm import run_startup_storm

CHILD = Path(__file__).with_name("startup_child.py")
PROCESSES = 16


@pytest.mark.slow
def test_sixteen_ranks_opening_one_dataset_fetch_its_index_once_per_node(
    s3_bucket: Any, s3_server: SeaweedServer, tmp_path: Path
) -> None:
    """Sixteen processes open one packed dataset at once through a 100 requests/s limit,
    sharing a disk cache: every one takes its first batch, index.json and index.bin are
    each fetched once for the node (the others read them from the cache), and the requests
    besides the data (the index's; the shards' GETs and size HEADs left out) are at most
    two per process, throttled ones included; no shard is sent a HEAD (its size comes
    with its first ranged GET)."""
    write_image_folder(tmp_path / "src", files=256, classes=4, width=16, height=16)
    url = f"{s3_bucket.url}/ds"
    pack(
        tmp_path / "src",
        url,
        config=PackConfig(samples_per_shard=4),
        storage_options=s3_bucket.options(),
    )
    run = run_startup_storm(
        s3_server,
        url,
        tmp_path / "storm",
        child=CHILD,
        processes=PROCESSES,
        requests_per_s=100.0,
        cache_dir=tmp_path / "cache",
    )
    summary = run.to_dict()
    assert run.failures == 0, run.errors
    assert all(len(r["ids"]) == 8 for r in run.reports)
    assert summary["index_json_gets"] == 1, summary
    assert summary["index_bin_gets"] == 1, summary
    assert run.other_requests <= 2 * PROCESSES, summary
    assert run.data_heads == 0, summary  # the shards' sizes come with their GETs


@pytest.mark.slow
def test_ranks_opening_one_image_folder_list_it_once_per_node(
    s3_bucket: Any, s3_server: SeaweedServer, tmp_path: Path
) -> None:
    """Eight processes open one unpacked image folder at once through a 100 requests/s
    limit, sharing a disk cache: every one takes its first batch, and the folder is listed
    once for the node (as many LISTs as one process alone makes), the others reading the
    listing from the cache."""
    write_image_folder(tmp_path / "src", files=64, classes=4, width=16, height=16)
    store = open_store(f"{s3_bucket.url}/folder", storage_options=s3_bucket.options())
    for path in sorted((tmp_path / "src").rglob("*.*")):
        store.put(path.relative_to(tmp_path / "src").as_posix(), path.read_bytes())
    url = f"{s3_bucket.url}/folder"
    alone = run_startup_storm(
        s3_server, url, tmp_path / "alone", child=CHILD, processes=1, cache_dir=tmp_path / "c1"
    )
    assert alone.failures == 0, alone.errors
    run = run_startup_storm(
        s3_server, url, tmp_path / "storm", child=CHILD, processes=8, cache_dir=tmp_path / "c8"
    )
    assert run.failures == 0, run.errors
    assert alone.lists(answer="forwarded") >= 1
    assert run.lists(answer="forwarded") == alone.lists(answer="forwarded"), run.to_dict()
