"""A kind of unit lives in its source (issue 33 item 1): a plain Loader reads token
sequences, alone or mixed, as TokenLoader does, since the source says what its units
need (their batcher, their order's block sizes, an epoch's first batch fetched apart)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker.format.reader import open_dataset
from stoker.format.token_writer import write_token_dataset
from stoker.pipeline.dataset_source import DatasetSource
from stoker.storage.open import open_store

SEQ_LEN = 15


def _pack(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    docs = [(f"doc{i:04d}", rng.integers(2, 900, int(rng.integers(3, 60)))) for i in range(120)]
    write_token_dataset(
        open_store(str(path)), docs, dtype=np.dtype("uint16"), eos_id=1, shard_tokens=700
    )
    return path


def _batches(loader: Any) -> list[dict[str, Any]]:
    fields = ("index", "input_ids", "labels", "targets", "position_ids", "source")
    with loader:
        return [
            {name: np.array(batch[name]) for name in fields if name in batch} for batch in loader
        ]


def _same(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> None:
    assert len(left) == len(right) > 2
    for a, b in zip(left, right, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("mixed", [False, True], ids=["one", "mix"])
def test_a_plain_loader_reads_token_sequences_as_token_loader_does(
    tmp_path: Path, mixed: bool
) -> None:
    paths = [str(_pack(tmp_path / "a", 1)), str(_pack(tmp_path / "b", 2))]
    where: Any = paths if mixed else paths[0]
    mix = stoker.MixConfig(weights=(0.7, 0.3)) if mixed else None
    tokens = stoker.TokenConfig(seq_len=SEQ_LEN, documents=True)
    token_loader = stoker.TokenLoader(
        stoker.SourceConfig(where, mix=mix) if mixed else where,
        seq_len=SEQ_LEN,
        batch_size=4,
        seed=3,
        documents=True,
    )
    loader = stoker.Loader(
        stoker.SourceConfig(where, mix=mix, tokens=tokens), batch_size=4, seed=3, drop_last=True
    )
    # The token source sized the order's blocks and groups for both.
    assert loader.order_config == token_loader.order_config
    _same(_batches(loader), _batches(token_loader))


def test_a_token_loader_refuses_a_source_of_samples(tmp_path: Path) -> None:
    images = tmp_path / "images"
    for label in ("a", "b"):
        (images / label).mkdir(parents=True)
        for n in range(4):
            (images / label / f"{n}.png").write_bytes(_png())
    stoker.pack(str(images), str(tmp_path / "packed"))
    source = DatasetSource(open_dataset(str(tmp_path / "packed")))
    with pytest.raises(TypeError, match="token datasets only"):
        stoker.TokenLoader(source, seq_len=SEQ_LEN, batch_size=2)


def _png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()
