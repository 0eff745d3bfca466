"""An image folder (one sub-folder per class), local or under a bucket prefix."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from stoker.errors import SourceError
from stoker.format.foreign.base import Sample, SampleRef, sample_key
from stoker.format.foreign.locations import (
    LocationReader,
    is_remote,
    read_object,
    read_object_async,
)
from stoker.format.foreign.walk import hidden, regular_files, say_left_out
from stoker.format.spec import normalise_extension
from stoker.format.video import VIDEO_FIELDS
from stoker.storage import StorageOptions
from stoker.storage.base import ObjectMeta, Store, key_problem

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
#: Videos are read like images: one sample each, labelled by their class folder.
VIDEO_EXTENSIONS = tuple(f".{ext}" for ext in VIDEO_FIELDS)
#: What an image folder holds.
MEDIA_EXTENSIONS = IMAGE_EXTENSIONS + VIDEO_EXTENSIONS


class ImageFolderReader:
    """Reads ``ROOT/CLASS/IMAGE`` trees (videos too); labels are class folders in sorted order.

    Images directly under the root (no class folders) are read without labels; hidden
    folders and files (a part of the path starts with ``.``) are left out. A bucket
    prefix is listed with one request per class folder, all in flight at once, and each
    object is read by its key from the store rooted at the folder, as it was listed. A key
    that no request can name (a control character, an empty or ``..`` segment: S3 takes
    any bytes) is a problem like an empty class folder, and is also kept in
    :attr:`unusable`.

    Args:
        location: Local directory or bucket URL (``s3://bucket/train``).
        storage_options: See :func:`stoker.open_store`.
        on_error: ``"raise"`` stops at an empty class folder, a duplicate or an unusable
            key; ``"skip"`` records it in :attr:`problems` and goes on.
        store: The store rooted at a bucket ``location`` to list it with (its counters
            then count the listing); default: one opened from ``location``.
    """

    def __init__(
        self,
        location: str,
        *,
        storage_options: Mapping[str, Any] | StorageOptions | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        store: Store | None = None,
    ) -> None:
        self._location = location.rstrip("/")
        self._store = store
        self._on_error = on_error
        self._files = LocationReader(storage_options)
        self._class_names: list[str] = []
        self._count = 0
        self._videos = 0
        self.problems: list[dict[str, str]] = []
        #: ETag of each listed object of a bucket, by key relative to the folder.
        self.etags: dict[str, str | None] = {}
        #: The problems (also in :attr:`problems`) that are keys no request can name.
        self.unusable: list[dict[str, str]] = []

    @property
    def description(self) -> str:
        if not self._videos:
            return f"image folder {self._location} ({self._count:,} images)"
        images = self._count - self._videos
        return (
            f"image folder {self._location} ({images:,} images, {self._videos:,} videos)"
            if images
            else f"video folder {self._location} ({self._videos:,} videos)"
        )

    @property
    def class_names(self) -> Sequence[str]:
        return self._class_names

    def _problem(self, key: str, location: str, reason: str) -> None:
        if self._on_error == "raise":
            raise SourceError(f"{location}: {reason}")
        self.problems.append({"key": key, "source": location, "reason": reason})

    def requests(self) -> dict[str, int]:
        """Counters of the requests made so far (none for local files)."""
        return self._files.requests()

    def refs(self) -> list[SampleRef]:
        """List every image (each class folder listed concurrently for buckets)."""
        files, folders = self._list_remote() if is_remote(self._location) else self._list_local()
        if not files:
            raise SourceError(
                f"{self._location}: no images or videos found ({', '.join(MEDIA_EXTENSIONS)})"
            )
        classes = sorted({rel.split("/", 1)[0] for rel, _ in files if "/" in rel})
        folders_with_images = {rel.split("/", 1)[0] for rel, _ in files if "/" in rel}
        for folder in folders:
            if folder not in folders_with_images:
                self._problem(folder, f"{self._location}/{folder}", "class folder has no images")
        self._class_names = classes
        label_of = {name: i for i, name in enumerate(classes)}
        refs: list[SampleRef] = []
        seen: dict[str, str] = {}
        for rel, size in sorted(files):
            key = sample_key(rel)
            location = f"{self._location}/{rel}"
            if key in seen:
                self._problem(key, location, f"duplicate key {key!r} (also {seen[key]})")
                continue
            seen[key] = location
            label = label_of[rel.split("/", 1)[0]] if "/" in rel else -1
            refs.append(SampleRef(key=key, location=location, size=size, label=label))
        self._count = len(refs)
        self._videos = sum(r.location.lower().endswith(VIDEO_EXTENSIONS) for r in refs)
        return refs

    def _list_local(self) -> tuple[list[tuple[str, int]], list[str]]:
        root = Path(self._location.removeprefix("file://"))
        if not root.is_dir():
            raise SourceError(f"{root}: not a directory")
        folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not hidden(p.name))
        found = regular_files(
            root,
            problems=self.problems,
            on_dangling=self._problem,
            suffixes=MEDIA_EXTENSIONS,
            logger=logger,
        )
        return found, folders

    def _folder_store(self) -> Store:
        return self._store or self._files.store_at(self._location)

    def _list_remote(self) -> tuple[list[tuple[str, int]], list[str]]:
        store = self._folder_store()
        top = store.list_dir("")
        # Hidden folders and files are left out, as a local folder's are: a bucket synced
        # from a laptop has .ipynb_checkpoints/ and ._x.jpg, which a pack of the local
        # folder never saw (and an image-less .cache/ is no empty class folder).
        prefixes = [p for p in top.prefixes if not hidden(p)]
        left_out = [p for p in top.prefixes if hidden(p)]

        async def list_all() -> list[list[ObjectMeta]]:
            async def one(prefix: str) -> list[ObjectMeta]:
                found: list[ObjectMeta] = []
                async for page in store.list_async(prefix):
                    found.extend(page)
                return found

            return await asyncio.gather(*(one(p) for p in prefixes))

        metas = list(top.objects)  # hidden ones are left out below, with the folders' own
        if prefixes:
            for part in store.engine.run(list_all()):
                metas.extend(part)
        found = []
        for meta in metas:  # keys are relative to the store's root, the folder
            if hidden(meta.key):
                left_out.append(meta.key)
                continue
            if not meta.key.lower().endswith(MEDIA_EXTENSIONS):
                continue
            problem = key_problem(meta.key)
            if problem is not None:  # repr: the key may hold a newline or a terminal escape
                reason = f"unusable key {meta.key!r} ({problem}): no request can name it"
                self.unusable.append({"key": meta.key, "source": self._location, "reason": reason})
                self._problem(meta.key, self._location, reason)
                continue
            found.append((meta.key, meta.size))
            self.etags[meta.key] = meta.etag
        say_left_out(logger, self._location, left_out)
        return found, [p.rsplit("/", 1)[-1] for p in prefixes]

    @property
    def reads_remote(self) -> bool:
        return is_remote(self._location)

    def read(self, ref: SampleRef) -> Sample:
        if not self.reads_remote:
            return self._sample(ref, self._files.read(ref.location))
        return self._sample(ref, read_object(self._folder_store(), self._key_of(ref)))

    async def read_async(self, ref: SampleRef) -> Sample:
        if not self.reads_remote:
            return self._sample(ref, self._files.read(ref.location))
        store = self._folder_store()
        return self._sample(ref, await read_object_async(store, self._key_of(ref)))

    def _key_of(self, ref: SampleRef) -> str:
        # The key as listed: a ref's location is the folder's URL, "/" and the key.
        root = f"{self._location}/"
        if not ref.location.startswith(root):
            raise SourceError(f"{ref.location}: not under the image folder {self._location}")
        return ref.location[len(root) :]

    def _sample(self, ref: SampleRef, data: bytes) -> Sample:
        ext = normalise_extension(ref.location.rsplit(".", 1)[-1])
        fields = {ext: data}
        if ref.label >= 0:
            fields["cls"] = str(ref.label).encode()
        return Sample(key=ref.key, fields=fields, label=ref.label)
