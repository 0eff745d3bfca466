"""make_dataset over token sequences: TokenLoader's batches as tensors, and a Keras language
model's ``fit`` on them.

TensorFlow runs in a child process (this file, run as a script), as in test_tensorflow.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker.format.token_writer import write_token_dataset
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.token_loader import TokenLoader
from stoker.storage.open import open_store

VOCAB = 40
OPTIONS: dict[str, Any] = {
    "seq_len": 12,
    "batch_size": 4,
    "seed": 2,
    "order": OrderConfig(block_size=5),
}
NAMED = ("input_ids", "labels", "index")


def child(url: str, out: Path) -> None:
    import keras

    from stoker.integrations.tensorflow import make_dataset

    default = make_dataset(url, **OPTIONS)
    pairs = [(x.numpy(), y.numpy()) for x, y in default]
    named = [
        tuple(t.numpy() for t in element) for element in make_dataset(url, fields=NAMED, **OPTIONS)
    ]
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int64"),
            keras.layers.Embedding(VOCAB, 8),
            keras.layers.Dense(VOCAB),
        ]
    )
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    history = model.fit(make_dataset(url, **OPTIONS), epochs=1, verbose=0)
    facts = {
        "length": len(default),
        "dtypes": [str(pairs[0][0].dtype), str(pairs[0][1].dtype)],
        "loss": history.history["loss"],
    }
    out.with_suffix(".json").write_text(json.dumps(facts))
    arrays = {
        "x": np.stack([x for x, _ in pairs]),
        "y": np.stack([y for _, y in pairs]),
        **{name: np.stack([e[k] for e in named]) for k, name in enumerate(NAMED)},
    }
    np.savez(out.with_suffix(".npz"), **arrays)


def test_make_dataset_gives_the_token_loaders_batches_and_keras_fits_on_them(
    tmp_path: Path,
) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed (pip install -e '.[test]')")
    rng = np.random.default_rng(0)
    docs = [(f"d{i}", rng.integers(1, VOCAB, int(rng.integers(2, 40)))) for i in range(100)]
    write_token_dataset(open_store(str(tmp_path)), docs, dtype=np.dtype("uint16"), eos_id=0)
    out = tmp_path / "seen"
    run = subprocess.run(
        [sys.executable, __file__, str(tmp_path), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    facts = json.loads(out.with_suffix(".json").read_text())
    expected = list(TokenLoader(tmp_path, **OPTIONS))
    assert facts["length"] == len(expected) > 3
    assert facts["dtypes"] == ["int64", "int64"]
    seen = np.load(out.with_suffix(".npz"))
    # (input_ids, targets) by default: Keras' (x, y) for a loss at every position.
    assert np.array_equal(seen["x"], np.stack([b["input_ids"] for b in expected]))
    assert np.array_equal(seen["y"], np.stack([b["targets"] for b in expected]))
    for name in NAMED:
        assert np.array_equal(seen[name], np.stack([b[name] for b in expected]))
    assert len(facts["loss"]) == 1
    assert math.isfinite(facts["loss"][0])


if __name__ == "__main__":
    child(sys.argv[1], Path(sys.argv[2]))
