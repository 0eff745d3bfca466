"""A Parquet table read in place mixes with a packed dataset (issue 34, item 1): each
epoch holds each source's share, every unit of it once, and resume is exact."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker import MixConfig, SourceConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import CenterCrop
from stoker.testing.images import make_jpeg, write_packed_images

ROWS, PACKED = 30, 24


@pytest.fixture(scope="module")
def mix(tmp_path_factory: pytest.TempPathFactory) -> SourceConfig:
    root = tmp_path_factory.mktemp("mix")
    packed = write_packed_images(root / "packed", files=PACKED, classes=3, width=24, height=20)
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "image": [
                {"bytes": make_jpeg(rng, width=24, height=20), "path": None} for _ in range(ROWS)
            ],
            "label": [i % 3 for i in range(ROWS)],
        }
    )
    (root / "table").mkdir()
    pq.write_table(table, root / "table" / "train.parquet", row_group_size=7)
    return SourceConfig(
        [packed, str(root / "table")], mix=MixConfig(samples_per_epoch=(PACKED, ROWS))
    )


def _units(loader: Loader) -> list[tuple[int, str]]:
    return [(int(s), k) for b in loader for s, k in zip(b["source"], b["key"], strict=True)]


def test_each_epoch_holds_each_sources_share_every_unit_once(mix: SourceConfig) -> None:
    settings: dict[str, Any] = {"batch_size": 4, "seed": 2, "transform": CenterCrop(16)}
    with Loader(mix, **settings) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            units = _units(loader)
            counts = Counter(source for source, _ in units)
            assert counts == {0: PACKED, 1: ROWS}
            assert len(set(units)) == len(units)  # no unit twice
    table_keys = {key for source, key in units if source == 1}
    assert table_keys == {f"train_{i:08d}" for i in range(ROWS)}


def test_a_resume_mid_epoch_of_the_mix_equals_the_uninterrupted_rest(mix: SourceConfig) -> None:
    settings: dict[str, Any] = {"batch_size": 4, "seed": 2, "transform": CenterCrop(16)}
    with Loader(mix, **settings) as loader:
        whole = _units(loader)
    with Loader(mix, **settings) as loader:
        loader.read_ahead = False
        it = iter(loader)
        batches = [next(it) for _ in range(3)]
        seen = [(int(s), k) for b in batches for s, k in zip(b["source"], b["key"], strict=True)]
        state = loader.state_dict()
        it.close()  # type: ignore[attr-defined]
    with Loader(mix, **settings) as loader:
        loader.load_state_dict(state)
        rest = _units(loader)
    assert seen + rest == whole
