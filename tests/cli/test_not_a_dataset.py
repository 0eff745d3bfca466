"""A location that is neither a packed dataset nor a folder of images: the error names the
way on for what it holds, and never a command that writes into data that is there. WebDataset
tars are indexed in place (`stoker index URL`), not packed into their own location."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.pipeline.loader import Loader
from stoker.testing.images import write_image_folder


def _write_wds_tars(folder: Path, images: list[Path]) -> None:
    """Two WebDataset tars of the images: KEY.jpg and KEY.cls members."""
    folder.mkdir(parents=True)
    for shard in range(2):
        with tarfile.open(folder / f"shard-{shard:04d}.tar", "w") as tar:
            for n, path in enumerate(images[shard::2]):
                for name, data in (
                    (f"{shard}{n:04d}.jpg", path.read_bytes()),
                    (f"{shard}{n:04d}.cls", b"1"),
                ):
                    member = tarfile.TarInfo(name)
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))


@pytest.fixture
def tars(tmp_path: Path) -> Path:
    images = write_image_folder(tmp_path / "images", files=8, classes=2, width=32, height=24)
    _write_wds_tars(tmp_path / "wds", images)
    return tmp_path / "wds"


def test_webdataset_tars_are_indexed_in_place_not_packed_over(tars: Path) -> None:
    url = str(tars)
    result = CliRunner().invoke(cli, ["doctor", url, "--batches", "1", "--batch-size", "2"])
    assert result.exit_code == 1, result.output
    assert f"{url}: neither a packed dataset" in result.output
    assert "2 .tar file(s) (shard-0000.tar, ...)" in result.output
    assert f"`stoker index {url}`" in result.output
    assert "stoker pack" not in result.output  # nothing that would write over the tars
    # The advice works: after `stoker index`, the same URL opens as a dataset.
    indexed = CliRunner().invoke(cli, ["index", url])
    assert indexed.exit_code == 0, indexed.output
    with Loader(url, batch_size=2) as loader:
        assert len(loader.dataset) == 8


def test_tars_in_a_bucket_are_named_with_their_url(tars: Path, s3_bucket: Any) -> None:
    store = s3_bucket.store("wds")
    for path in sorted(tars.iterdir()):
        store.put(path.name, path.read_bytes())
    url = f"{s3_bucket.url}/wds"
    with pytest.raises(FileNotFoundError) as caught:
        Loader(url, batch_size=2, storage_options=s3_bucket.options())
    message = str(caught.value)
    assert message.startswith(f"{url}: neither a packed dataset"), message
    assert f"`stoker index {url}`" in message
    assert "stoker pack" not in message


def test_other_files_are_packed_beside_and_an_empty_place_into(tmp_path: Path) -> None:
    other = tmp_path / "tables"
    other.mkdir()
    (other / "part-0.csv").write_text("a,b\n1,2\n")
    with pytest.raises(FileNotFoundError) as caught:
        Loader(str(other), batch_size=2)
    message = str(caught.value)
    assert f"`stoker pack {other} {other}-packed`" in message, message
    assert f"stoker pack SRC {other}" not in message
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as caught:
        Loader(str(empty), batch_size=2)
    assert f"Pack your data into it with `stoker pack SRC {empty}`" in str(caught.value)
