"""A window of read groups (data of unknown order) does not hold the first batch back."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stoker.core.metrics import Stage
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.testing.images import write_image_folder


def test_the_first_batch_waits_for_the_windows_first_groups_only(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=600, classes=6, width=8, height=8)
    kept = PackConfig(samples_per_shard=200, shuffle_seed=None)  # class-sorted
    pack(tmp_path / "src", tmp_path / "ds", config=kept)
    # 30 read groups of 20 samples, mixed through a window of 16 of them.
    order = OrderConfig(block_size=5, group_blocks=4, window=16)
    with Loader(str(tmp_path / "ds"), batch_size=16, order=order, prefetch=2) as loader:
        batches = iter(loader)
        first = next(batches)
        fetched = loader.stats().stages[Stage.FETCH].items
        # The window's first groups (2 of 16) and the one joining: not all 16 (320 samples).
        assert len(first["index"]) == 16
        assert fetched <= 3 * 20
        rest = np.concatenate([first["index"], *(b["index"] for b in batches)])
    assert sorted(rest.tolist()) == list(range(600))  # each sample once
