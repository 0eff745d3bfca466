"""A folder of files grouped into samples by name: the WebDataset layout before tarring.

``0001.npy``, ``0001.cls`` and ``0001.txt`` are the members ``npy``, ``cls`` and ``txt`` of
sample ``0001``, as WebDataset splits a tar member's name: the key is the path up to the
first ``.`` of the file name, the extension everything after it (``0001.seg.png`` is
member ``seg.png``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from stoker.errors import SourceError
from stoker.format.foreign.base import Sample, SampleRef
from stoker.format.foreign.locations import (
    LocationReader,
    is_remote,
    read_object,
    read_object_async,
)
from stoker.format.foreign.walk import hidden, regular_files, say_left_out
from stoker.format.spec import normalise_extension
from stoker.storage import StorageOptions
from stoker.storage.base import Store, key_problem

logger = logging.getLogger(__name__)

#: Base names (before their first dot) of files that describe a dataset rather than
#: belong to it: left out of the samples, and of the guess of a folder's format.
DOCUMENT_STEMS = ("readme", "license", "licence", "notice", "changelog", "citation")
_LABEL_READS_IN_FLIGHT = 64


def split_name(relative: str) -> tuple[str, str] | None:
    """``(sample path, extension)`` of a relative file path by the WebDataset rule, or
    None for a file name with no extension (or nothing before its first dot)."""
    folder, _, name = relative.rpartition("/")
    stem, dot, ext = name.partition(".")
    if not dot or not stem or not ext:
        return None
    return (f"{folder}/{stem}" if folder else stem), ext


def is_document(relative: str) -> bool:
    """Whether a file is a README, licence or the like (see :data:`DOCUMENT_STEMS`)."""
    return relative.rsplit("/", 1)[-1].partition(".")[0].lower() in DOCUMENT_STEMS


class GroupedFilesReader:
    """Read a folder (local, or a bucket prefix) of files grouped into samples by name.

    Every file under the folder, at any depth, is a member of the sample its path names
    (see :func:`split_name`); the sample's key is that path, as in a tar of the folder
    (folders keep their dots: ``v1.2/0001``; the name has none before its extension). The
    label of a sample is the integer in its ``cls`` member (read when listing, and
    written back as that integer), or -1 if it has none. Left out, and logged: hidden
    files and folders, files without an extension (as WebDataset does) and README,
    LICENSE and similar files (:data:`DOCUMENT_STEMS`). Extensions are lower-cased, with
    aliases folded (``JPEG`` -> ``jpg``). Objects are read by their keys as listed.

    Args:
        location: Local folder or bucket URL (``s3://bucket/train``).
        storage_options: See :func:`stoker.open_store`.
        on_error: ``"raise"`` stops at a ``cls`` that is not an integer, two files that
            give one member, or an unusable key; ``"skip"`` records it in :attr:`problems`
            and leaves the sample out.
        class_names: Class names indexed by label, if known.
    """

    def __init__(
        self,
        location: str,
        *,
        storage_options: Mapping[str, Any] | StorageOptions | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        class_names: Sequence[str] | None = None,
    ) -> None:
        self._location = location.rstrip("/")
        self._on_error = on_error
        self._files = LocationReader(storage_options)
        self._class_names = tuple(class_names or ())
        self._counts = ""
        self.problems: list[dict[str, str]] = []

    @property
    def description(self) -> str:
        """What was read, for summaries."""
        return f"grouped files {self._location}{self._counts}"

    @property
    def class_names(self) -> Sequence[str]:
        """Class names given to the reader; empty if none were."""
        return self._class_names

    @property
    def reads_remote(self) -> bool:
        """Whether the folder is in a bucket."""
        return is_remote(self._location)

    def requests(self) -> dict[str, int]:
        """Counters of the requests made so far (none for local files)."""
        return self._files.requests()

    def refs(self) -> list[SampleRef]:
        """List the folder, group its files into samples and read their ``cls`` members.

        Raises:
            SourceError: Nothing to read, or (with ``on_error="raise"``) a problem named
                under ``on_error``.
        """
        listed = self._list_remote() if self.reads_remote else self._list_local()
        groups: dict[str, list[tuple[str, int]]] = {}
        left_out: dict[str, list[str]] = {"without an extension": [], "documents": []}
        for relative, size in sorted(listed):
            split = split_name(relative)
            if is_document(relative):
                left_out["documents"].append(relative)
            elif split is None:
                left_out["without an extension"].append(relative)
            else:
                groups.setdefault(split[0], []).append((split[1], size))
        for what, names in left_out.items():
            if names:
                logger.warning(
                    "%s: left out %d file(s) %s: %s",
                    self._location,
                    len(names),
                    what,
                    ", ".join(repr(n) for n in names[:5]) + (", ..." if len(names) > 5 else ""),
                )
        if not groups:
            raise SourceError(
                f"{self._location}: no files grouped into samples found (files named "
                f"KEY.EXT: 0001.npy, 0001.cls, ...) among {len(listed):,} file(s)"
            )
        grouped = self._group_refs(groups)
        labels = self._labels([ref for ref in grouped if _cls_suffix(ref) is not None])
        refs = [
            labelled
            for ref in grouped
            if (labelled := self._labelled(ref, labels.get(ref.key))) is not None
        ]
        self._counts = f" ({len(refs):,} samples, {len(listed):,} files)"
        return refs

    def read(self, ref: SampleRef) -> Sample:
        """Read every member of one sample.

        Raises:
            SourceError: A file or object cannot be read; the message names it.
        """
        fields: dict[str, bytes] = {}
        for ext, suffix, data in self._members(ref):
            if data is None:
                if self.reads_remote:
                    data = read_object(self._folder_store(), self._member_key(ref, suffix))
                else:
                    data = self._files.read(f"{ref.location}.{suffix}")
            fields[ext] = data
        return Sample(ref.key, fields, ref.label)

    async def read_async(self, ref: SampleRef) -> Sample:
        """Async form of :meth:`read`: a bucket sample's members are read at once."""
        if not self.reads_remote:
            return self.read(ref)
        store = self._folder_store()
        members = self._members(ref)

        async def one(suffix: str, data: bytes | None) -> bytes:
            if data is not None:
                return data
            return await read_object_async(store, self._member_key(ref, suffix))

        found = await asyncio.gather(*(one(suffix, data) for _, suffix, data in members))
        fields = {ext: data for (ext, _, _), data in zip(members, found, strict=True)}
        return Sample(ref.key, fields, ref.label)

    def _members(self, ref: SampleRef) -> list[tuple[str, str, bytes | None]]:
        # (member name, file suffix, bytes known already): a cls is its label, as listed.
        return [
            (ext, suffix, str(ref.label).encode() if ext == "cls" else None)
            for suffix, ext in ((member[0], normalise_extension(member[0])) for member in ref.extra)
        ]

    def _problem(self, key: str, location: str, reason: str) -> None:
        if self._on_error == "raise":
            raise SourceError(f"{location}: {reason}")
        self.problems.append({"key": key, "source": location, "reason": reason})

    def _group_refs(self, groups: dict[str, list[tuple[str, int]]]) -> list[SampleRef]:
        refs: list[SampleRef] = []
        for path, members in groups.items():
            location = f"{self._location}/{path}"
            key = path  # the WebDataset key, as a tar of the folder has it (v1.2/0001)
            names = [normalise_extension(suffix) for suffix, _ in members]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                files = ", ".join(f"{path}.{suffix}" for suffix, _ in members)
                self._problem(key, location, f"files {files} give the member(s) {twice} twice")
                continue
            refs.append(
                SampleRef(
                    key=key,
                    location=location,
                    size=sum(size for _, size in members),
                    extra=tuple((suffix, size, 0) for suffix, size in members),
                )
            )
        return refs

    def _labels(self, refs: list[SampleRef]) -> dict[str, bytes]:
        # The cls member of each sample that has one, by key: all in flight for a bucket.
        suffixes = {ref.key: _cls_suffix(ref) or "cls" for ref in refs}
        if not self.reads_remote:
            return {r.key: self._files.read(f"{r.location}.{suffixes[r.key]}") for r in refs}
        store = self._folder_store()

        async def read_all() -> list[bytes]:
            slots = asyncio.Semaphore(_LABEL_READS_IN_FLIGHT)

            async def one(ref: SampleRef) -> bytes:
                async with slots:
                    key = self._member_key(ref, suffixes[ref.key])
                    return await read_object_async(store, key)

            return await asyncio.gather(*(one(ref) for ref in refs))

        found = store.engine.run(read_all()) if refs else []
        return {ref.key: data for ref, data in zip(refs, found, strict=True)}

    def _labelled(self, ref: SampleRef, data: bytes | None) -> SampleRef | None:
        if data is None:
            return ref
        text = data.strip()
        try:
            label = int(text)
        except ValueError:
            label = -2
        if label < -1:
            reason = f"cls member is not an integer >= -1: {text[:40]!r}"
            self._problem(ref.key, f"{ref.location}.cls", reason)
            return None
        return SampleRef(ref.key, ref.location, ref.size, label, extra=ref.extra)

    def _folder_store(self) -> Store:
        return self._files.store_at(self._location)

    def _member_key(self, ref: SampleRef, suffix: str) -> str:
        # The key as listed: a ref's location is the folder's URL, "/" and the sample path.
        root = f"{self._location}/"
        if not ref.location.startswith(root):
            raise SourceError(f"{ref.location}: not under the folder {self._location}")
        return f"{ref.location[len(root) :]}.{suffix}"

    def _list_local(self) -> list[tuple[str, int]]:
        root = Path(self._location.removeprefix("file://"))
        if not root.is_dir():
            raise SourceError(f"{root}: not a directory")
        return regular_files(root, problems=self.problems, on_dangling=self._problem, logger=logger)

    def _list_remote(self) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        left_out: list[str] = []
        for meta in self._folder_store().list(""):  # keys relative to the folder
            if hidden(meta.key):
                left_out.append(meta.key)
                continue
            problem = key_problem(meta.key)
            if problem is not None:  # repr: the key may hold a newline or a terminal escape
                reason = f"unusable key {meta.key!r} ({problem}): no request can name it"
                self._problem(meta.key, self._location, reason)
                continue
            found.append((meta.key, meta.size))
        say_left_out(logger, self._location, left_out)
        return found


def _cls_suffix(ref: SampleRef) -> str | None:
    return next((m[0] for m in ref.extra if normalise_extension(m[0]) == "cls"), None)
