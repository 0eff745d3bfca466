"""Choosing the foreign reader for a pack source: explicit, or guessed from its names."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from stoker.format.foreign.base import SampleReader
from stoker.format.foreign.locations import is_remote
from stoker.storage import open_store

logger = logging.getLogger(__name__)

SourceFormat = Literal["auto", "imagefolder", "list", "webdataset", "tfrecord", "hdf5"]
FORMATS: tuple[str, ...] = ("auto", "imagefolder", "list", "webdataset", "tfrecord", "hdf5")

_TFRECORD = (".tfrecord", ".tfrecords", ".tfr")
_HDF5 = (".h5", ".hdf5", ".hdf")
_LIST = (".csv", ".jsonl", ".ndjson")


def guess_format(location: str, *, storage_options: Mapping[str, Any] | None = None) -> str:
    """Guess the format of ``location`` from its name, or from the names of its files."""
    name = location.rstrip("/").lower()
    if name.endswith(_TFRECORD) or ".tfrecord-" in name:
        return "tfrecord"
    if name.endswith(_HDF5):
        return "hdf5"
    if name.endswith(_LIST):
        return "list"
    if name.endswith(".tar"):
        return "webdataset"
    if not is_remote(location) and not Path(location).is_dir():
        raise ValueError(f"{location}: no such file or directory")
    names = _top_level_names(location, storage_options)
    if any(n.endswith(_TFRECORD) or ".tfrecord-" in n for n in names):
        return "tfrecord"
    if names and all(n.endswith(".tar") for n in names):
        return "webdataset"
    if any(n.endswith(_HDF5) for n in names) and len(names) == 1:
        return "hdf5"
    return "imagefolder"


def open_reader(
    location: str,
    *,
    source_format: SourceFormat | str = "auto",
    storage_options: Mapping[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
) -> tuple[SampleReader, str]:
    """The reader for ``location`` and the format it reads (guessed when ``"auto"``).

    Raises:
        ValueError: Unknown format.
        ImportError: The format needs an optional dependency that is missing.
    """
    fmt = source_format
    if fmt == "auto":
        fmt = guess_format(location, storage_options=storage_options)
        logger.info("%s: format guessed as %s", location, fmt)
    if fmt == "imagefolder":
        from stoker.format.foreign.imagefolder import ImageFolderReader

        return ImageFolderReader(location, storage_options=storage_options, on_error=on_error), fmt
    if fmt == "list":
        from stoker.format.foreign.listfile import ListFileReader

        return ListFileReader(location, storage_options=storage_options), fmt
    if fmt == "webdataset":
        from stoker.format.foreign.wds_tar import WebDatasetTarReader

        return WebDatasetTarReader(location, storage_options=storage_options), fmt
    if fmt == "tfrecord":
        from stoker.format.foreign.tfrecord import TFRecordReader

        return TFRecordReader(location, storage_options=storage_options), fmt
    if fmt == "hdf5":
        from stoker.format.foreign.hdf5 import HDF5Reader

        return HDF5Reader(location, storage_options=storage_options), fmt
    raise ValueError(f"unknown source format {source_format!r}; choose from {list(FORMATS)}")


def _top_level_names(location: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    # One listing request for a bucket, one directory read locally: enough to tell formats.
    if is_remote(location):
        listing = open_store(location, storage_options=storage_options).list_dir("")
        return [m.key.lower() for m in listing.objects]
    root = Path(location.removeprefix("file://"))
    return sorted(p.name.lower() for p in root.iterdir() if p.is_file())
