"""Removing a packed dataset: its index first, then the shards the index lists.

The index is the dataset's commit point (written last by pack), so it is deleted first: from
then on nothing opens a half-removed dataset. Only objects the dataset owns are deleted: the
index, the shards pack wrote for it and pack's own state objects for them; anything else
under the prefix (other datasets, raw files) is left alone, and a prefix without an index is
refused.

Shards that pack did not write are the user's: ``stoker index`` gives existing WebDataset
tars an index in place, and removing that index must not take the tars with it. The
manifest says who wrote the shards: pack records its plan's id in ``packed_with``; an index
without one (indexed in place, or written by anything else) leaves its shards alone unless
the caller asks for them too.
"""

from __future__ import annotations

import asyncio
import posixpath
from dataclasses import dataclass, replace

from stoker.format.index import DatasetIndex, read_index
from stoker.format.spec import ARRAYS_NAME, MANIFEST_NAME, PACK_STATE_DIR
from stoker.storage.base import Store


@dataclass(frozen=True, slots=True)
class RemovalPlan:
    """What removing a dataset deletes, in order, and what it leaves.

    Attributes:
        url: The dataset's URL.
        index_objects: ``index.json`` and ``index.bin``, deleted first.
        shards: Shard objects deleted, as the index lists them.
        state_objects: pack's resume state (``_stoker/...``) for those shards.
        shard_bytes: Total size of the shards deleted, as the index records it.
        kept_shards: Shards the index lists that are left: pack did not write them (the
            dataset was indexed in place) and they were not asked for.
        kept_bytes: Their total size.
        missing_shards: Shards to delete that were not there (found by
            :func:`remove_dataset`): not counted as removed.
    """

    url: str
    index_objects: tuple[str, ...]
    shards: tuple[str, ...]
    state_objects: tuple[str, ...]
    shard_bytes: int
    kept_shards: tuple[str, ...] = ()
    kept_bytes: int = 0
    missing_shards: tuple[str, ...] = ()

    @property
    def objects(self) -> tuple[str, ...]:
        """Every object to delete, in deletion order."""
        return self.index_objects + self.shards + self.state_objects

    @property
    def removed_shards(self) -> int:
        """Shards deleted: those to delete that were there."""
        return len(self.shards) - len(self.missing_shards)


def written_by_pack(index: DatasetIndex) -> bool:
    """Whether pack wrote the dataset's shards (its manifest carries pack's plan id), rather
    than indexing shards that were already there."""
    return "plan_id" in index.packed_with and "indexed_from" not in index.packed_with


def plan_removal(
    store: Store, *, index: DatasetIndex | None = None, with_shards: bool = False
) -> RemovalPlan:
    """Say what :func:`remove_dataset` would delete; nothing is deleted.

    Args:
        store: The store rooted at the dataset.
        index: Its index, if already read.
        with_shards: Delete the shards even when pack did not write them (a dataset
            indexed in place); pack's own shards are always deleted.

    Raises:
        FileNotFoundError: There is no index at the store's root: not a packed dataset (or
            its pack did not finish), so nothing would be removed.
        ShardFormatError: The index is malformed; nothing would be removed.
    """
    index = index if index is not None else read_index(store)
    packed = written_by_pack(index)
    names = tuple(entry.name for entry in index.shards)
    total = sum(entry.size for entry in index.shards)
    state: tuple[str, ...] = ()
    if packed:
        stems = (posixpath.basename(name).removesuffix(".tar") for name in names)
        state = (
            *(f"{PACK_STATE_DIR}/{stem}.json" for stem in stems),
            f"{PACK_STATE_DIR}/plan.json",
        )
    removed = packed or with_shards
    return RemovalPlan(
        url=store.url,
        index_objects=(MANIFEST_NAME, ARRAYS_NAME),
        shards=names if removed else (),
        state_objects=state,
        shard_bytes=total if removed else 0,
        kept_shards=() if removed else names,
        kept_bytes=0 if removed else total,
    )


def remove_dataset(store: Store, plan: RemovalPlan | None = None) -> RemovalPlan:
    """Delete a packed dataset: its index first, then its shards, then pack's state for them.

    Objects already gone are skipped (a removal that stopped half-way can be run again: once
    the index is gone, pass the plan made before). Nothing else under the prefix is touched,
    nor are the shards of a dataset indexed in place unless the plan was made to include
    them (:func:`plan_removal`'s ``with_shards``).

    Args:
        store: The store rooted at the dataset.
        plan: What to delete, from :func:`plan_removal`; made from the index if not given.

    Returns:
        The plan that was carried out, with the shards that were not there (a delete
        succeeds either way, so each shard is asked for first, one HEAD request each).

    Raises:
        FileNotFoundError: No plan was given and there is no index: nothing was removed.
    """
    plan = plan if plan is not None else plan_removal(store)
    there = store.engine.run(_present(store, plan.shards))
    missing = tuple(name for name, found in zip(plan.shards, there, strict=True) if not found)
    for key in plan.objects:
        store.delete(key)
    return replace(plan, missing_shards=missing)


async def _present(store: Store, names: tuple[str, ...]) -> list[bool]:
    slots = asyncio.Semaphore(64)

    async def present(name: str) -> bool:
        async with slots:
            try:
                await store.head_async(name)
            except FileNotFoundError:
                return False
            return True

    return list(await asyncio.gather(*(present(name) for name in names)))
