"""Telling a folder's layout from the names of its first files.

An image folder holds images, in class folders or at its top; a folder of grouped files
holds samples whose files share a name (``0001.jpg`` with ``0001.txt``) or are no images
(``0001.npy``). :func:`folder_format` decides on the names alone, so a guess costs one
listing request for a bucket, however large the folder.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.grouped import is_document, split_name
from stoker.format.foreign.imagefolder import MEDIA_EXTENSIONS
from stoker.format.foreign.locations import is_remote
from stoker.format.foreign.walk import hidden, walk_local
from stoker.format.spec import ARRAYS_NAME, MANIFEST_NAME, PACK_STATE_DIR
from stoker.storage import open_store

#: Files a guess looks at: one listing page of a bucket.
SAMPLE_FILES = 1000
# Names that say nothing about a layout: lists and documents kept beside the data.
_NEUTRAL = (".csv", ".tsv", ".jsonl", ".ndjson", ".md", ".rst", ".html", ".pdf")
# Containers that other readers take whole, not as members of a sample.
_CONTAINERS = (".tar", ".tfrecord", ".tfrecords", ".tfr", ".h5", ".hdf5", ".hdf", ".parquet")
_IMAGE_SUFFIXES = tuple(ext.lstrip(".") for ext in MEDIA_EXTENSIONS)
# stoker's own index beside tars it indexed in place (and a pack's state): not input.
_STOKER_FILES = (MANIFEST_NAME, ARRAYS_NAME)

LOOKED_FOR = (
    f"images or videos ({', '.join(MEDIA_EXTENSIONS)}) in class folders or at the top "
    "(imagefolder); "
    "files grouped into samples by name, 0001.npy, 0001.cls, 0001.txt (files); .parquet "
    "files (parquet); .tar files (webdataset); .tfrecord files (tfrecord); one .h5 file "
    "(hdf5)"
)


def sample_names(
    location: str, *, storage_options: Mapping[str, Any] | None = None, limit: int = SAMPLE_FILES
) -> list[str]:
    """The first ``limit`` files under ``location``, at any depth, as paths relative to
    it; hidden files and folders are left out."""
    names: list[str] = []
    for name in _walk_names(location, storage_options):
        if not hidden(name):
            names.append(name)
            if len(names) >= limit:
                break
    return names


def folder_format(names: Sequence[str]) -> str | None:
    """``"parquet"``, ``"webdataset"``, ``"files"`` or ``"imagefolder"`` for a folder
    holding ``names`` (relative paths), or None if no reader would find samples in them.

    Grouped files win when more samples have a member that is no image than samples are
    images alone: an image folder with a README or a labels list is still an image
    folder, and one whose images each have a caption file is grouped files.
    """
    usable = [
        n
        for n in names
        if not is_document(n)
        and not n.lower().endswith(_NEUTRAL)
        and n not in _STOKER_FILES
        and not n.startswith(f"{PACK_STATE_DIR}/")
    ]
    if any(n.lower().endswith(".parquet") for n in usable):
        return "parquet"
    if usable and all(n.lower().endswith(".tar") for n in usable):
        return "webdataset"
    groups: dict[str, list[str]] = {}
    for name in usable:
        split = split_name(name)
        if split is not None and not name.lower().endswith(_CONTAINERS):
            groups.setdefault(split[0], []).append(split[1].lower())
    images = sum(
        all(ext.rsplit(".", 1)[-1] in _IMAGE_SUFFIXES for ext in exts) for exts in groups.values()
    )
    if len(groups) - images > images:
        return "files"
    return "imagefolder" if images else None


def nothing_to_pack(location: str, names: Sequence[str]) -> SourceError:
    """The error for a folder in which no reader finds samples: what was looked for, and
    what was there."""
    found = (
        f"found {len(names):,} file(s) ({', '.join(repr(n) for n in names[:5])}"
        f"{', ...' if len(names) > 5 else ''})"
        if names
        else "found no files (hidden ones are left out)"
    )
    return SourceError(
        f"{location}: nothing to pack: looked for {LOOKED_FOR}; {found}. A .csv or .jsonl "
        "list is packed by naming the list itself; --format names the reader to use"
    )


def _walk_names(location: str, storage_options: Mapping[str, Any] | None) -> Iterator[str]:
    if is_remote(location):
        for meta in open_store(location, storage_options=storage_options).list(""):
            yield meta.key
        return
    for _, relative in walk_local(Path(location.removeprefix("file://"))):
        yield relative
