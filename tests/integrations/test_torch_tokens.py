"""TorchTokenLoader: tensors of the TokenLoader's batches, copied ahead, resuming exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stoker.format.token_writer import write_token_dataset
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
    expected = list(TokenLoader(tokens, documents=True, **OPTIONS))
    loader = TorchTokenLoader(tokens, documents=True, device="cpu", **OPTIONS)
    got = list(loader)
    assert len(got) == len(expected) == len(loader) > 3
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
