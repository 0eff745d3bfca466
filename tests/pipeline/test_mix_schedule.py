"""Mixture schedules (issue 35, item 1): the mix follows its stages batch step by batch step
on every rank, each source keeps its place in its own stream, a state resumes exactly
mid-stage, and a Loader with other weights, stages or sources goes on from each source's
place: nothing replayed, nothing skipped; what cannot be honoured is refused by name."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import MixConfig, SourceConfig, TokenConfig, World
from stoker.format.token_writer import write_token_dataset
from stoker.pipeline.loader import Loader
from stoker.pipeline.mix_epochs import MixEpochs
from stoker.pipeline.mix_resume import Member
from stoker.pipeline.mix_schedule import Schedule, arrange
from stoker.pipeline.mix_streams import OwnOrder, Stream
from stoker.pipeline.mixing import MixedOrder, locate, mixed_epoch_order
from stoker.pipeline.order import OrderConfig, assign
from stoker.pipeline.sources import mix_parts
from stoker.pipeline.transforms import CenterCrop
from stoker.storage.open import open_store
from stoker.testing.images import write_packed_images

CONFIG = OrderConfig(seed=11, block_size=4, group_blocks=2)
BLOCK = 4
UNIT_BYTES = 100.0

# -- the pure parts: what a step draws, streams ----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.floats(0, 10), min_size=1, max_size=5).filter(lambda w: sum(w) > 0.01),
    batch=st.integers(1, 64),
    first=st.integers(0, 10**6),
    seed=st.integers(0, 2**32),
)
def test_every_step_draws_its_quota_rounded_and_the_run_stays_on_it(
    weights: list[float], batch: int, first: int, seed: int
) -> None:
    schedule = Schedule(weights, None, batch_size=batch, seed=seed)
    counts = schedule.counts(first, 500)
    quota = batch * np.asarray(weights) / sum(weights)
    assert (counts.sum(axis=1) == batch).all()
    assert (np.abs(counts - quota) < 1).all()  # each batch within one of its quota
    drift = np.abs(np.cumsum(counts, axis=0) - np.arange(1, 501)[:, None] * quota)
    assert drift.max() <= 8  # the golden-ratio offsets keep the run on its quota
    # A pure function of the step: asked again from anywhere, the same counts.
    assert np.array_equal(schedule.counts(first + 100, 50), counts[100:150])
    source, unit = arrange(counts[:3])
    for k in range(len(weights)):
        assert unit[source == k].tolist() == list(range(int(counts[:3, k].sum())))


def test_stages_begin_at_their_step_and_a_callable_is_asked_each_step() -> None:
    stages = ((5, (0.0, 1.0)), (9, (1.0, 0.0)))
    schedule = Schedule((1.0, 1.0), stages, batch_size=4, seed=0)
    counts = schedule.counts(0, 12)
    assert counts[:5].tolist() == [[2, 2]] * 5
    assert counts[5:9].tolist() == [[0, 4]] * 4
    assert counts[9:].tolist() == [[4, 0]] * 3
    asked = Schedule((1.0, 0.0), lambda step: (1.0, step), batch_size=4, seed=0)
    assert asked.counts(0, 2).tolist() == [[4, 0], [2, 2]]
    with pytest.raises(ValueError, match=r"stages\(3\)"):
        Schedule((1.0, 0.0), lambda step: (1.0, 2 - step), batch_size=4, seed=0).counts(0, 4)


def test_a_stream_gives_its_owed_stretches_then_goes_on() -> None:
    stream = Stream(((3, 5), (8, 9)), 20)
    assert stream.take(6).tolist() == [3, 4, 8, 20, 21, 22]
    assert stream.after(2) == Stream(((8, 9),), 20)
    assert stream.after(5) == Stream((), 22)
    # Three ranks of 4 units each took 1: each owes its other 3, then the stream goes on.
    cut = Stream((), 10).cut(3, 4, 1)
    assert cut == Stream(((11, 14), (15, 18), (19, 22)), 22)
    assert cut.count_below(16) == 4
    with pytest.raises(ValueError, match="taken"):
        Stream().cut(2, 3, 4)


# -- the accounting, as a Loader of each world does it: property tests --------------------------


def _epochs(
    sources: list[tuple[str, list[int]]], mix: MixConfig, world: int, batch: int
) -> MixEpochs:
    members = [Member(url, sum(s), tuple(s), BLOCK) for url, s in sources]

    def static(config: OrderConfig, epoch: int) -> MixedOrder:
        orders = [replace(config, block_size=BLOCK)] * len(members)
        return mixed_epoch_order([s for _, s in sources], orders=orders, mix=mix, epoch=epoch)

    epochs = MixEpochs(members, [UNIT_BYTES] * len(members), mix, static)
    epochs.bind(world, batch)
    return epochs


@dataclass
class Run:
    """A run over ranks, as Loaders make it: what each source delivered, by position in its
    stream, and each step's draws on every rank."""

    sources: list[tuple[str, list[int]]]
    mix: MixConfig
    world: int
    batch: int
    epoch: int = 0
    position: int = 0
    epochs: MixEpochs = field(init=False)
    delivered: dict[str, list[int]] = field(default_factory=dict)
    steps: list[tuple[int, ...]] = field(default_factory=list)  # every rank's ids, each step

    def __post_init__(self) -> None:
        self.epochs = _epochs(self.sources, self.mix, self.world, self.batch)

    def advance(self, batches: int) -> None:
        """Every rank delivers ``batches`` batches, epoch after epoch."""
        while batches:
            order = self.epochs.mixed_order(CONFIG, self.epoch)
            shares = [assign(order.order, rank=r, world_size=self.world) for r in range(self.world)]
            per_rank = len(shares[0].samples) // self.batch
            assert all(len(s.samples) == per_rank * self.batch and not s.padded for s in shares)
            take = min(batches, per_rank - self.position)
            plan = self.epochs.plan(CONFIG, self.epoch)
            mine = np.stack([s.samples.reshape(-1, self.batch) for s in shares])
            for t in range(self.position, self.position + take):
                for rank in range(self.world):
                    drawn = np.bincount(order.locate(mine[rank, t])[0], minlength=len(self.sources))
                    assert drawn.tolist() == plan.counts[t - plan.done].tolist()  # in step
                self.steps.append(tuple(mine[:, t].reshape(-1).tolist()))
                self._record(order, plan.part.starts, mine[:, t])
            batches -= take
            self.position += take
            if self.position == per_rank:
                self.epoch, self.position = self.epoch + 1, 0

    def _record(self, order: MixedOrder, starts: tuple[Stream, ...], ids: np.ndarray) -> None:
        sources, local = locate(ids.reshape(-1), order.offsets)
        grand = int(order.offsets[-1])
        for k, (url, shards) in enumerate(self.sources):
            own = OwnOrder(shards, CONFIG, url=url, block_size=BLOCK, unit_bytes=UNIT_BYTES)
            mine = ids.reshape(-1)[sources == k]
            epochs = starts[k].first // own.size + mine // grand
            for e, unit in zip(epochs.tolist(), local[sources == k].tolist(), strict=True):
                at = int(np.flatnonzero(own.order(e) == unit)[0])
                self.delivered.setdefault(url, []).append(e * own.size + at)

    def state(self) -> dict[str, Any]:
        entry = self.epochs.state_entry(CONFIG, self.epoch, self.position, False)
        state = {"epoch": self.epoch, "batches": self.position, "world_size": self.world}
        return {**state, "segments": [], **({} if entry is None else {"mix": entry})}

    def resumed(self, sources: list[tuple[str, list[int]]], mix: MixConfig, world: int) -> Run:
        """A run of other sources, mix or world, from this one's state."""
        run = Run(sources, mix, world, self.batch, epoch=self.epoch)
        resumed = run.epochs.resume(self.state(), CONFIG)
        assert resumed is not None
        assert resumed.position == self.position  # steps of the epoch, on any world
        run.position = self.position
        run.delivered = {url: list(p) for url, p in self.delivered.items()}
        return run

    def check(self) -> None:
        """Each source delivered every position of its stream once, up to where it is, but
        for those it still owes."""
        part = self.epochs.plan(CONFIG, self.epoch).part
        streams = part.streams() if self.position == 0 else part.starts
        for (url, _), stream in zip(self.sources, streams, strict=True):
            got = self.delivered.get(url, [])
            assert len(got) == len(set(got)), f"{url}: a unit twice in its own epoch"
            if self.position == 0:
                owed = {p for a, b in stream.owed for p in range(a, b)}
                assert set(got) | owed == set(range(stream.next)), url
                assert not set(got) & owed, url


@st.composite
def mixes(draw: st.DrawFn, sources: int) -> MixConfig:
    weights = st.lists(st.floats(0, 5), min_size=sources, max_size=sources).filter(
        lambda w: sum(w) > 0.05
    )
    steps = draw(st.lists(st.integers(0, 60), max_size=3, unique=True).map(sorted))
    stages = tuple((s, tuple(draw(weights))) for s in steps)
    replacement = draw(st.booleans())
    epoch_size = draw(st.none() | st.integers(1, 300))
    return MixConfig(
        weights=tuple(draw(weights)), stages=stages, replacement=replacement, epoch_size=epoch_size
    )


@st.composite
def runs(draw: st.DrawFn) -> tuple[Run, list[tuple[int, Any]]]:
    """A scheduled run, and its resumes: batches run before each, and what changed."""
    world, batch = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    shards = st.lists(st.integers(3 * batch, 40), min_size=1, max_size=3)  # a step on 3 ranks
    names = iter(f"mem://source-{i}" for i in range(100))
    sources = [(next(names), draw(shards)) for _ in range(draw(st.integers(1, 3)))]
    run = Run(sources, draw(mixes(len(sources))), world, batch)
    resumes = []
    for _ in range(draw(st.integers(1, 3))):
        before = draw(st.integers(0, 25))
        kept = [s for s in sources if draw(st.booleans())] or sources[:1]
        added = [(next(names), draw(shards)) for _ in range(draw(st.integers(0, 1)))]
        sources = kept + added
        world = draw(st.integers(1, 3))
        resumes.append((before, (sources, draw(mixes(len(sources))), world)))
    return run, resumes


@settings(max_examples=80, deadline=None)
@given(case=runs(), tail=st.integers(0, 40))
def test_every_unit_of_each_source_once_across_stages_resumes_and_changes(
    case: tuple[Run, list[tuple[int, Any]]], tail: int
) -> None:
    # Random stage schedules, resume points, weights, stages, world sizes, sources added and
    # removed: each source's stream is delivered in order, each position once, and at every
    # epoch's end all of it up to where the source stands but what it still owes.
    run, resumes = case
    for before, (sources, mix, world) in resumes:
        run.advance(before)
        run.check()
        run = run.resumed(sources, mix, world)
        run.check()
    run.advance(tail)
    run.advance(len(run.epochs.plan(CONFIG, run.epoch).counts) - run.position)  # to its end
    run.check()


@settings(max_examples=40, deadline=None)
@given(case=runs(), stop=st.integers(0, 30))
def test_a_resume_with_the_same_mix_and_world_delivers_what_the_run_would(
    case: tuple[Run, list[tuple[int, Any]]], stop: int
) -> None:
    run, _ = case
    whole = Run(run.sources, run.mix, run.world, run.batch)
    whole.advance(stop + 25)
    run.advance(stop)
    resumed = run.resumed(run.sources, run.mix, run.world)
    resumed.advance(25)
    assert run.steps + resumed.steps == whole.steps  # every rank's batches, step by step


# -- through the Loader: packed token datasets and images --------------------------------------


def _tokens(root: Path, name: str, documents: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    docs = [(f"d{i:04d}", rng.integers(2, 900, int(rng.integers(5, 40)))) for i in range(documents)]
    path = root / name
    write_token_dataset(open_store(str(path)), docs, dtype=np.dtype("uint16"), eos_id=1)
    return str(path)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tokens")
    return {
        "a": _tokens(root, "a", 40, 1),
        "b": _tokens(root, "b", 80, 2),
        "c": _tokens(root, "c", 30, 3),
    }


def _loader(urls: list[str], mix: MixConfig, **options: Any) -> Loader:
    source = SourceConfig(urls, mix=mix, tokens=TokenConfig(seq_len=7))
    loader = Loader(source, batch_size=4, seed=3, **options)
    loader.read_ahead = False
    return loader


def _units(
    loader: Loader, urls: list[str], batches: int | None = None
) -> list[list[tuple[str, int]]]:
    """Batches as (source URL, sequence) pairs."""
    out = []
    for batch in loader:
        offsets = np.concatenate([[0], np.cumsum([s.units() for s in mix_parts(loader.source)])])
        which, local = locate(batch["index"], offsets)
        out.append([(urls[k], int(i)) for k, i in zip(which.tolist(), local.tolist(), strict=True)])
        if batches is not None and len(out) == batches:
            break
    return out


def _flat(batches: list[list[tuple[str, int]]]) -> list[tuple[str, int]]:
    return [u for b in batches for u in b]


def test_stages_change_the_mix_at_their_step_on_every_rank(tokens: dict[str, str]) -> None:
    urls = [tokens["a"], tokens["b"]]
    mix = MixConfig(weights=(1, 1), stages=((3, (0, 1)), (6, (1, 3))))
    ranks = []
    for rank in range(2):
        with _loader(urls, mix, world=World(rank=rank, world_size=2)) as loader:
            steps = len(loader)
            batches = _units(loader, urls)
            assert len(batches) == steps > 6
        ranks.append(batches)
    assert len(ranks[0]) == len(ranks[1])
    for batches in ranks:  # the same step, the same stage, on each rank
        per_step = [Counter(url for url, _ in b) for b in batches]
        assert all(c == {urls[0]: 2, urls[1]: 2} for c in per_step[:3])
        assert all(c == {urls[1]: 4} for c in per_step[3:6])
        assert all(c == {urls[0]: 1, urls[1]: 3} for c in per_step[6:])
    every = _flat(ranks[0]) + _flat(ranks[1])
    assert len(set(every)) == len(every)  # no unit twice in the epoch


def test_a_resume_mid_stage_equals_the_uninterrupted_run_over_epochs(
    tokens: dict[str, str],
) -> None:
    urls = [tokens["a"], tokens["b"]]
    mix = MixConfig(weights=(3, 1), stages=((4, (1, 2)),))
    with _loader(urls, mix) as loader:
        whole = [_units(loader, urls) for _ in range(2)]
    with _loader(urls, mix) as loader:
        head = _units(loader, urls, batches=5)  # inside the second stage
        state = loader.state_dict()
    assert state["mix"]["step"] == 5
    assert json.loads(json.dumps(state)) == state  # a checkpoint's JSON, a few integers
    with _loader(urls, mix) as loader:
        loader.load_state_dict(state)
        assert loader.state_dict() == state  # batch 5 of the same epoch
        assert len(loader) == len(whole[0])
        rest = [_units(loader, urls) for _ in range(2)]
    assert head + rest[0] == whole[0]
    assert rest[1] == whole[1]  # and the epoch after goes on as it would have


def test_onto_another_world_size_each_source_goes_on_from_its_place(tokens: dict[str, str]) -> None:
    urls = [tokens["a"], tokens["b"]]
    mix = MixConfig(weights=(1, 1), stages=((2, (1, 2)),))
    with _loader(urls, mix) as loader:  # each source's stream, as one rank draws it
        whole = [u for _ in range(3) for u in _flat(_units(loader, urls))]
    states: list[dict[str, Any]] = []
    head: list[tuple[str, int]] = []
    for rank in range(2):
        with _loader(urls, mix, world=World(rank=rank, world_size=2)) as loader:
            head += _flat(_units(loader, urls, batches=3))
            states.append(loader.state_dict())
    assert states[0] == states[1]
    with _loader(urls, mix) as loader:  # one rank takes over what two left
        loader.load_state_dict(states[0])
        rest = _flat(_units(loader, urls))
    seen = head + rest
    assert len(seen) == len(set(seen))
    for url in urls:  # all of each source's stream up to where it is, once
        mine = {u for u in seen if u[0] == url}
        stream = [u for u in whole if u[0] == url]
        assert mine == set(stream[: len(mine)])


def test_weights_stages_and_sources_changed_at_resume_keep_each_place(
    tokens: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c = tokens["a"], tokens["b"], tokens["c"]
    mix = MixConfig(weights=(1, 1), stages=((4, (2, 1)),))
    with _loader([a, b], mix) as loader:
        head = _flat(_units(loader, [a, b], batches=6))
        state = loader.state_dict()
    with _loader([a, b], mix) as loader:
        full = [_flat(_units(loader, [a, b])) for _ in range(3)]
    # b's stream as an uninterrupted run gives it (the run draws more of b in later epochs).
    stream_b = [u for epoch in full for u in epoch if u[0] == b]
    changed = MixConfig(weights=(1, 1), stages=((8, (1, 0)),))  # b and a new c, no a
    with caplog.at_level(logging.INFO), _loader([c, b], changed) as loader:
        loader.load_state_dict(state)
        rest = _flat(_units(loader, [c, b])) + _flat(_units(loader, [c, b]))
        size_c = loader.mix_shares()[0].size
    dropped = [r.getMessage() for r in caplog.records if "no longer in the mix" in r.getMessage()]
    assert len(dropped) == 1
    assert a in dropped[0]
    got_b = [u for u in head + rest if u[0] == b]
    assert len(got_b) == len(set(got_b))
    assert got_b == stream_b[: len(got_b)]  # nothing replayed, nothing skipped, in order
    got_c = [u for u in rest if u[0] == c]
    assert len(got_c) > size_c  # c starts at its stream's beginning: each unit once a pass
    assert len(set(got_c[:size_c])) == size_c


def test_what_cannot_be_honoured_is_refused_naming_the_source(
    tokens: dict[str, str], tmp_path: Path
) -> None:
    a, b = tokens["a"], tokens["b"]
    mix = MixConfig(weights=(1, 1), stages=())
    with _loader([a, b], mix) as loader:
        _units(loader, [a, b], batches=2)
        state = loader.state_dict()
    bigger = dict(state["mix"])
    bigger["sources"] = [
        {**s, "units": s["units"] + 1} if s["url"] == b else s for s in bigger["sources"]
    ]
    with _loader([a, b], mix) as loader:
        loader.load_state_dict(state)
        with pytest.raises(ValueError, match=f"{b} held"):
            loader.load_state_dict({**state, "mix": bigger})
        assert loader.state_dict() == state  # a refused state changes nothing
    # A mix without stages saved inside an epoch: its order needs every source it draws.
    static = MixConfig(weights=(1, 1))
    with _loader([a, b], static) as loader:
        _units(loader, [a, b], batches=2)
        state = loader.state_dict()
    with _loader([a], MixConfig(weights=(1,))) as loader, pytest.raises(ValueError, match=b):
        loader.load_state_dict(state)


def test_a_mix_without_stages_changed_at_resume_finishes_its_epoch_then_follows(
    tokens: dict[str, str],
) -> None:
    a, b, c = tokens["a"], tokens["b"], tokens["c"]
    old = MixConfig(weights=(1, 1))
    with _loader([a, b], old) as loader:
        whole = _units(loader, [a, b])
    with _loader([a, b], old) as loader:
        head = _units(loader, [a, b], batches=4)
        state = loader.state_dict()
    new = MixConfig(weights=(1, 2, 1))
    with _loader([c, b, a], new) as loader:
        loader.load_state_dict(state)
        rest = _units(loader, [c, b, a])
        following = Counter(u for u, _ in _flat(_units(loader, [c, b, a])))
    assert head + rest == whole  # the interrupted epoch, as it began
    assert following[b] == 2 * following[a] == 2 * following[c]  # then the new mix


def test_a_schedule_resumed_into_a_mix_without_stages(tokens: dict[str, str]) -> None:
    a, b = tokens["a"], tokens["b"]
    scheduled = MixConfig(weights=(1, 1), stages=((2, (1, 3)),))
    with _loader([a, b], scheduled) as loader:
        whole = [u for _ in range(3) for u in _flat(_units(loader, [a, b]))]
    with _loader([a, b], scheduled) as loader:
        head = _flat(_units(loader, [a, b], batches=3))
        state = loader.state_dict()
    with _loader([b, a], MixConfig(weights=(1, 1))) as loader:
        loader.load_state_dict(state)
        rest = _flat(_units(loader, [b, a]))  # the rest of the epoch, at 1:1
        after = Counter(u for u, _ in _flat(_units(loader, [b, a])))  # then its own epochs
        shares = loader.mix_shares()
    seen = head + rest
    assert len(seen) == len(set(seen))
    for url in (a, b):  # each source from its place: its stream, up to where it is, once
        mine = {u for u in seen if u[0] == url}
        stream = [u for u in whole if u[0] == url]
        assert mine == set(stream[: len(mine)])
    assert Counter(u for u, _ in rest)[a] == Counter(u for u, _ in rest)[b]
    assert after[a] == after[b] == shares[0].samples


def test_bad_stages_are_refused() -> None:
    with pytest.raises(ValueError, match="not after"):
        MixConfig(weights=(1, 1), stages=((5, (1, 0)), (5, (0, 1))))
    with pytest.raises(ValueError, match="2 sources"):
        MixConfig(weights=(1, 1), stages=((5, (1, 0, 1)),))
    with pytest.raises(ValueError, match="samples_per_epoch"):
        MixConfig(samples_per_epoch=(1, 1), stages=())
    with pytest.raises(ValueError, match=">= 0"):
        MixConfig(weights=(1, 1), stages=((-1, (1, 0)),))
    with pytest.raises(TypeError, match="stages"):
        MixConfig(weights=(1, 1), stages="late")  # type: ignore[arg-type]
    assert MixConfig(stages=lambda step: (1, step % 2)).weights == (1.0, 0.0)


def test_a_schedule_of_packed_images(tmp_path: Path) -> None:
    a = write_packed_images(tmp_path / "a", files=24, classes=3, width=24, height=20)
    b = write_packed_images(tmp_path / "b", files=40, classes=2, width=24, height=20)
    mix = MixConfig(weights=(1, 0), stages=((2, (1, 1)),))
    options: dict[str, Any] = {"batch_size": 4, "seed": 1, "transform": CenterCrop(16)}
    with Loader(SourceConfig([a, b], mix=mix), **options) as loader:
        batches = list(loader)
    sources = [b["source"].tolist() for b in batches]
    assert sources[0] == sources[1] == [0, 0, 0, 0]
    assert all(s.count(0) == s.count(1) == 2 for s in sources[2:])
    keys = [(s, k) for b in batches for s, k in zip(b["source"], b["key"], strict=True)]
    assert len(keys) == len(set(keys))
    assert batches[0]["image"].shape == (4, 16, 16, 3)


def test_a_callable_gives_the_weights_of_each_step(tokens: dict[str, str]) -> None:
    urls = [tokens["a"], tokens["b"]]
    mix = MixConfig(stages=lambda step: (1, 0) if step % 2 else (0, 1))
    with _loader(urls, mix) as loader:
        batches = _units(loader, urls, batches=6)
    assert [{url for url, _ in b} for b in batches] == [{urls[1]}, {urls[0]}] * 3


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_loader_follows_the_schedule_and_resumes(tmp_path: Path, workers: int) -> None:
    pytest.importorskip("torch")
    from stoker.integrations.torch import TorchLoader

    a = write_packed_images(tmp_path / "a", files=24, classes=3, width=24, height=20)
    b = write_packed_images(tmp_path / "b", files=40, classes=2, width=24, height=20)
    mix = MixConfig(weights=(1, 0), stages=((2, (1, 1)),))
    options: dict[str, Any] = {"batch_size": 4, "seed": 1, "transform": CenterCrop(16)}
    with Loader(SourceConfig([a, b], mix=mix), **options) as loader:
        whole = [list(zip(x["source"].tolist(), x["key"], strict=True)) for x in loader]
    torch_loader = TorchLoader(SourceConfig([a, b], mix=mix), num_workers=workers, **options)
    assert len(torch_loader) == len(whole)  # the epoch's batches, asked before it runs
    got = [list(zip(x["source"].tolist(), x["key"], strict=True)) for x in torch_loader]
    assert got == whole
    # Stop after three batches (one into the second stage) and go on in a new TorchLoader.
    first = TorchLoader(SourceConfig([a, b], mix=mix), num_workers=workers, **options)
    it = iter(first)
    head = [
        list(zip(x["source"].tolist(), x["key"], strict=True)) for x in (next(it) for _ in range(3))
    ]
    state = first.state_dict()
    del it
    again = TorchLoader(SourceConfig([a, b], mix=mix), num_workers=workers, **options)
    again.load_state_dict(state)
    rest = [list(zip(x["source"].tolist(), x["key"], strict=True)) for x in again]
    assert head + rest == whole
