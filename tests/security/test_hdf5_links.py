"""HDF5 inputs may not make packing read other local files.

An HDF5 file can point outside itself: external links, virtual datasets whose sources are
other files, and datasets whose raw data lives in external binary files. h5py follows all
three silently, so a file from someone else could make ``stoker pack`` copy any readable
local file into a dataset. The reader refuses them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

import stoker
from stoker.errors import SourceError
from stoker.format.foreign.hdf5 import HDF5Reader

PIXELS = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)


def _other_file(tmp_path: Path) -> Path:
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["secret"] = PIXELS
        f["group/secret"] = PIXELS
        f["labels"] = np.array([0, 1])
    return other


def external_link(f: h5py.File, other: Path) -> str:
    f["images"] = h5py.ExternalLink(str(other), "/secret")
    return "images"


def external_group(f: h5py.File, other: Path) -> str:
    f["outside"] = h5py.ExternalLink(str(other), "/group")
    return "outside/secret"


def virtual_dataset(f: h5py.File, other: Path) -> str:
    layout = h5py.VirtualLayout(shape=PIXELS.shape, dtype=np.uint8)
    layout[:] = h5py.VirtualSource(str(other), "secret", shape=PIXELS.shape)
    f.create_virtual_dataset("images", layout)
    return "images"


def external_storage(f: h5py.File, other: Path) -> str:
    raw = other.with_suffix(".raw")
    raw.write_bytes(PIXELS.tobytes())
    f.create_dataset("images", shape=PIXELS.shape, dtype=np.uint8, external=[(str(raw), 0, 32)])
    return "images"


@pytest.mark.parametrize("make", [external_link, external_group, virtual_dataset, external_storage])
def test_images_from_outside_the_file_are_refused(
    make: Callable[[h5py.File, Path], str], tmp_path: Path
) -> None:
    other = _other_file(tmp_path)
    path = tmp_path / "input.h5"
    with h5py.File(path, "w") as f:
        name = make(f, other)
    with h5py.File(path, "r") as f:  # h5py itself does read the other file
        assert np.array_equal(f[name][()], PIXELS)
    reader = HDF5Reader(str(path), images=name)
    with pytest.raises(SourceError, match=r"input\.h5: .*(external link|other files).*not allowed"):
        reader.refs()
    reader.close()
    if name == "images":  # the name pack reads by default
        with pytest.raises(SourceError, match="not allowed"):
            stoker.pack(str(path), str(tmp_path / "out"), source_format="hdf5")


def test_labels_from_outside_the_file_are_refused(tmp_path: Path) -> None:
    other = _other_file(tmp_path)
    path = tmp_path / "input.h5"
    with h5py.File(path, "w") as f:
        f["images"] = PIXELS
        f["labels"] = h5py.ExternalLink(str(other), "/labels")
    with HDF5Reader(str(path)) as reader, pytest.raises(SourceError, match="external link"):
        reader.refs()


def test_links_inside_the_file_still_work(tmp_path: Path) -> None:
    path = tmp_path / "input.h5"
    with h5py.File(path, "w") as f:
        f["data/pixels"] = PIXELS
        f["images"] = h5py.SoftLink("/data/pixels")
        f["labels"] = np.array([1, 0])
    with HDF5Reader(str(path)) as reader:
        assert [ref.label for ref in reader.refs()] == [1, 0]
