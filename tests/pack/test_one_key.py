"""One key per sample, however it is stored (issue 33 item 9).

The same image folder, local and on the SeaweedFS server, streamed unpacked, packed from the
folder and packed from a CSV list naming its images, gives one mapping of key to label and
image bytes: ``astronaut/ast_00004.jpg`` is ``astronaut/ast_00004`` every way. Keys of a
packed list were row-numbered (``000000000_ast_00004``), and a bucket synced from a laptop
streamed and packed its hidden files (``astronaut/._ast_00004.jpg``,
``.ipynb_checkpoints/``), which the local folder leaves out.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.errors import SourceError
from stoker.format.reader import open_dataset
from stoker.pipeline.folder import FolderDataset
from stoker.pipeline.loader import Loader
from stoker.testing.images import make_jpeg, with_comment

RNG = np.random.default_rng(33)
JPEG = make_jpeg(RNG, width=24, height=16)


def _png() -> bytes:
    out = io.BytesIO()
    Image.fromarray(RNG.integers(0, 255, (12, 20, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


CLASSES = ["astronaut", "coffee", "rocket"]
IMAGES = {
    "astronaut/ast_00004.jpg": with_comment(JPEG, b"ast 4"),
    "astronaut/ast_00005.png": _png(),
    "coffee/cup.jpg": with_comment(JPEG, b"cup"),
    "coffee/cup.v2.jpeg": with_comment(JPEG, b"cup v2"),
    "rocket/r1.JPG": with_comment(JPEG, b"r1"),
}
#: The mapping every form must give: key -> (label, image bytes).
EXPECTED = {
    "astronaut/ast_00004": (0, IMAGES["astronaut/ast_00004.jpg"]),
    "astronaut/ast_00005": (0, IMAGES["astronaut/ast_00005.png"]),
    "coffee/cup": (1, IMAGES["coffee/cup.jpg"]),
    "coffee/cup_v2": (1, IMAGES["coffee/cup.v2.jpeg"]),
    "rocket/r1": (2, IMAGES["rocket/r1.JPG"]),
}
HIDDEN = {
    "astronaut/._ast_00004.jpg": b"\x00\x05\x16\x07 AppleDouble, no image",
    ".ipynb_checkpoints/ast_00004-checkpoint.jpg": with_comment(JPEG, b"checkpoint"),
}
# Rows in another order than the folder's, and by class name.
LIST = "path,label\n" + "".join(
    f"{name},{name.split('/')[0]}\n" for name in sorted(IMAGES, reverse=True)
)


def _files() -> dict[str, bytes]:
    return {**IMAGES, **HIDDEN, "train.csv": LIST.encode()}


def _mapping(samples: list[dict[str, Any]]) -> dict[str, tuple[int, bytes]]:
    found = {}
    for sample in samples:
        (image,) = (sample[f] for f in ("jpg", "png") if f in sample)
        found[sample["key"]] = (int(sample["label"]), image)
    return found


def _forms(url: str, options: dict[str, Any], packed: str) -> dict[str, Any]:
    """Each form's key -> (label, bytes) from the samples, and key -> label from batches."""
    stoker.pack(url, f"{packed}-folder", storage_options=options)
    stoker.pack(f"{url}/train.csv", f"{packed}-list", storage_options=options)
    forms: dict[str, Any] = {}
    for name, where in (
        ("unpacked", url),
        ("packed", f"{packed}-folder"),
        ("packed list", f"{packed}-list"),
    ):
        with Loader(where, batch_size=2, seed=0, storage_options=options) as loader:
            dataset = loader.dataset
            batches = {
                key: int(label)
                for batch in loader
                for key, label in zip(batch["key"], batch["label"], strict=True)
            }
            assert isinstance(dataset, FolderDataset) == (name == "unpacked")
            if isinstance(dataset, FolderDataset):  # its listing's keys, the objects' apart
                assert sorted(dataset.keys) == sorted(EXPECTED)
                assert sorted(dataset.objects) == sorted(IMAGES)
                samples = dataset.read_many(range(len(dataset)))
            else:
                shards = open_dataset(where, storage_options=options)
                assert sorted(shards.index.keys) == sorted(EXPECTED)
                samples = shards.read_many(range(len(shards)))
            forms[name] = (_mapping(samples), batches)
            assert list(loader.dataset.class_names) == CLASSES, name
    return forms


def _check(forms: dict[str, Any]) -> None:
    labels = {key: label for key, (label, _) in EXPECTED.items()}
    for name, (samples, batches) in forms.items():
        assert samples == EXPECTED, name
        assert batches == labels, name


def test_a_local_folder_has_one_key_per_sample_streamed_packed_and_listed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "train"
    for name, data in _files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    _check(_forms(str(root), {}, str(tmp_path / "ds")))


def test_a_bucket_folder_has_the_keys_of_the_local_one(s3_bucket: Any) -> None:
    store = s3_bucket.store("train")
    for name, data in _files().items():  # every file, hidden ones too, as a sync puts them
        store.put(name, data)
    _check(_forms(f"{s3_bucket.url}/train", s3_bucket.options(), f"{s3_bucket.url}/ds"))


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_two_images_with_one_key_are_refused_naming_both(
    tmp_path: Path, s3_bucket: Any, where: str
) -> None:
    files = {"cat/a.jpg": IMAGES["coffee/cup.jpg"], "cat/a.png": IMAGES["astronaut/ast_00005.png"]}
    if where == "local":
        for name, data in files.items():
            (tmp_path / "f" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "f" / name).write_bytes(data)
        url, options = str(tmp_path / "f"), {}
    else:
        for name, data in files.items():
            s3_bucket.store("f").put(name, data)
        url, options = f"{s3_bucket.url}/f", s3_bucket.options()
    for refused in (
        lambda: Loader(url, batch_size=2, storage_options=options),
        lambda: stoker.pack(url, f"{url}-packed", storage_options=options),
    ):
        with pytest.raises(SourceError) as caught:
            refused()
        message = str(caught.value)
        assert "duplicate key 'cat/a'" in message
        assert f"{url}/cat/a.jpg" in message
        assert f"{url}/cat/a.png" in message
    report = stoker.pack(
        url,
        f"{url}-skip",
        storage_options=options,
        config=stoker.PackConfig(on_error="skip"),
    )
    assert [s["key"] for s in report.skipped] == ["cat/a"]
    kept = open_dataset(f"{url}-skip", storage_options=options)
    assert [s["jpg"] for s in kept.read_many([0])] == [files["cat/a.jpg"]]
