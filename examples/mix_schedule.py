"""A mixture schedule: two corpora whose shares change at a given step, a checkpoint in
the middle of a stage, and a resume that adds a third corpus and changes the weights.

    python examples/mix_schedule.py

Runs locally (no network, no framework): three small token corpora are written as
``.npy`` documents and packed into token datasets in a temporary folder. The mix starts at
80 % ``web`` / 20 % ``code`` and switches to half and half at batch step 6 (every rank
switches at the same step). At step 9 the loader's ``state_dict()`` is saved as JSON, as a
checkpoint would be; a new loader with ``math`` added and other weights loads it and goes
on: ``web`` and ``code`` continue from their places in their own streams (no sequence of
theirs again, none skipped), ``math`` starts at its beginning.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

import stoker
from stoker import MixConfig, SourceConfig, TokenLoader, TokenPackConfig

VOCAB = 1000
SEQ_LEN = 16


def write_corpus(root: Path, name: str, documents: int, *, seed: int) -> str:
    """``documents`` random documents of 20 to 80 tokens, packed into ``root/name``."""
    rng = np.random.default_rng(seed)
    folder = root / f"{name}-docs"
    folder.mkdir()
    for i in range(documents):
        tokens = rng.integers(1, VOCAB, int(rng.integers(20, 81)))
        np.save(folder / f"{i:04d}.npy", tokens.astype(np.int32))
    stoker.pack(folder, root / name, config=TokenPackConfig(eos_id=0, vocab_size=VOCAB))
    return str(root / name)


def shares(batch: dict[str, np.ndarray], names: list[str]) -> str:
    counts = Counter(names[int(k)] for k in batch["source"])
    return " ".join(f"{name}={counts[name]}" for name in names)


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        web = write_corpus(root, "web", 60, seed=1)
        code = write_corpus(root, "code", 40, seed=2)
        math = write_corpus(root, "math", 30, seed=3)
        mix = MixConfig(weights=(0.8, 0.2), stages=((6, (0.5, 0.5)),))
        seen: set[tuple[int, ...]] = set()
        source = SourceConfig([web, code], mix=mix)
        with TokenLoader(source, seq_len=SEQ_LEN, batch_size=10, seed=0) as loader:
            for step, batch in enumerate(loader):
                print(f"step {step}: {shares(batch, ['web', 'code'])}")
                seen.update(tuple(row) for row in batch["input_ids"].tolist())
                if step == 8:
                    checkpoint = json.dumps(loader.state_dict())  # a few integers a source
                    break
        print(f"saved at step {json.loads(checkpoint)['mix']['step']}: {len(checkpoint)} bytes")

        # Resume with a third corpus and new weights: each source goes on from its place.
        source = SourceConfig([web, code, math], mix=MixConfig(weights=(2, 1, 1)))
        again = 0
        with TokenLoader(source, seq_len=SEQ_LEN, batch_size=10, seed=0) as resumed:
            resumed.load_state_dict(json.loads(checkpoint))
            for step, batch in enumerate(resumed, start=9):
                print(f"step {step}: {shares(batch, ['web', 'code', 'math'])}")
                ids, sources = batch["input_ids"].tolist(), batch["source"].tolist()
                rows = [tuple(row) for row, k in zip(ids, sources, strict=True) if k < 2]
                again += sum(row in seen for row in rows)
                seen.update(rows)
        print(f"web and code sequences delivered twice in the epoch: {again}")
        assert again == 0


if __name__ == "__main__":
    main()
