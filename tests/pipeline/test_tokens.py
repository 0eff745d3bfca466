"""TokenLoader: sequences of a packed token stream, exactly once over ranks in full
batches, resumable, mixed by tokens, with document boundaries from the index; ``labels``
as Hugging Face takes them and ``targets`` shifted."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker.format.token_writer import write_token_dataset
from stoker.pipeline.config import CacheConfig, SourceConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.mixing import MixConfig
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.token_loader import TokenLoader
from stoker.pipeline.world import World
from stoker.storage.base import Store
from stoker.storage.open import open_store

SEQ_LEN = 31  # sequences of 32 tokens
SPAN = SEQ_LEN + 1
EOS = 1
ORDER = OrderConfig(block_size=6)  # blocks of 6 sequences: many blocks, groups and runs


def _documents(n: int, *, vocab: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, int(rng.integers(3, 120))) for _ in range(n)]


def _pack(store: Store, docs: list[np.ndarray], dtype: str = "uint16") -> np.ndarray:
    """Write ``docs`` as a token dataset (small shards, so runs cross them); return the
    stream they make."""
    keyed = [(f"doc{i:05d}", d) for i, d in enumerate(docs)]
    write_token_dataset(store, keyed, dtype=np.dtype(dtype), eos_id=EOS, shard_tokens=1_500)
    return np.concatenate([np.append(d, EOS) for d in docs])


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, list[int]]:
    path = tmp_path_factory.mktemp("tokens")
    docs = _documents(160, vocab=60_000, seed=1)
    stream = _pack(open_store(str(path)), docs)
    return path, stream, [len(d) + 1 for d in docs]


def _loader(path: Any, *, rank: int = 0, world_size: int = 1, **options: Any) -> TokenLoader:
    options.setdefault("batch_size", 4)
    options.setdefault("order", ORDER)
    world = World(rank=rank, world_size=world_size)
    return TokenLoader(path, seq_len=SEQ_LEN, seed=3, world=world, **options)


def _check_rows(batch: dict[str, Any], stream: np.ndarray) -> None:
    rows = zip(batch["index"], batch["input_ids"], batch["targets"], strict=True)
    for k, inputs, targets in rows:
        sequence = stream[k * SPAN : (k + 1) * SPAN]
        assert np.array_equal(inputs, sequence[:-1])
        assert np.array_equal(targets, sequence[1:])  # the next token of each input
    assert np.array_equal(batch["labels"], batch["input_ids"])  # Hugging Face's labels


def _four_ranks(
    path: Path, stream: np.ndarray, caplog: pytest.LogCaptureFixture, **options: Any
) -> tuple[list[TokenLoader], list[list[dict[str, Any]]], np.ndarray]:
    """Four ranks' loaders, their epochs (rows checked against the stream, equal steps on
    every rank) and the sequences delivered (none twice)."""
    with caplog.at_level(logging.INFO, logger="stoker.pipeline.token_loader"):
        loaders = [_loader(path, rank=r, world_size=4, **options) for r in range(4)]
    epochs = [list(loader) for loader in loaders]
    for batches in epochs:
        for batch in batches:
            rows = len(batch["index"])
            for name in ("input_ids", "labels", "targets"):
                assert batch[name].shape == (rows, SEQ_LEN)
                assert batch[name].dtype == np.int64
            _check_rows(batch, stream)
    assert len({len(batches) for batches in epochs}) == 1  # equal steps on every rank
    assert len(epochs[0]) == len(loaders[0])
    delivered = np.concatenate([b["index"] for batches in epochs for b in batches])
    assert len(np.unique(delivered)) == len(delivered)  # nothing twice
    return loaders, epochs, delivered


def test_four_ranks_get_full_batches_and_the_rest_is_counted_and_said(
    packed: tuple[Path, np.ndarray, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    path, stream, _ = packed
    sequences = len(stream) // SPAN
    loaders, epochs, delivered = _four_ranks(path, stream, caplog)
    # One shape all epoch (a compiled model's static shapes): every batch holds 4 rows.
    assert {len(b["index"]) for batches in epochs for b in batches} == {4}
    each = sequences // 4  # a rank's share, then its last incomplete batch left out
    assert len(delivered) == 4 * (each - each % 4)
    assert each % 4  # this data has one to leave out
    loader = loaders[0]
    assert loader.drop_last is True
    assert loader.dropped_sequences == sequences - len(delivered)
    assert loader.epoch_sequences == len(delivered)
    assert loader.dropped_tokens == len(stream) - len(delivered) * SPAN
    assert f"{loader.dropped_sequences} sequences and {loader.dropped_tokens} tokens" in (
        caplog.text
    )
    assert "drop_last=False" in caplog.text
    assert loader.stats().epoch_samples == len(delivered) // 4


def test_drop_last_false_delivers_each_ranks_last_batch_short(
    packed: tuple[Path, np.ndarray, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    path, stream, _ = packed
    sequences = len(stream) // SPAN
    loaders, epochs, delivered = _four_ranks(path, stream, caplog, drop_last=False)
    for batches in epochs:
        assert [len(b["index"]) for b in batches[:-1]] == [4] * (len(batches) - 1)
        assert 0 < len(batches[-1]["index"]) < 4  # a short last one, as on every rank
    # Left out: the stream's tail and the sequences evening out 4 ranks; nothing else.
    left_out = len(stream) % SPAN + (sequences % 4) * SPAN
    assert left_out < 4 * SPAN
    assert loaders[0].dropped_tokens == left_out == len(stream) - len(delivered) * SPAN
    assert loaders[0].dropped_sequences == sequences % 4
    assert loaders[0].epoch_tokens == len(delivered) * SPAN
    assert f"{left_out} tokens" in caplog.text
    assert f"the last one of {len(epochs[0][-1]['index'])}" in caplog.text
    assert loaders[0].stats().samples == len(delivered) // 4  # each rank an equal share


def test_labels_follow_hugging_face_and_targets_are_the_next_tokens(
    packed: tuple[Path, np.ndarray, list[int]],
) -> None:
    """A Hugging Face causal LM shifts ``labels`` itself (logits at ``j`` against
    ``labels[j + 1]``): what it scores must be the next token, not the one after."""
    path, stream, _ = packed
    for batch in _loader(path, batch_size=5):
        starts = batch["index"] * SPAN
        next_tokens = stream[starts[:, None] + np.arange(1, SPAN)]  # of each input
        assert np.array_equal(batch["labels"], batch["input_ids"])
        # transformers' ForCausalLMLoss: labels padded with -100, shifted left by one.
        shifted = np.pad(batch["labels"], ((0, 0), (0, 1)), constant_values=-100)[:, 1:]
        assert np.array_equal(shifted[:, :-1], next_tokens[:, :-1])
        assert (shifted[:, -1] == -100).all()  # the last position is not scored
        assert np.array_equal(batch["targets"][:, :-1], batch["input_ids"][:, 1:])
        assert np.array_equal(batch["targets"][:, -1], stream[starts + SEQ_LEN])
        assert np.array_equal(batch["targets"], next_tokens)


def test_a_dataset_without_a_full_batch_says_so(
    packed: tuple[Path, np.ndarray, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    path, stream, _ = packed
    sequences = len(stream) // SPAN
    with caplog.at_level(logging.WARNING, logger="stoker.pipeline.token_loader"):
        empty = _loader(path, batch_size=sequences + 1)
    assert "no rank a full batch" in caplog.text
    assert "drop_last=False" in caplog.text
    assert list(empty) == []
    short = list(_loader(path, batch_size=sequences + 1, drop_last=False))
    assert [len(b["index"]) for b in short] == [sequences]


def test_resume_mid_epoch_is_exact_and_onto_three_ranks_covers_the_rest_once(
    packed: tuple[Path, np.ndarray, list[int]],
) -> None:
    path, stream, _ = packed
    whole = [[b["index"] for b in _loader(path, rank=r, world_size=4)] for r in range(4)]
    states, consumed = [], []
    for r in range(4):
        loader = _loader(path, rank=r, world_size=4)
        it = iter(loader)
        consumed += [next(it)["index"] for _ in range(3)]
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)
    assert set(states[0]) >= {"epoch", "batches", "seed", "world_size"}  # a few integers
    for r in range(4):
        resumed = _loader(path, rank=r, world_size=4)
        resumed.load_state_dict(states[0])
        rest = [b["index"] for b in resumed]
        assert all(np.array_equal(a, b) for a, b in zip(rest, whole[r][3:], strict=True))
        assert len(rest) == len(whole[r]) - 3
    later = []
    for r in range(3):
        resumed = _loader(path, rank=r, world_size=3)
        resumed.load_state_dict(states[0])
        for batch in resumed:
            _check_rows(batch, stream)
            later.append(batch["index"])
    before, after = np.concatenate(consumed), np.concatenate(later)
    everything = np.concatenate([before, after])
    assert len(np.unique(everything)) == len(everything)  # the rest, once, none again
    left = len(stream) // SPAN - len(before)
    # The rest less fewer than 3 sequences (evening out) and 3 partial batches of under 4.
    assert left - len(after) <= (3 - 1) + 3 * (4 - 1)
    assert len(after) % 3 == 0


def _pieces(doc_starts: list[int], k: int) -> np.ndarray:
    """The documents' pieces in sequence ``k``'s inputs, from the documents' starts alone."""
    begin, end = k * SPAN, k * SPAN + SEQ_LEN
    return np.diff([begin, *(s for s in doc_starts if begin < s < end), end])


def test_a_70_30_mix_holds_its_token_shares_over_an_epoch_and_resumes(tmp_path: Path) -> None:
    docs = [_documents(200, vocab=60_000, seed=2), _documents(120, vocab=100_000, seed=3)]
    big = _pack(open_store(str(tmp_path / "web")), docs[0])
    small = _pack(open_store(str(tmp_path / "code")), docs[1], "uint32")
    doc_starts = [np.cumsum([0] + [len(d) + 1 for d in group]).tolist() for group in docs]
    source = SourceConfig(
        [str(tmp_path / "web"), str(tmp_path / "code")], mix=MixConfig(weights=(0.7, 0.3))
    )

    def loader() -> TokenLoader:
        return TokenLoader(source, seq_len=SEQ_LEN, batch_size=8, seed=5, documents=True)

    batches = list(loader())
    tokens = np.zeros(2)
    rows = [
        {tuple(s[n * SPAN : n * SPAN + SEQ_LEN].tolist()): n for n in range(len(s) // SPAN)}
        for s in (big, small)
    ]
    for batch in batches:
        for inputs, origin, pieces in zip(
            batch["input_ids"], batch["source"], batch["doc_lens"], strict=True
        ):
            tokens[origin] += SPAN
            k = rows[origin].get(tuple(inputs.tolist()))
            assert k is not None, f"not a sequence of source {origin}"
            assert np.array_equal(pieces, _pieces(doc_starts[origin], k))  # its own documents
    assert abs(tokens[0] / tokens.sum() - 0.7) < 0.01
    assert tokens.sum() > 0.9 * loader().stream_tokens
    interrupted = loader()
    it = iter(interrupted)
    for _ in range(5):
        next(it)
    resumed = loader()
    resumed.load_state_dict(interrupted.state_dict())
    rest = list(resumed)
    assert len(rest) == len(batches) - 5
    for a, b in zip(rest, batches[5:], strict=True):
        assert np.array_equal(a["index"], b["index"])
        assert np.array_equal(a["source"], b["source"])
        assert np.array_equal(a["input_ids"], b["input_ids"])


def test_document_boundaries_match_the_original_documents(
    packed: tuple[Path, np.ndarray, list[int]],
) -> None:
    path, _, lengths = packed
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    loader = _loader(path, documents=True, batch_size=5)
    checked = 0
    for batch in loader:
        flat: list[int] = []
        for row, k in enumerate(batch["index"].tolist()):
            pieces = _pieces(starts, k)
            assert np.array_equal(batch["doc_lens"][row], pieces)
            positions = np.concatenate([np.arange(p) for p in pieces])
            assert np.array_equal(batch["position_ids"][row], positions)
            flat += pieces.tolist()
            checked += len(pieces) > 1
        assert batch["cu_seqlens"].dtype == np.int32
        assert np.array_equal(batch["cu_seqlens"], np.concatenate([[0], np.cumsum(flat)]))
        assert batch["max_seqlen"] == max(flat)
    assert checked > 20  # many rows cross a document boundary


def test_from_a_seaweedfs_bucket_as_from_a_local_path(
    s3_bucket: Any, packed: tuple[Path, np.ndarray, list[int]]
) -> None:
    path, stream, _ = packed
    docs = _documents(160, vocab=60_000, seed=1)  # the same documents, in the bucket
    _pack(s3_bucket.store("tokens"), docs)
    remote = _loader(f"{s3_bucket.url}/tokens", storage_options=s3_bucket.options())
    local = list(_loader(path))
    remote_batches = list(remote)
    assert len(remote_batches) == len(local) > 0
    for a, b in zip(remote_batches, local, strict=True):
        assert np.array_equal(a["input_ids"], b["input_ids"])
        _check_rows(a, stream)
    assert remote.stats().requests["requests.get"] < len(local)  # runs, not sequences


def test_settings_and_datasets_that_do_not_fit_are_refused_by_name(
    packed: tuple[Path, np.ndarray, list[int]], tmp_path: Path
) -> None:
    path, _, _ = packed
    with pytest.raises(ValueError, match=r"is a token dataset: read it with stoker\.TokenLoader"):
        Loader(str(path), batch_size=2)
    wide = tmp_path / "wide"
    _pack(open_store(str(wide)), _documents(20, vocab=100_000, seed=4), "uint32")
    with pytest.raises(ValueError, match="more than dtype='uint16' holds"):
        _loader(wide, dtype="uint16")
    with pytest.raises(ValueError, match="fewer than one sequence"):
        TokenLoader(path, seq_len=10**7, batch_size=1)
    with pytest.raises(ValueError, match="dtype must be one of"):
        TokenLoader(path, seq_len=8, batch_size=1, dtype="float32")
    narrow = _loader(path, dtype="int32")
    assert next(iter(narrow))["input_ids"].dtype == np.int32


def test_epochs_reshuffle_and_a_second_one_reads_the_disk_cache(
    s3_bucket: Any, tmp_path: Path
) -> None:
    stream = _pack(s3_bucket.store("tokens"), _documents(120, vocab=60_000, seed=6))
    options: dict[str, Any] = {
        "storage_options": s3_bucket.options(),
        "cache": CacheConfig(dir=tmp_path),
    }
    with _loader(f"{s3_bucket.url}/tokens", **options) as loader:
        first = np.concatenate([b["index"] for b in loader])
        cold = loader.stats()
        loader.set_epoch(1)
        second = []
        for batch in loader:
            _check_rows(batch, stream)
            second.append(batch["index"])
        warm = loader.stats()
    again = np.concatenate(second)
    # Each epoch every sequence once, but for its last partial batch (under 4), reshuffled.
    assert len(set(first.tolist())) == len(first) == len(again) >= len(stream) // SPAN - 3
    assert len(set(first.tolist()) & set(again.tolist())) >= len(first) - 3
    assert not np.array_equal(first, again)
    assert cold.requests["requests.get"] > 0
    assert warm.requests["requests.get"] == cold.requests["requests.get"]
    assert warm.disk_cache["cache.hits"] > 0


def test_a_pack_in_its_inputs_order_gets_a_mixing_window(tmp_path: Path) -> None:
    docs = [(f"d{i}", d) for i, d in enumerate(_documents(60, vocab=1_000, seed=7))]
    for name, seed in (("kept", None), ("shuffled", 0)):
        store = open_store(str(tmp_path / name))
        write_token_dataset(
            store, docs, dtype=np.dtype("uint16"), packed_with={"shuffle_seed": seed}
        )
    assert _loader(tmp_path / "shuffled").order_config.window == 1
    assert _loader(tmp_path / "kept").order_config.window > 1
