"""TokenLoader(packing="best-fit"): documents whole in sequences (a longer one cut in
order), every document token delivered once an epoch, padding with the pad id and -100 in
``labels`` and ``targets``, document boundaries at the pieces, the same batches for the
same seed, resume equal to an uninterrupted run, equal counts on every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.format.token_writer import write_token_dataset
from stoker.pipeline.config import SourceConfig
from stoker.pipeline.mixing import MixConfig
from stoker.pipeline.packed_tokens import PackedTokenSource
from stoker.pipeline.token_batcher import IGNORE_INDEX, TokenConfig
from stoker.pipeline.token_loader import TokenLoader
from stoker.pipeline.world import World
from stoker.storage.open import open_store

SEQ_LEN = 31  # sequences of 32 tokens
SPAN = SEQ_LEN + 1
EOS = 1
WINDOW = 24  # documents packed together: several windows, several blocks


def _pack(path: Path, lengths: list[int], *, eos: bool = True) -> np.ndarray:
    """Write documents of ``lengths`` tokens (eos included) as a token dataset in small
    shards; return the stream."""
    rng = np.random.default_rng(len(lengths))
    docs = [rng.integers(2, 60_000, n - eos) for n in lengths]
    keyed = [(f"doc{i:05d}", d) for i, d in enumerate(docs)]
    eos_id = EOS if eos else None
    write_token_dataset(
        open_store(str(path)), keyed, dtype=np.dtype("uint16"), eos_id=eos_id, shard_tokens=1_500
    )
    return np.concatenate([np.append(d, EOS) if eos else d for d in docs])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    path = tmp_path_factory.mktemp("packed")
    rng = np.random.default_rng(1)
    lengths = rng.integers(2, 100, 200).tolist()  # a third longer than a sequence
    return path, _pack(path, lengths)


def _loader(
    path: Path, *, rank: int = 0, world_size: int = 1, seed: int = 3, **options: Any
) -> TokenLoader:
    options.setdefault("batch_size", 4)
    return TokenLoader(
        path,
        seq_len=SEQ_LEN,
        documents=True,
        packing="best-fit",
        packing_window=WINDOW,
        seed=seed,
        world=World(rank=rank, world_size=world_size),
        **options,
    )


def _source(loader: TokenLoader) -> PackedTokenSource:
    assert isinstance(loader.source, PackedTokenSource)
    return loader.source


def _check_batch(batch: dict[str, Any], stream: np.ndarray, source: PackedTokenSource) -> None:
    """Each row is its sequence's pieces of the stream end to end, then padding: the pad
    id in ``input_ids``, -100 in ``labels`` and ``targets``; boundaries at the pieces."""
    pad = source.config.pad_id
    for row, k in enumerate(batch["index"].tolist()):
        starts, lengths = source.plan.pieces(k)
        real = int(lengths.sum())
        tokens = np.concatenate([stream[s : s + n] for s, n in zip(starts, lengths, strict=True)])
        padded = np.concatenate([tokens, np.full(SPAN - real, pad)])
        assert np.array_equal(batch["input_ids"][row], padded[:-1])
        labels, targets = batch["labels"][row], batch["targets"][row]
        shown = min(real, SEQ_LEN)  # a full sequence's last token is a target only
        assert np.array_equal(labels[:shown], padded[:shown])
        assert (labels[real:] == IGNORE_INDEX).all()
        assert np.array_equal(targets[: real - 1], padded[1:real])
        assert (targets[real - 1 :] == IGNORE_INDEX).all()
        cuts = np.concatenate([[0], np.cumsum(lengths)])
        cuts = cuts[cuts < SEQ_LEN]  # each piece, and the padding, starts at position 0
        assert np.flatnonzero(batch["position_ids"][row] == 0).tolist() == cuts.tolist()
        assert int(batch["doc_lens"][row].sum()) == SEQ_LEN
        assert batch["doc_lens"][row].tolist() == np.diff(np.append(cuts, SEQ_LEN)).tolist()
    assert batch["cu_seqlens"][-1] == len(batch["index"]) * SEQ_LEN


def _delivered_tokens(batches: list[dict[str, Any]], source: PackedTokenSource) -> np.ndarray:
    """Stream positions of every real token the batches delivered."""
    positions = []
    for batch in batches:
        for k in batch["index"].tolist():
            starts, lengths = source.plan.pieces(k)
            positions += [np.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)]
    return np.concatenate(positions)


def test_one_epoch_delivers_every_document_token_once_padded_and_masked(
    corpus: tuple[Path, np.ndarray],
) -> None:
    path, stream = corpus
    loader = _loader(path, drop_last=False)
    source = _source(loader)
    assert source.config.pad_id == EOS  # the dataset's end-of-text id by default
    assert len(source.plan.window_sequences) == -(-200 // WINDOW)
    batches = list(loader)
    for batch in batches:
        _check_batch(batch, stream, source)
    positions = _delivered_tokens(batches, source)
    assert np.array_equal(np.sort(positions), np.arange(len(stream)))  # each token once
    assert loader.dropped_sequences == 0
    assert loader.dropped_tokens == 0
    padding = sum(int((b["labels"] == IGNORE_INDEX).sum()) for b in batches)
    real_labels = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
    assert loader.padding_tokens == source.plan.padding_tokens
    assert real_labels + padding == loader.epoch_sequences * SEQ_LEN
    assert padding < 0.1 * real_labels


def test_a_document_longer_than_a_sequence_is_cut_in_order(
    corpus: tuple[Path, np.ndarray],
) -> None:
    path, _ = corpus
    source = _source(_loader(path))
    plan = source.plan
    owner = np.repeat(np.arange(plan.sequences), np.diff(plan.sequence_starts))
    doc_starts = source.doc_starts
    document = np.searchsorted(doc_starts, plan.starts, side="right") - 1
    long_docs = np.flatnonzero(np.diff(doc_starts) > SPAN)
    assert len(long_docs) > 20
    for doc in long_docs.tolist():
        mine = np.flatnonzero(document == doc)
        mine = mine[np.argsort(plan.starts[mine])]
        assert (plan.lengths[mine[:-1]] == SPAN).all()
        assert (np.diff(owner[mine]) > 0).all()
    short = np.flatnonzero(np.diff(doc_starts) <= SPAN)
    assert all(np.count_nonzero(document == d) == 1 for d in short.tolist())  # whole


def test_the_same_seed_gives_the_same_batches_and_another_seed_others(
    corpus: tuple[Path, np.ndarray],
) -> None:
    path, _ = corpus
    one = [b["index"] for b in _loader(path)]
    two = [b["index"] for b in _loader(path)]
    other = [b["index"] for b in _loader(path, seed=4)]
    assert all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(one, other, strict=True))


FIELDS = ("index", "input_ids", "labels", "targets", "position_ids", "cu_seqlens")


def _batches_equal(
    one: list[dict[str, Any]], two: list[dict[str, Any]], fields: tuple[str, ...] = FIELDS
) -> bool:
    return len(one) == len(two) and all(
        np.array_equal(a[f], b[f]) for a, b in zip(one, two, strict=True) for f in fields
    )


def _copied(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in batch.items()}


@settings(max_examples=12, deadline=None)
@given(world_size=st.integers(1, 3), stop=st.integers(0, 12), batch_size=st.integers(1, 5))
def test_property_resume_mid_epoch_equals_an_uninterrupted_run(
    corpus: tuple[Path, np.ndarray], world_size: int, stop: int, batch_size: int
) -> None:
    path, _ = corpus
    for rank in range(world_size):
        options: dict[str, Any] = {"rank": rank, "world_size": world_size}
        whole = [_copied(b) for b in _loader(path, batch_size=batch_size, **options)]
        cut = min(stop, len(whole))
        first = _loader(path, batch_size=batch_size, **options)
        it = iter(first)
        head = [_copied(next(it)) for _ in range(cut)]
        state = first.state_dict()
        resumed = _loader(path, batch_size=batch_size, **options)
        resumed.load_state_dict(state)
        assert _batches_equal(head + [_copied(b) for b in resumed], whole)


@pytest.mark.parametrize("drop_last", [True, False])
def test_two_ranks_get_equal_counts_of_disjoint_sequences(
    corpus: tuple[Path, np.ndarray], drop_last: bool
) -> None:
    path, stream = corpus
    loaders = [_loader(path, rank=r, world_size=2, drop_last=drop_last) for r in range(2)]
    epochs = [list(loader) for loader in loaders]
    assert len(epochs[0]) == len(epochs[1]) > 0
    assert [len(b["index"]) for b in epochs[0]] == [len(b["index"]) for b in epochs[1]]
    ids = [np.concatenate([b["index"] for b in batches]) for batches in epochs]
    assert not set(ids[0].tolist()) & set(ids[1].tolist())
    units = loaders[0].source.units()
    assert len(ids[0]) + len(ids[1]) == loaders[0].epoch_sequences
    assert units - loaders[0].epoch_sequences == loaders[0].dropped_sequences
    assert loaders[0].dropped_sequences < 2 + (2 * 3 if drop_last else 0)
    source = _source(loaders[0])
    for batch in epochs[0][:3]:
        _check_batch(batch, stream, source)


def test_pad_id_given_unsigned_dtypes_mixes_and_concat_settings_are_refused(
    corpus: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    path, _ = corpus
    batch = next(iter(_loader(path, pad_id=7)))  # a pad id of one's own
    real = (batch["labels"] != IGNORE_INDEX).sum(axis=1)
    for row, count in enumerate(real.tolist()):
        assert (batch["input_ids"][row, count:] == 7).all()
    with pytest.raises(ValueError, match="dtype must be 'int64' or 'int32'"):
        TokenConfig(seq_len=8, packing="best-fit", dtype="uint16")
    with pytest.raises(ValueError, match="pad_id pads packed sequences"):
        TokenConfig(seq_len=8, pad_id=0)
    with pytest.raises(ValueError, match="packing must be"):
        TokenConfig(seq_len=8, packing="first-fit")  # type: ignore[arg-type]  # refused
    with pytest.raises(ValueError, match="does not fit"):
        TokenConfig(seq_len=8, packing="best-fit", dtype="int32", pad_id=2**40)
    bare = tmp_path / "no-eos"
    _pack(bare, [5, 9, 40], eos=False)
    with pytest.raises(ValueError, match="without an end-of-text id"):
        TokenLoader(bare, seq_len=SEQ_LEN, batch_size=1, packing="best-fit")
    assert len(list(TokenLoader(bare, seq_len=8, batch_size=1, packing="best-fit", pad_id=0)))
    mixed = SourceConfig([path, path], mix=MixConfig(weights=(0.5, 0.5)))
    with pytest.raises(ValueError, match="reads one token dataset"):
        iter(TokenLoader(mixed, seq_len=SEQ_LEN, batch_size=2, packing="best-fit"))


def test_concat_stays_the_default_and_none_means_it(corpus: tuple[Path, np.ndarray]) -> None:
    path, stream = corpus
    for packing in ("concat", None):
        loader = TokenLoader(path, seq_len=SEQ_LEN, batch_size=4, seed=3, packing=packing)
        assert not isinstance(loader.source, PackedTokenSource)
        assert loader.source.units() == len(stream) // SPAN
        assert loader.padding_tokens == 0
    plain = [b["input_ids"].copy() for b in TokenLoader(path, seq_len=SEQ_LEN, batch_size=4)]
    concat = TokenLoader(path, seq_len=SEQ_LEN, batch_size=4, packing="concat")
    assert _batches_equal(
        [{"input_ids": b} for b in plain],
        [{"input_ids": b["input_ids"]} for b in concat],
        ("input_ids",),
    )
