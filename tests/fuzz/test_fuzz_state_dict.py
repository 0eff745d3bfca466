"""Fuzzing ``Loader.load_state_dict`` with hostile states.

A tiny dataset (21 samples in 3 shards, in a MemoryStore) is read by one or two ranks.
Each is handed a state: a plausible one (any epoch, any batch count, an earlier world size,
segments), one of those with a field replaced by arbitrary JSON-like values, deleted or
joined by an unknown key, or an arbitrary mapping or non-mapping. Loading it must either
raise a TypeError or ValueError whose message starts by naming the field (``state[...]``,
``state has ...``), or give ranks whose rest of the epoch continues it exactly: no sample
delivered twice, none the state says was consumed, none missing, none outside the dataset;
with the same world size and no segments, exactly the batches an uninterrupted run would
still have delivered.
"""

from __future__ import annotations

import functools
import io
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PIL import Image

from stoker import DecodeConfig, Loader, World
from stoker.format.foreign.base import Sample
from stoker.format.index import DatasetIndex
from stoker.format.reader import ShardDataset
from stoker.format.writer import ShardWriter
from stoker.pipeline.order import OrderConfig, Segment, consumed, share_length
from stoker.storage import MemoryStore

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
BATCH = 4
KEYS = ("epoch", "batches", "batch_size", "seed", "world_size", "segments")
SEED = 7
ORDER = OrderConfig(block_size=2, group_blocks=2, window=2, seed=SEED)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(-3, 30)
    | st.floats(allow_nan=True)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@functools.cache
def _dataset() -> ShardDataset:
    store = MemoryStore("fuzz-state")
    image = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(image, "JPEG")
    records = []
    for shard in range(3):
        writer = ShardWriter(store, f"shard-{shard:06d}.tar")
        for i in range(7):
            writer.add(Sample(key=f"s{shard}_{i}", fields={"jpg": image.getvalue(), "cls": b"0"}))
        records.append(writer.close())
    index = DatasetIndex.from_shards(records, class_names=["a"], fields={"jpg": 21, "cls": 21})
    return ShardDataset(store, index)


def _loader(rank: int, world_size: int) -> Loader:
    return Loader(
        _dataset(),
        batch_size=BATCH,
        order=ORDER,
        world=World(rank=rank, world_size=world_size),
        decode=DecodeConfig(threads=1),
    )


@st.composite
def plausible(draw: st.DrawFn) -> dict[str, Any]:
    segments = draw(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 8)), max_size=2))
    return {
        "epoch": draw(st.integers(0, 3) | st.integers(0, 2**64)),
        "batches": draw(st.integers(0, 7)),
        "batch_size": BATCH,
        "seed": SEED,
        "world_size": draw(st.integers(1, 4)),
        "segments": [[w, c * BATCH if draw(st.booleans()) else c] for w, c in segments],
    }


@st.composite
def states(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["plausible", "plausible", "mutated", "mutated", "random"]))
    if kind == "random":
        keys = st.sampled_from(KEYS) | st.text(max_size=6)
        return draw(st.dictionaries(keys, json_values, max_size=7) | json_values)
    state = draw(plausible())
    if kind == "mutated":
        for _ in range(draw(st.integers(1, 3))):
            action = draw(st.sampled_from(["replace", "replace", "delete", "add", "segment"]))
            key = draw(st.sampled_from(KEYS))
            if action == "replace":
                state[key] = draw(json_values)
            elif action == "delete":
                state.pop(key, None)
            elif action == "add":
                state[draw(st.text(max_size=6))] = draw(json_values)
            elif isinstance(state.get("segments"), list):
                state["segments"].append(draw(json_values))
    return state


def _load(loaders: list[Loader], state: Any) -> Exception | None:
    try:
        for loader in loaders:
            loader.load_state_dict(state)
    except (TypeError, ValueError) as exc:
        return exc
    return None


def _keys(ids: Any) -> set[str]:
    return {_dataset().index.keys[int(i)] for i in ids}


@FUZZ
@given(state=states(), world_size=st.integers(1, 2))
def test_a_loaded_state_is_refused_by_name_or_continues_its_epoch_exactly(
    state: Any, world_size: int
) -> None:
    loaders = [_loader(rank, world_size) for rank in range(world_size)]
    try:
        refused = _load(loaders, state)
        rests = [] if refused else [[k for b in loader for k in b["key"]] for loader in loaders]
    finally:
        for loader in loaders:
            loader.close()
    if refused is not None:
        assert str(refused).startswith("state"), refused  # it names the field
        event(f"refused: {type(refused).__name__}")
        return
    every = set(_dataset().index.keys)
    delivered = [k for rest in rests for k in rest]
    assert set(delivered) <= every  # nothing beyond the dataset
    if state["world_size"] == world_size and not state.get("segments"):
        # The same world: each rank delivers what an uninterrupted run still had to.
        event("resumed on the same world")
        for rank, rest in enumerate(rests):
            with _loader(rank, world_size) as fresh:
                fresh.set_epoch(state["epoch"])
                full = [k for batch in fresh for k in batch["key"]]
            # A state past the epoch's end is refused, not taken as an empty rest.
            assert state["batches"] <= -(-len(full) // BATCH)
            assert rest == full[state["batches"] * BATCH :]
        return
    # Another world: the rest is the epoch less what the state's segments consumed.
    event("resumed on another world, or after segments")
    segments = [Segment(w, c) for w, c in state.get("segments", [])]
    segments.append(Segment(state["world_size"], state["batches"] * BATCH))
    order = loaders[0].source.epoch_order(loaders[0].order_config, state["epoch"])
    for number, segment in enumerate(segments):
        # No segment claims more than each of its ranks could have had of what was left.
        left = len(order.samples) - len(consumed(order, segments[:number]))
        assert segment.world_size <= max(len(order.samples), world_size)
        assert (
            segment.consumed
            <= -(-share_length(left, world_size=segment.world_size) // BATCH) * BATCH
        )
    seen = _keys(consumed(order, segments))
    fresh = set(delivered)
    assert not fresh & seen  # nothing delivered twice
    assert fresh | seen == every  # nothing skipped
    # Padding repeats fewer samples than there are ranks, and only to even them out.
    assert len(delivered) - len(fresh) < world_size
