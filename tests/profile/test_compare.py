"""The seed comparison on a small bucket of small files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from stoker.format.reader import open_dataset
from stoker.profile.compare import (
    CompareConfig,
    compare_methods,
    default_pack_to,
    format_comparison,
    sample_refs,
)
from stoker.profile.plots import render_comparison
from stoker.storage.transfer import upload
from stoker.testing.images import write_image_folder

METHODS = ["(a)", "(b)", "(c)", "(d)"]


@pytest.fixture
def photos(s3_bucket: Any, tmp_path: Path) -> str:
    write_image_folder(tmp_path / "src", files=40, classes=4, width=96, height=72)
    upload(tmp_path / "src", s3_bucket.store("photos"))
    return f"{s3_bucket.url}/photos"


def test_compare_times_four_methods(photos: str, s3_bucket: Any, tmp_path: Path) -> None:
    config = CompareConfig(limit=24, batch_size=8, size=32, sequential_limit=10, threads=2)
    lines: list[str] = []
    work = tmp_path / "work"
    work.mkdir()
    result = compare_methods(
        photos,
        pack_to=f"{s3_bucket.url}/packed",
        storage_options=s3_bucket.options(),
        config=config,
        workdir=work,
        log=lines.append,
    )
    assert result.files == 24
    assert [r.method[:3] for r in result.rows] == METHODS
    for row in result.rows:
        assert row.images == 24
        assert 0 < row.first_batch_s <= row.setup_s + row.epoch_s + 1e-9
        assert row.setup_s >= 0
        assert row.epoch_s > 0
    a, b, c, d = result.rows
    assert a.estimated
    assert not b.estimated
    assert c.setup_s == 0
    assert c.requests_per_epoch == 24  # one GET per sample, every epoch
    assert 0 < d.requests_per_epoch < 24  # ranged GETs over shards
    assert a.requests_per_epoch == b.requests_per_epoch == 0  # from local disk
    assert d.setup_s > 0  # the pack
    assert lines
    assert "(d)" in "\n".join(lines)
    assert list(s3_bucket.store("packed").list()) == []  # the packed copy is deleted
    assert list(work.iterdir()) == []  # and the downloads
    table = format_comparison(result)
    assert all(method in table for method in METHODS)
    image = render_comparison(result)
    image.save(tmp_path / "compare.png")
    with Image.open(tmp_path / "compare.png") as png:
        assert png.format == "PNG"
        assert png.width == 1200


def test_compare_can_keep_the_packed_dataset(photos: str, s3_bucket: Any) -> None:
    config = CompareConfig(limit=100, batch_size=16, size=32, threads=2)
    result = compare_methods(
        photos,
        pack_to=f"{s3_bucket.url}/packed",
        storage_options=s3_bucket.options(),
        config=config,
        keep_packed=True,
    )
    assert result.files == 40  # all of them: the limit is above the count
    assert not result.rows[0].estimated
    dataset = open_dataset(result.packed or "", storage_options=s3_bucket.options())
    assert len(dataset) == 40
    assert list(dataset.class_names) == [f"class_{i:02d}" for i in range(4)]


def test_compare_refuses_a_non_empty_destination(photos: str, s3_bucket: Any) -> None:
    s3_bucket.store("packed").put("something", b"x")
    with pytest.raises(ValueError, match="not empty"):
        compare_methods(
            photos, pack_to=f"{s3_bucket.url}/packed", storage_options=s3_bucket.options()
        )
    assert [m.key for m in s3_bucket.store("packed").list()] == ["something"]


def test_sample_is_evenly_spaced() -> None:
    refs = list(range(100))
    assert sample_refs(refs, 4) == [0, 25, 50, 75]  # type: ignore[arg-type]
    assert sample_refs(refs[:3], 4) == [0, 1, 2]  # type: ignore[arg-type]


def test_compare_on_a_local_folder_leaves_nothing_behind(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "photos", files=12, classes=2, width=48, height=32)
    result = compare_methods(
        str(tmp_path / "photos"),
        pack_to=default_pack_to(str(tmp_path / "photos")),
        config=CompareConfig(batch_size=4, size=16, threads=2),
    )
    assert [row.images for row in result.rows] == [12, 12, 12, 12]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos"]


def test_default_pack_to_is_beside_the_folder() -> None:
    assert default_pack_to("s3://bucket/train/") == "s3://bucket/train-stoker-compare"
    with pytest.raises(ValueError, match="bucket root"):
        default_pack_to("s3://bucket")
