"""Removing a packed dataset: its index first, then the shards the index lists.

The index is the dataset's commit point (written last by pack), so it is deleted first: from
then on nothing opens a half-removed dataset. Only objects the dataset owns are deleted: the
index, the shards it names and pack's own state objects for them; anything else under the
prefix (other datasets, raw files) is left alone, and a prefix without an index is refused.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from stoker.format.index import DatasetIndex, read_index
from stoker.format.spec import ARRAYS_NAME, MANIFEST_NAME, PACK_STATE_DIR
from stoker.storage.base import Store


@dataclass(frozen=True, slots=True)
class RemovalPlan:
    """What removing a dataset deletes, in order.

    Attributes:
        url: The dataset's URL.
        index_objects: ``index.json`` and ``index.bin``, deleted first.
        shards: Shard objects, as the index lists them.
        state_objects: pack's resume state (``_stoker/...``) for those shards.
        shard_bytes: Total size of the shards, as the index records it.
    """

    url: str
    index_objects: tuple[str, ...]
    shards: tuple[str, ...]
    state_objects: tuple[str, ...]
    shard_bytes: int

    @property
    def objects(self) -> tuple[str, ...]:
        """Every object to delete, in deletion order."""
        return self.index_objects + self.shards + self.state_objects


def plan_removal(store: Store, *, index: DatasetIndex | None = None) -> RemovalPlan:
    """Say what :func:`remove_dataset` would delete; nothing is deleted.

    Raises:
        FileNotFoundError: There is no index at the store's root: not a packed dataset (or
            its pack did not finish), so nothing would be removed.
        ShardFormatError: The index is malformed; nothing would be removed.
    """
    index = index if index is not None else read_index(store)
    shards = tuple(entry.name for entry in index.shards)
    stems = (posixpath.basename(name).removesuffix(".tar") for name in shards)
    state = tuple(f"{PACK_STATE_DIR}/{stem}.json" for stem in stems)
    return RemovalPlan(
        url=store.url,
        index_objects=(MANIFEST_NAME, ARRAYS_NAME),
        shards=shards,
        state_objects=(*state, f"{PACK_STATE_DIR}/plan.json"),
        shard_bytes=sum(entry.size for entry in index.shards),
    )


def remove_dataset(store: Store, plan: RemovalPlan | None = None) -> RemovalPlan:
    """Delete a packed dataset: its index first, then its shards, then pack's state for them.

    Objects already gone are skipped (a removal that stopped half-way can be run again: once
    the index is gone, pass the plan made before). Nothing else under the prefix is touched.

    Args:
        store: The store rooted at the dataset.
        plan: What to delete, from :func:`plan_removal`; made from the index if not given.

    Returns:
        The plan that was carried out.

    Raises:
        FileNotFoundError: No plan was given and there is no index: nothing was removed.
    """
    plan = plan if plan is not None else plan_removal(store)
    for key in plan.objects:
        store.delete(key)
    return plan
