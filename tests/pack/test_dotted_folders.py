"""Samples under dotted folders (``v1.2/0001.txt``): WebDataset takes the key to be the path
up to the first dot of the base name, so ``v1.2/0001``; stoker indexes such tars in place and
packs them with the same keys, and reads back what webdataset's own pipeline reads. An image
folder and a folder of grouped files under dotted folders have the keys of their tars (issue
33 item 9: they were ``v1_2/0001``)."""

from __future__ import annotations

import gc
import tarfile
import warnings
from pathlib import Path

import numpy as np
import webdataset as wds

from stoker.pack.indexer import index_webdataset
from stoker.pack.packer import pack
from stoker.pipeline.loader import Loader
from stoker.testing.images import make_jpeg, with_comment

SAMPLES = 12


def _write(root: Path) -> Path:
    root.mkdir()
    with wds.TarWriter(str(root / "part-000000.tar")) as sink:
        for i in range(SAMPLES):
            folder = "v1.2" if i % 2 else "data.v3/split.a"
            sink.write(
                {
                    "__key__": f"{folder}/{i:04d}",
                    "txt": f"caption {i}",
                    "npy": np.arange(i + 1, dtype=np.float32),
                    "cls": i % 3,
                }
            )
    return root


def _theirs(root: Path) -> dict[str, tuple[str, list[float], int]]:
    with warnings.catch_warnings():
        # webdataset 1.0 leaves each tar it read open for the garbage collector.
        warnings.simplefilter("ignore", ResourceWarning)
        pipeline = wds.WebDataset(str(root / "part-000000.tar"), shardshuffle=False).decode()
        samples = {s["__key__"]: (s["txt"], s["npy"].tolist(), int(s["cls"])) for s in pipeline}
        del pipeline
        gc.collect()
    return samples


def _ours(url: str) -> dict[str, tuple[str, list[float], int]]:
    with Loader(url, batch_size=4, seed=0) as loader:
        return {
            key: (txt, npy.tolist(), int(cls))
            for batch in loader
            for key, txt, npy, cls in zip(
                batch["key"], batch["txt"], batch["npy"], batch["label"], strict=True
            )
        }


def test_tars_with_dotted_folders_index_and_pack_with_webdatasets_keys(tmp_path: Path) -> None:
    tars = _write(tmp_path / "tars")
    theirs = _theirs(tars)
    assert sorted(theirs) == sorted(
        f"{'v1.2' if i % 2 else 'data.v3/split.a'}/{i:04d}" for i in range(SAMPLES)
    )
    indexed = index_webdataset(str(tars))
    assert indexed.samples == SAMPLES
    assert _ours(str(tars)) == theirs
    pack(str(tars), str(tmp_path / "packed"), source_format="webdataset")
    assert _ours(str(tmp_path / "packed")) == theirs


def _tar_of(folder: Path, tar: Path) -> None:
    """A WebDataset tar of ``folder`` as it is (members in path order, as ``tar`` would)."""
    tar.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar, "w", format=tarfile.USTAR_FORMAT) as out:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            out.add(path, arcname=path.relative_to(folder).as_posix())


def _keys(url: str) -> dict[str, int]:
    with Loader(url, batch_size=4, seed=0) as loader:
        return {
            key: int(label)
            for batch in loader
            for key, label in zip(batch["key"], batch["label"], strict=True)
        }


def test_folders_with_dots_keep_them_in_keys_as_in_a_tar_of_the_folder(tmp_path: Path) -> None:
    # Images in dotted class folders: streamed unpacked, packed, and tarred then indexed.
    images = tmp_path / "images"
    jpeg = make_jpeg(np.random.default_rng(9), width=16, height=12)
    for i, name in enumerate(["v1.2/0001.jpg", "v1.2/0002.jpg", "data.v3/0003.jpg"]):
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        (images / name).write_bytes(with_comment(jpeg, str(i).encode()))
    expected = {"data.v3/0003": 0, "v1.2/0001": 1, "v1.2/0002": 1}
    assert _keys(str(images)) == expected
    pack(str(images), str(tmp_path / "images-packed"))
    assert _keys(str(tmp_path / "images-packed")) == expected
    _tar_of(images, tmp_path / "images-tar" / "part-000000.tar")
    index_webdataset(str(tmp_path / "images-tar"))
    assert set(_keys(str(tmp_path / "images-tar"))) == set(expected)
    # A folder of grouped files (the WebDataset layout before tarring) and its tar.
    grouped = tmp_path / "grouped"
    for i, folder in enumerate(["v1.2", "v1.2", "data.v3/split.a"]):
        (grouped / folder).mkdir(parents=True, exist_ok=True)
        (grouped / folder / f"{i:04d}.txt").write_text(f"caption {i}")
        (grouped / folder / f"{i:04d}.cls").write_text(str(i % 2))
    grouped_keys = {"v1.2/0000": 0, "v1.2/0001": 1, "data.v3/split.a/0002": 0}
    pack(str(grouped), str(tmp_path / "grouped-packed"), source_format="files")
    assert _keys(str(tmp_path / "grouped-packed")) == grouped_keys
    _tar_of(grouped, tmp_path / "grouped-tar" / "part-000000.tar")
    index_webdataset(str(tmp_path / "grouped-tar"))
    assert _keys(str(tmp_path / "grouped-tar")) == grouped_keys
