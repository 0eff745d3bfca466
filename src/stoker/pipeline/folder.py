"""Stream an unpacked image folder (class folders of images, in a bucket or local) directly.

The seed story, with no pack step: point the Loader at the bucket prefix you already have.
:func:`open_folder` lists the folder once (through
:class:`~stoker.format.foreign.imagefolder.ImageFolderReader`, the lister ``stoker pack``
uses: class folders listed concurrently, labels numbered in sorted folder order) and
:class:`FolderSource` serves it to the Loader like a packed dataset:

- the order is a pure function of the sorted listing, the seed and the epoch
  (:func:`stoker.pipeline.order.epoch_order` over the objects), so partition, resume and
  a change of world size work as for packed data;
- every object is its own read: a unit is fetched with one GET, many in flight at once on
  the store's I/O engine (the engine bounds them), so a block of consecutive objects
  saves nothing. Blocks are therefore single objects (see :meth:`FolderSource.order_for`):
  each epoch is a full permutation of the objects, and the first batch needs only its
  own objects;
- with ``CacheConfig(dir=...)`` the listing is kept in the node's disk cache (a rerun,
  another rank or worker skips the LIST) and a bucket's objects are read through it,
  versioned by the ETags of the listing. The cached listing is used as it is: files added
  to the folder later are not seen until the cache is emptied (``stoker cache clear
  DIR``); a file removed since, or rewritten with another size, is a named error of its
  sample (see :mod:`stoker.pipeline.listing`), which ``on_error="skip"`` skips;
- a bucket key that no request can name (a control character, an empty or ``..``
  segment: S3 takes any bytes) is left out at listing, with a warning that counts them
  and names a few (escaped), as ``stoker ls`` names them.

Packing is still faster (large ranged reads, a few requests per thousand images): the
first folder opened in a process logs a hint with the ``stoker pack`` command for it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import BucketNotFoundError, SourceError
from stoker.format.foreign.base import sample_key
from stoker.format.foreign.imagefolder import ImageFolderReader
from stoker.format.foreign.locations import is_remote
from stoker.format.spec import normalise_extension
from stoker.pipeline.batcher import Batcher, BatcherSettings
from stoker.pipeline.batching import BatchAssembler
from stoker.pipeline.config import CacheConfig
from stoker.pipeline.folder_advice import PACKED_SPEEDUP, names_at, no_dataset_error, pack_command
from stoker.pipeline.listing import (
    FolderListing,
    ListedStore,
    changed_object_error,
    dump_listing,
    listing_key,
    load_listing,
)
from stoker.pipeline.order import EpochOrder, OrderConfig, epoch_order
from stoker.storage.base import Store
from stoker.storage.cache import DiskCache
from stoker.storage.cache_once import fetch_once
from stoker.storage.cached import cache_reads
from stoker.storage.open import open_store

logger = logging.getLogger(__name__)

_hinted: set[str] = set()  # folders this process has given the pack hint for
_hint_lock = threading.Lock()


class FolderDataset:
    """An image folder's listing, opened for reading one object per sample.

    Offers what a Loader and its tools use of a packed
    :class:`~stoker.format.reader.ShardDataset`: ``url``, ``store``, ``class_names``,
    ``len()`` and :meth:`read_many`. Samples are dicts with ``"key"`` (:attr:`keys`, as ``stoker
    pack`` keys it), ``"label"`` and the image's bytes under its extension (``"jpg"``, ...).

    Args:
        store: The store rooted at the folder.
        objects: Object keys relative to the folder, sorted (``astronaut/ast_00004.jpg``).
        sizes: Their sizes in bytes.
        labels: Their labels (-1 for an image outside any class folder).
        class_names: Names of the labels: the class folders, sorted.
    """

    def __init__(
        self,
        store: Store,
        objects: Sequence[str],
        sizes: Sequence[int],
        labels: Sequence[int],
        class_names: Sequence[str],
    ) -> None:
        self._store = store
        self.objects = list(objects)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self._class_names = list(class_names)

    @property
    def keys(self) -> list[str]:
        """The samples' keys (``astronaut/ast_00004``), as the packed folder's index has them."""
        return [sample_key(key) for key in self.objects]

    @property
    def url(self) -> str:
        """The folder's URL."""
        return self._store.url

    @property
    def store(self) -> Store:
        """The store the objects are read from (through the disk cache, if any)."""
        return self._store

    @property
    def class_names(self) -> list[str]:
        """Class names, indexed by label: the class folders in sorted order (label 0 is the
        first folder, as ``stoker pack`` numbers them); -1 labels an image with no class."""
        return self._class_names

    def member_counts(self) -> dict[str, int] | None:
        """None: an image folder's samples are images (of any extension)."""
        return None

    def __len__(self) -> int:
        return len(self.objects)

    def __repr__(self) -> str:
        return f"FolderDataset({self.url!r}, images={len(self)})"

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Read images by number, concurrently on the store's I/O engine, in the order given.

        Raises:
            SourceError: An object of the listing is gone, or has another size (named).
        """
        samples = self._store.engine.run(self.read_many_async(indices))
        for sample in samples:
            if "error" in sample:
                raise sample["error"]
        return samples

    async def read_many_async(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Async form of :meth:`read_many`; an object gone or resized since the listing comes
        back as its sample with an ``"error"`` (a :class:`~stoker.errors.SourceError`
        naming it)."""
        return list(await asyncio.gather(*(self._read(int(i)) for i in indices)))

    async def _read(self, i: int) -> dict[str, Any]:
        key, size = self.objects[i], int(self.sizes[i])
        sample: dict[str, Any] = {"key": sample_key(key), "label": int(self.labels[i])}
        try:
            if self._store.cache is not None and size > 0:
                data = await self._store.get_range_async(key, start=0, end=size)
            else:
                data = await self._store.get_async(key)
        except FileNotFoundError as exc:
            sample["error"] = SourceError(
                f"{self.url}/{key}: gone since the folder was listed ({exc}); a listing kept "
                "in a disk cache is emptied with `stoker cache clear DIR`"
            )
            return sample
        except SourceError as exc:  # resized since the listing (ListedStore)
            sample["error"] = exc
            return sample
        if len(data) != size:
            sample["error"] = changed_object_error(
                self.url, key, listed=size, found=len(data), cached=self._store.cache is not None
            )
            return sample
        sample[normalise_extension(key.rsplit(".", 1)[-1])] = bytes(data)
        return sample


class FolderSource:
    """An unpacked image folder as a Loader's source: one unit per object (see the module).

    Args:
        dataset: The folder's listing.
    """

    def __init__(self, dataset: FolderDataset) -> None:
        self.dataset = dataset

    @property
    def url(self) -> str:
        return self.dataset.url

    @property
    def datasets(self) -> list[FolderDataset]:
        return [self.dataset]

    @property
    def extra_fields(self) -> tuple[str, ...]:
        return ()

    cut_first_batch = False
    row_fields = None
    one_get_per_unit = True

    def order_defaults(self, order: OrderConfig, *, units: int, unit_bytes: float) -> OrderConfig:
        return order  # blocks of one object at each epoch's order (order_for)

    def make_batcher(self, settings: BatcherSettings) -> Batcher:
        return BatchAssembler.for_source(self, settings)

    def shard_of(self, unit: int) -> str | None:
        return None  # the unit is an object of its own: its key names it

    @staticmethod
    def order_for(config: OrderConfig) -> OrderConfig:
        """The order settings this source really uses for ``config``.

        Each object is one GET whatever the blocks, so ``"blocks"`` mode takes blocks of
        one object and read groups of ``config.group_samples`` objects (the group size the
        Loader plans its fetches by): a full permutation of the folder each epoch, fetched
        a group at a time. ``"random"`` and ``"none"`` are kept.
        """
        if config.mode != "blocks":
            return config
        return replace(config, block_size=1, group_blocks=config.group_samples)

    def epoch_order(self, config: OrderConfig, epoch: int) -> EpochOrder:
        return epoch_order([len(self.dataset)], config=self.order_for(config), epoch=epoch)

    def units(self) -> int:
        return len(self.dataset)

    def unit_bytes(self) -> float:
        sizes = self.dataset.sizes
        return float(sizes.mean()) if len(sizes) else 1.0

    def shuffled(self) -> bool:
        # The order above has unrelated neighbours (blocks are single objects), so the
        # Loader adds no mixing window, which would hold hundreds of MB of single-object
        # GETs before the first batch.
        return True

    def nbytes(self, ids: Sequence[int]) -> int:
        return int(self.dataset.sizes[np.asarray(ids, dtype=np.int64)].sum())

    async def read_async(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        unique = list(dict.fromkeys(int(i) for i in ids))
        found = dict(zip(unique, await self.dataset.read_many_async(unique), strict=True))
        return [found[int(i)] for i in ids]


def open_folder(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None,
    cache: CacheConfig | None,
    page_bytes: int,
) -> FolderSource:
    """List an image folder (or take its listing from the disk cache) as a Loader's source.

    Args:
        url: The folder: a bucket prefix or a local directory of class folders.
        storage_options: See :func:`stoker.open_store`.
        cache: With ``cache.dir``, the listing is kept there and a bucket's objects are read
            through it.
        page_bytes: The disk cache's page when ``cache.page_bytes`` leaves it unset.

    Raises:
        FileNotFoundError: No image files under ``url`` (the message names the way on
            for what is there: ``stoker index`` for WebDataset tars).
        SourceError: A class folder without images, two files with one key, or a
            dangling link (each named).
    """
    location = str(url).rstrip("/") or str(url)
    store = open_store(location, storage_options=storage_options)
    remote = is_remote(location)
    directory = Path(cache.dir) if cache is not None and cache.dir is not None else None
    key = listing_key(store)
    listing = None
    if directory is not None and remote:  # listed by one process of the node at a time
        probe = DiskCache(directory, max_bytes=1 << 62)  # the listing only: its bound is moot
        try:
            found = fetch_once(
                probe, key, lambda: dump_listing(_list(location, store, storage_options))
            )
            listing = load_listing(found)
        finally:
            probe.close()
    if listing is None:
        listing = _list(location, store, storage_options)
    keys, sizes, labels, etags, class_names = listing
    if directory is not None and remote:
        max_bytes = cache.max_bytes if cache is not None else None
        disk = DiskCache.for_data(directory, data_bytes=int(sum(sizes)), max_bytes=max_bytes)
        disk.put(key, dump_listing(listing))
        versions = {k: (f"etag:{e}", s) for k, s, e in zip(keys, sizes, etags, strict=True) if e}
        store = cache_reads(
            ListedStore(store, dict(zip(keys, sizes, strict=True))),
            disk,
            page_bytes=(cache.page_bytes if cache else None) or page_bytes,
            objects=versions,
        )
    _hint(location, len(keys))
    return FolderSource(FolderDataset(store, keys, sizes, labels, class_names))


def _list(location: str, store: Store, storage_options: Mapping[str, Any] | None) -> FolderListing:
    reader = ImageFolderReader(
        location, storage_options=storage_options, on_error="skip", store=store
    )
    try:
        refs = reader.refs()
    except BucketNotFoundError:
        raise
    except SourceError as exc:  # with on_error="skip", only "no images" or "not a folder"
        raise no_dataset_error(location, exc, names=names_at(store)) from None
    if reader.unusable:
        shown = ", ".join(repr(p["key"]) for p in reader.unusable[:5])
        more = len(reader.unusable) - 5
        logger.warning(
            "%s: left out %d object(s) whose keys no request can name: %s%s",
            location,
            len(reader.unusable),
            shown,
            f" and {more} more" if more > 0 else "",
        )
    problems = [p for p in reader.problems if p not in reader.unusable]
    if problems:
        shown = "; ".join(f"{p['source']}: {p['reason']}" for p in problems[:5])
        more = len(problems) - 5
        raise SourceError(
            f"{location}: {len(problems)} problem(s) in the folder: {shown}"
            + (f"; and {more} more" if more > 0 else "")
            + ". Fix them, or pack it leaving them out: `stoker pack SRC DST --on-error skip`"
        )
    root = f"{location}/"
    keys = [ref.location.removeprefix(root) for ref in refs]
    etags = [reader.etags.get(key) for key in keys]
    return (
        keys,
        [ref.size for ref in refs],
        [ref.label for ref in refs],
        etags,
        list(reader.class_names),
    )


def _hint(url: str, images: int) -> None:
    with _hint_lock:
        if _hinted:
            return
        _hinted.add(url)
    logger.warning(
        "streaming the unpacked folder %s (%d images): one GET per image. Packed into "
        "shards (ranged reads of many images) it streamed %s in benchmarks/loader.py: "
        "%s, then point the loader at the packed copy",
        url,
        images,
        PACKED_SPEEDUP,
        pack_command(url),
    )
