"""JaxLoader over token sequences: global arrays sharded over two CPU devices, equal to the
TokenLoader's, the fields the source names sharded and the rest on the host, token ids under
the 64-bit rule of every field (int64 kept with jax_enable_x64, int32 without).

JAX runs in a child process (this file, run as a script), as in test_jax.py: once JAX has
started it warns on every later ``os.fork()`` of the test process.
"""

from __future__ import annotations

import json
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

OPTIONS: dict[str, Any] = {
    "seq_len": 15,
    "batch_size": 4,
    "seed": 1,
    "documents": True,
    "order": OrderConfig(block_size=5),
}
FIELDS = ("input_ids", "labels", "targets", "position_ids", "index")


def child(url: str, out: Path, x64: bool) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 2)  # before JAX starts
    jax.config.update("jax_enable_x64", x64)
    from stoker.integrations.jax import JaxLoader
    from stoker.integrations.jax_tokens import JaxTokenLoader

    loader = JaxLoader(url, **OPTIONS)
    batches = list(loader)
    first = batches[0]
    named = [b["index"].tolist() for b in JaxTokenLoader(url, **OPTIONS)]  # the old name
    exact_order = OrderConfig(block_size=5, exact=True)
    exact_options = {**OPTIONS, "order": exact_order, "drop_last": False}
    exact = next(iter(JaxLoader(url, **exact_options)))  # with its row mask, "real"
    facts = {
        "real": [isinstance(exact["real"], jax.Array), len(exact["real"].addressable_shards)],
        "as_named": named == [b["index"].tolist() for b in batches],
        "devices": jax.device_count(),
        "global": all(isinstance(first[n], jax.Array) for n in FIELDS),
        "shards": sorted(len(first[n].addressable_shards) for n in FIELDS),
        "host": [type(first[n]).__name__ for n in ("cu_seqlens", "doc_lens", "max_seqlen")],
        "dtype": str(first["input_ids"].dtype),
    }
    out.with_suffix(".json").write_text(json.dumps(facts))
    arrays = {n: np.stack([np.asarray(b[n]) for b in batches]) for n in FIELDS}
    np.savez(out.with_suffix(".npz"), **arrays)


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_jax_loader_shards_token_batches_as_the_token_loader_makes_them(
    tmp_path: Path, x64: bool
) -> None:
    rng = np.random.default_rng(0)
    docs = [(f"d{i}", rng.integers(0, 30_000, int(rng.integers(2, 40)))) for i in range(120)]
    write_token_dataset(open_store(str(tmp_path)), docs, dtype=np.dtype("uint16"), eos_id=0)
    out = tmp_path / "seen"
    run = subprocess.run(
        [sys.executable, __file__, str(tmp_path), str(out), "x64" if x64 else "x32"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    facts = json.loads(out.with_suffix(".json").read_text())
    assert facts["devices"] == 2
    assert facts["global"]
    assert facts["real"] == [True, 2]  # exact evaluation's row mask is sharded like the rows
    assert facts["shards"] == [2] * len(FIELDS)
    assert facts["host"] == ["ndarray", "list", "int"]
    # One rule for every 64-bit field: int64 ids stay int64 with x64, int32 without.
    assert facts["dtype"] == ("int64" if x64 else "int32")
    assert facts["as_named"]
    expected = list(TokenLoader(tmp_path, **OPTIONS))
    seen = np.load(out.with_suffix(".npz"))
    for name in FIELDS:
        assert np.array_equal(seen[name], np.stack([b[name] for b in expected]))


if __name__ == "__main__":
    child(sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "x64")
