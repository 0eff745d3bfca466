"""A shard's size is checked with one HEAD, however many reads of it start at once."""

from __future__ import annotations

from pathlib import Path

from stoker import Loader, OrderConfig
from stoker.pack.packer import PackConfig, pack
from stoker.testing.images import write_image_folder


def test_one_head_per_shard_with_many_reads_in_flight(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=400, classes=4, width=16, height=12)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=100))
    # Blocks of one sample, all read before the first batch: 400 reads in flight at once.
    order = OrderConfig(block_size=1, group_blocks=4, window=100)
    with Loader(str(tmp_path / "ds"), batch_size=50, order=order) as loader:
        delivered = sum(len(batch["label"]) for batch in loader)
        requests = loader.stats().requests
    assert delivered == 400
    assert requests["requests.get"] > 300  # few neighbours share a read group
    assert requests["requests.head"] == 4  # one per shard
