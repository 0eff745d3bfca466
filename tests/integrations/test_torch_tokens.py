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


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    docs = [(f"d{i}", rng.integers(0, 30_000, int(rng.integers(2, 40)))) for i in range(150)]
    write_token_dataset(open_store(str(path)), docs, dtype=np.dtype("uint16"), eos_id=0)
    return path


def test_batches_are_tensors_equal_to_the_token_loaders(tokens: Path) -> None:
    expected = list(TokenLoader(tokens, documents=True, **OPTIONS))
    loader = TorchTokenLoader(tokens, documents=True, device="cpu", **OPTIONS)
    got = list(loader)
    assert len(got) == len(expected) == len(loader) > 3
    for a, b in zip(got, expected, strict=True):
        assert a["input_ids"].dtype == torch.int64
        assert a["input_ids"].shape[1] == SEQ_LEN
        assert torch.equal(a["labels"][:, :-1], a["input_ids"][:, 1:])
        for name in ("input_ids", "labels", "index", "position_ids", "cu_seqlens"):
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
