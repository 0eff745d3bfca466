"""TorchLoader over token sequences (and TorchTokenLoader, its old name): tensors of the
TokenLoader's batches, copied ahead, resuming exactly, made by DataLoader workers too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stoker.format.token_writer import write_token_dataset
from stoker.integrations.torch import TorchLoader
from stoker.integrations.torch_tokens import TorchTokenLoader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.token_loader import TokenLoader
from stoker.storage.open import open_store

SEQ_LEN = 15
OPTIONS: dict[str, Any] = {
    "seq_len": SEQ_LEN,
    "batch_size": 3,
    "seed": 2,
    "order": OrderConfig(block_size=5),
}


def _documents() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(f"d{i}", rng.integers(0, 30_000, int(rng.integers(2, 40)))) for i in range(150)]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens")
    write_token_dataset(open_store(str(path)), _documents(), dtype=np.dtype("uint16"), eos_id=0)
    return path


def test_batches_are_tensors_equal_to_the_token_loaders(tokens: Path) -> None:
    reference = TokenLoader(tokens, documents=True, **OPTIONS)
    expected = list(reference)
    loader = TorchTokenLoader(tokens, documents=True, device="cpu", **OPTIONS)
    got = list(loader)
    assert len(got) == len(expected) == len(loader) > 3
    assert loader.dropped_tokens == reference.dropped_tokens > 0
    for a, b in zip(got, expected, strict=True):
        assert a["input_ids"].dtype == torch.int64
        assert a["input_ids"].shape[1] == SEQ_LEN
        assert torch.equal(a["labels"], a["input_ids"])
        assert torch.equal(a["targets"][:, :-1], a["input_ids"][:, 1:])
        for name in ("input_ids", "labels", "targets", "index", "position_ids", "cu_seqlens"):
            assert isinstance(a[name], torch.Tensor)
            assert np.array_equal(a[name].numpy(), b[name])
        assert a["cu_seqlens"].dtype == torch.int32
        assert [t.tolist() for t in a["doc_lens"]] == [x.tolist() for x in b["doc_lens"]]
        assert a["max_seqlen"] == b["max_seqlen"]


def test_state_is_after_the_batch_handed_out_not_the_one_copied_ahead(tokens: Path) -> None:
    whole = [b["index"].tolist() for b in TorchTokenLoader(tokens, **OPTIONS)]
    for device in (None, "cpu"):
        loader = TorchTokenLoader(tokens, device=device, **OPTIONS)
        it = iter(loader)
        seen = [next(it)["index"].tolist() for _ in range(2)]
        state = loader.state_dict()
        assert state["batches"] == 2
        resumed = TorchTokenLoader(tokens, device=device, **OPTIONS)
        resumed.load_state_dict(state)
        assert seen + [b["index"].tolist() for b in resumed] == whole


def test_a_hugging_face_style_loss_on_labels_scores_the_next_token(tokens: Path) -> None:
    """A causal LM that predicts each next token exactly has zero loss, scored as Hugging
    Face's ``ForCausalLMLoss`` scores ``labels`` (shifted by the model: logits at ``j``
    against ``labels[j + 1]``) and as a plain cross-entropy scores ``targets``."""
    stream = torch.as_tensor(np.concatenate([np.append(d, 0) for _, d in _documents()]))
    span = SEQ_LEN + 1
    for batch in TorchTokenLoader(tokens, **OPTIONS):
        following = stream[batch["index"][:, None] * span + torch.arange(1, span)]
        logits = torch.full((*following.shape, 30_001), -1e4)
        logits.scatter_(2, following[..., None], 1e4)  # an oracle of the next token
        labels = batch["labels"]
        # transformers' ForCausalLMLoss: pad labels with -100, then shift them left by one.
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
        hf = torch.nn.functional.cross_entropy(logits.flatten(0, 1), shifted.flatten())
        assert hf.item() == 0.0
        assert torch.equal(logits[..., :-1, :].argmax(-1), labels[..., 1:])
        plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
        assert plain.item() == 0.0


FORK: dict[str, Any] = {
    "multiprocessing_context": "fork"
}  # starts at once; spawn is tested for images


def _same_batches(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(got) == len(expected) > 3
    for a, b in zip(got, expected, strict=True):
        for name in b:
            if isinstance(b[name], np.ndarray):
                assert isinstance(a[name], torch.Tensor)
                assert np.array_equal(a[name].numpy(), b[name]), name


@pytest.mark.parametrize("documents", [False, True], ids=["plain", "documents"])
def test_torch_loader_workers_give_every_sequence_once_as_the_token_loader(
    tokens: Path, documents: bool
) -> None:
    """TorchLoader(url, seq_len=..., num_workers=2) with persistent workers: each epoch's
    batches are TokenLoader's, in its order, every one full, each sequence once."""
    reference = TokenLoader(tokens, documents=documents, **OPTIONS)
    with TorchLoader(tokens, num_workers=2, documents=documents, **FORK, **OPTIONS) as loader:
        assert len(loader) == len(reference)
        for epoch in range(2):
            loader.set_epoch(epoch)
            reference.set_epoch(epoch)
            expected, got = list(reference), list(loader)
            _same_batches(got, expected)
            seen = torch.cat([b["index"] for b in got]).tolist()
            assert len(seen) == len(set(seen)) == len(loader) * OPTIONS["batch_size"]
            assert {tuple(b["input_ids"].shape) for b in got} == {(3, SEQ_LEN)}


def test_torch_loader_workers_resume_token_sequences_mid_epoch(tokens: Path) -> None:
    whole = [b["index"].tolist() for b in TokenLoader(tokens, **OPTIONS)]
    with TorchLoader(tokens, num_workers=2, **FORK, **OPTIONS) as loader:
        it = iter(loader)
        seen = [next(it)["index"].tolist() for _ in range(3)]
        state = loader.state_dict()
    assert state["batches"] == 3
    with TorchLoader(tokens, num_workers=2, **FORK, **OPTIONS) as resumed:
        resumed.load_state_dict(state)
        assert seen + [b["index"].tolist() for b in resumed] == whole


def test_token_settings_without_seq_len_are_refused(tokens: Path) -> None:
    with pytest.raises(TypeError, match="give seq_len"):
        TorchLoader(tokens, batch_size=2, documents=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_best_fit_packing_is_taken_by_the_adapters_own_keywords(tokens: Path, workers: int) -> None:
    settings = {**OPTIONS, "packing": "best-fit", "packing_window": 64}
    expected = list(TokenLoader(tokens, **settings))
    with TorchLoader(tokens, num_workers=workers, **settings) as loader:
        got = list(loader)
    assert len(got) == len(expected) > 3
    assert any((b["labels"] == -100).any() for b in expected)  # padded: best-fit it is
    for a, b in zip(got, expected, strict=True):
        for name in ("input_ids", "labels", "targets", "index"):
            assert np.array_equal(a[name].numpy(), b[name])


def test_packing_without_seq_len_is_refused_by_name(tokens: Path) -> None:
    with pytest.raises(TypeError, match="packing, pad_id: settings of token sequences"):
        TorchLoader(tokens, batch_size=3, packing="best-fit", pad_id=0)
