"""Samples under dotted folders (``v1.2/0001.txt``): WebDataset takes the key to be the path
up to the first dot of the base name, so ``v1.2/0001``; stoker indexes such tars in place and
packs them with the same keys, and reads back what webdataset's own pipeline reads."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import numpy as np
import webdataset as wds

from stoker.pack.indexer import index_webdataset
from stoker.pack.packer import pack
from stoker.pipeline.loader import Loader

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
