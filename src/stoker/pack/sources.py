"""Choosing the foreign reader for a pack source: explicit, or guessed from its names."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from stoker.format.foreign.base import SampleReader, SampleRef
from stoker.format.foreign.locations import is_remote
from stoker.format.foreign.wds_tar import COMPRESSED_TAR_SUFFIXES
from stoker.pack.guess import folder_format, nothing_to_pack, sample_names
from stoker.storage import open_store
from stoker.storage.url import parse_url

logger = logging.getLogger(__name__)

SourceFormat = Literal[
    "auto", "imagefolder", "list", "webdataset", "tfrecord", "hdf5", "files", "parquet"
]
FORMATS: tuple[str, ...] = get_args(SourceFormat)

_TFRECORD = (".tfrecord", ".tfrecords", ".tfr")
_HDF5 = (".h5", ".hdf5", ".hdf")
_LIST = (".csv", ".jsonl", ".ndjson")
_PARQUET = ".parquet"


def guess_format(location: str, *, storage_options: Mapping[str, Any] | None = None) -> str:
    """Guess the format of ``location`` from its name, or from the names of its files.

    Raises:
        ValueError: A local ``location`` that does not exist.
        SourceError: A folder in which no reader finds samples; the message says what
            was looked for and what was found.
    """
    name = location.rstrip("/").lower()
    if name.endswith(_TFRECORD) or ".tfrecord-" in name:
        return "tfrecord"
    if name.endswith(_HDF5):
        return "hdf5"
    if name.endswith(_LIST):
        return "list"
    if name.endswith((".tar", *COMPRESSED_TAR_SUFFIXES)):  # the reader refuses compressed
        return "webdataset"
    if name.endswith(_PARQUET):  # a file, or a folder named so (as Spark writes them)
        return "parquet"
    if not is_remote(location) and not Path(location).is_dir():
        raise ValueError(f"{location}: no such file or directory")
    names = _top_level_names(location, storage_options)
    if any(n.endswith(_TFRECORD) or ".tfrecord-" in n for n in names):
        return "tfrecord"
    if names and all(n.endswith((".tar", *COMPRESSED_TAR_SUFFIXES)) for n in names):
        return "webdataset"
    if any(n.endswith(_HDF5) for n in names) and len(names) == 1:
        return "hdf5"
    sampled = sample_names(location, storage_options=storage_options)
    guessed = folder_format(sampled)
    if guessed is None:
        raise nothing_to_pack(location, sampled)
    return guessed


def open_reader(
    location: str,
    *,
    source_format: SourceFormat | str = "auto",
    storage_options: Mapping[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    class_names: Sequence[str] | None = None,
    allow_outside_list: bool = False,
) -> tuple[SampleReader, str]:
    """The reader for ``location`` and the format it reads (guessed when ``"auto"``).

    ``class_names`` go to the readers whose labels are numbers or names in the input
    (lists, WebDataset tars, grouped files, Parquet); ``allow_outside_list`` lets a list
    name files outside its folder (see :class:`~stoker.format.foreign.listfile.ListFileReader`).

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

        return ListFileReader(
            location,
            storage_options=storage_options,
            class_names=class_names,
            allow_outside=allow_outside_list,
        ), fmt
    if fmt == "webdataset":
        from stoker.format.foreign.wds_tar import WebDatasetTarReader

        return WebDatasetTarReader(
            location, storage_options=storage_options, class_names=class_names
        ), fmt
    if fmt == "tfrecord":
        from stoker.format.foreign.tfrecord import TFRecordReader

        return TFRecordReader(location, storage_options=storage_options), fmt
    if fmt == "hdf5":
        from stoker.format.foreign.hdf5 import HDF5Reader

        return HDF5Reader(location, storage_options=storage_options), fmt
    if fmt == "files":
        from stoker.format.foreign.grouped import GroupedFilesReader

        return GroupedFilesReader(
            location, storage_options=storage_options, on_error=on_error, class_names=class_names
        ), fmt
    if fmt == "parquet":
        from stoker.format.foreign.parquet import ParquetReader

        return ParquetReader(
            location, storage_options=storage_options, class_names=class_names
        ), fmt
    raise ValueError(f"unknown source format {source_format!r}; choose from {list(FORMATS)}")


def _top_level_names(location: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    # One listing request for a bucket, one directory read locally: enough to tell formats.
    if is_remote(location):
        listing = open_store(location, storage_options=storage_options).list_dir("")
        return [m.key.lower() for m in listing.objects]
    root = Path(location.removeprefix("file://"))
    return sorted(p.name.lower() for p in root.iterdir() if p.is_file())


def refuse_destination_in_source(source: str, destination: str) -> None:
    """Refuse a destination inside the source folder (or the folder itself): the next pack
    of that folder would read the shards as input, and a resumed one would mix them in.

    Raises:
        ValueError: Naming both.
    """
    src, dst = parse_url(source), parse_url(destination)
    if src.scheme == "file" and not Path(src.prefix).is_dir():
        return  # a list, tar or HDF5 file: no folder to poison
    if src.scheme != "file" and src.prefix.lower().endswith((*_TFRECORD, *_HDF5, *_LIST, ".tar")):
        return
    if src.contains(dst):
        raise ValueError(
            f"destination {dst} is inside the source folder {src}: packing that folder again "
            "would read these shards as input; pack into a folder outside it"
        )


def check_class_names(
    given: Sequence[str] | None, found: Sequence[str], refs: Sequence[SampleRef]
) -> list[str]:
    """The class names for the index: those given (checked against the input), else the
    reader's.

    Raises:
        ValueError: Names given twice, names that contradict the ones the input carries
            (an image folder's), or a label with no name.
    """
    if not given:
        return list(found)
    names = list(given)
    if len(set(names)) != len(names):
        raise ValueError(
            f"class names given twice: {sorted(n for n in set(names) if names.count(n) > 1)}"
        )
    if found and list(found) != names:
        raise ValueError(
            f"the input names its classes {list(found)[:10]}; the class names given, "
            f"{names[:10]}, differ (give none, or the same in the same order)"
        )
    top = max((ref.label for ref in refs), default=-1)
    if top >= len(names):
        ref = next(ref for ref in refs if ref.label == top)
        raise ValueError(
            f"{ref.location}: sample {ref.key!r} has label {top}, and {len(names)} class "
            "names were given"
        )
    return names
