"""Pack state in the destination: refusing another pack's (and anything else there),
resuming our own, and the last check before the commit point (see :mod:`stoker.pack.packer`
for the order of writes)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Collection
from typing import Any

from stoker.errors import StokerError
from stoker.format.spec import ARRAYS_NAME, MANIFEST_NAME, PACK_STATE_DIR
from stoker.format.writer import ShardRecord
from stoker.pack.plan import PackPlan
from stoker.storage import Store

logger = logging.getLogger(__name__)

_PLAN_KEY = f"{PACK_STATE_DIR}/plan.json"

#: Objects named in a refusal; the listing stops after one more.
_NAMED = 5


def refuse_occupied(store: Store, *, ours: Callable[[str], bool] | None = None) -> None:
    """Refuse a destination holding objects that are not ``ours`` (by default: any
    object), naming them: a pack writes only into an empty folder or prefix, or resumes
    its own pack there, so it never replaces what someone else put there.

    Raises:
        ValueError: Naming the store and the first objects found.
    """
    found: list[str] = []
    for meta in store.list(""):
        if ours is None or not ours(meta.key):
            found.append(meta.key)
            if len(found) > _NAMED:
                break
    if not found:
        return
    # repr: a key may hold any character, a newline too.
    named = ", ".join(map(repr, found[:_NAMED])) + (" and more" if len(found) > _NAMED else "")
    if ours is not None:
        raise ValueError(
            f"{store.url}: holds {named}, which the pack there (of the same input and "
            "arguments, that this run would resume) did not write: move these away, or "
            "pack elsewhere"
        )
    raise ValueError(
        f"{store.url}: not empty, it holds {named}; pack writes only into an empty folder "
        "or prefix (or one holding an unfinished pack of the same input and arguments, "
        "which it resumes): pack elsewhere, or move these away"
    )


def check_shards_present(store: Store, records: list[ShardRecord]) -> None:
    """Before the commit point: every shard the index will name exists, at its size."""
    engine = store.engine

    async def head_all() -> list[int]:
        return [m.size for m in await asyncio.gather(*(store.head_async(r.name) for r in records))]

    try:
        sizes = engine.run(head_all())
    except FileNotFoundError as exc:
        raise StokerError(f"a shard vanished before the index was written: {exc}") from exc
    for record, size in zip(records, sizes, strict=True):
        if size != record.size:
            raise StokerError(
                f"{store.url}/{record.name} is {size} bytes, its record says {record.size}; "
                f"delete {PACK_STATE_DIR}/ and pack again"
            )


def refuse_foreign(store: Store, plan: PackPlan, description: str) -> dict[str, Any] | None:
    """Refuse a destination that holds another pack, or anything but a pack (see
    :func:`refuse_occupied`); return the state of this plan's unfinished or finished pack
    there, or None when the destination is empty. Nothing is written.

    Raises:
        StokerError: The destination holds a pack of other input or arguments (naming the
            arguments that differ).
        ValueError: It holds anything else and no pack.
    """
    try:
        existing: dict[str, Any] = json.loads(bytes(store.get(_PLAN_KEY)))
    except FileNotFoundError:
        refuse_occupied(store)
        return None
    if existing.get("plan_id") != plan.plan_id:
        raise StokerError(
            f"{store.url} already holds a pack of other input or arguments "
            f"({_differences(existing, plan, description)}); pack into a new "
            f"destination or delete the old one first"
        )
    return existing


def resume_state(
    store: Store, plan: PackPlan, fmt: str, description: str, *, shard_keys: Collection[str]
) -> dict[int, bytes]:
    """Records of shards finished by an earlier run of the same plan.

    Args:
        store: The destination.
        plan: This pack's plan.
        fmt: The source's format, recorded.
        description: The source, recorded.
        shard_keys: The keys of this plan's shards.

    Raises:
        StokerError: The destination holds a pack of other input or arguments.
        ValueError: It holds anything else that is not this pack's (see
            :func:`refuse_occupied`).
    """
    existing = refuse_foreign(store, plan, description)
    if existing is None:
        state = {
            "plan_id": plan.plan_id,
            "shards": len(plan.shards),
            "format": fmt,
            "source": description,
            "settings": plan.settings,
            "listing_id": plan.listing_id,
            "inputs": sum(len(shard) for shard in plan.shards),
        }
        store.put(_PLAN_KEY, json.dumps(state).encode())
        return {}
    owned = {MANIFEST_NAME, ARRAYS_NAME, *shard_keys}
    refuse_occupied(store, ours=lambda key: key in owned or key.startswith(f"{PACK_STATE_DIR}/"))
    done: dict[int, bytes] = {}
    for meta in store.list(PACK_STATE_DIR):
        name = meta.key.rsplit("/", 1)[-1]
        if name.startswith("shard-") and name.endswith(".json"):
            number = int(name[len("shard-") : -len(".json")])
            if number < len(plan.shards):
                done[number] = bytes(store.get(meta.key))
    if done:
        logger.info(
            "%s: resuming; %d of %d shards already complete", store.url, len(done), len(plan.shards)
        )
    return done


def _differences(existing: dict[str, Any], plan: PackPlan, description: str) -> str:
    """What differs between the pack in the destination and this one, for the refusal."""
    before = existing.get("settings")
    if not isinstance(before, dict):  # a plan.json from before settings were recorded
        return f"plan {existing.get('plan_id')}, this one {plan.plan_id}"
    before, after = _flat(before), _flat(plan.settings)
    found = []
    for name in sorted(set(before) | set(after)):
        then, now = before.get(name), after.get(name)
        if then != now:
            found.append(f"{name}: {json.dumps(then)} then, {json.dumps(now)} now")
    if existing.get("listing_id") != plan.listing_id:
        inputs = sum(len(shard) for shard in plan.shards)
        found.append(
            f"input: {existing.get('source')!r} ({existing.get('inputs')} inputs) then, "
            f"{description!r} ({inputs} inputs) now"
        )
    return "; ".join(found) or f"plan {existing.get('plan_id')}, this one {plan.plan_id}"


def _flat(settings: dict[str, Any]) -> dict[str, Any]:
    # {"images": {"quality": 90}} -> {"images.quality": 90}: names a user can map to flags.
    flat: dict[str, Any] = {}
    for name, value in settings.items():
        if isinstance(value, dict):
            flat.update((f"{name}.{inner}", v) for inner, v in value.items())
        else:
            flat[name] = value
    return flat
