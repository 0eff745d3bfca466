"""The token corpus of ``tokens.py``, written once (kept in benchmarks/out/data) in each
loader's own format, then uploaded into the bucket of this run's server.

Random documents of 50 to 3,000 tokens, ids below 50,256 (GPT-2's vocabulary), each
followed by the end-of-text id 50,256: one stream of ``uint16`` tokens, held as

- ``stream.bin``: the raw stream on local disk (the memmap loop reads it);
- ``stoker/``: packed by ``write_token_dataset`` (shards of 64 Mi tokens);
- ``litdata/``: LitData's ``optimize`` with ``TokensLoader()`` (the documents, eos
  included, as numpy arrays; chunks of 64 MB), as LitGPT prepares its pretraining data;
- ``mds/``: Mosaic Streaming's ``MDSWriter``, the stream cut into samples of ``seq_len + 1``
  tokens (``ndarray:uint16``; shards of 64 MB), as llm-foundry's concatenated-tokens
  datasets are written.

LitData and Mosaic are imported in child processes only (``tokens_children.py``), with
``--libs`` on their path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stoker.format.token_writer import write_token_dataset
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, upload
from stoker.testing.seaweed import SeaweedServer

OUT = Path(__file__).resolve().parent / "out"
BUCKET = "bench-tokens"
VOCAB = 50_257  # GPT-2's: ids 0..50,255 and the end-of-text id
EOS = VOCAB - 1
MIN_DOC, MAX_DOC = 50, 3000
CHILD = Path(__file__).resolve().parent / "tokens_children.py"


@dataclass(frozen=True)
class Corpus:
    """One corpus, on local disk and in the bucket.

    Attributes:
        key: Its folder under benchmarks/out/data and its prefix in the bucket.
        local: That folder.
        tokens: Tokens in the stream (eos included).
        documents: Documents.
        seq_len: The sequence length the MDS samples were cut for.
        formats: Bytes of each format's objects (``stoker``, ``litdata``, ``mds``).
    """

    key: str
    local: Path
    tokens: int
    documents: int
    seq_len: int
    formats: dict[str, int]

    @property
    def token_bytes(self) -> int:
        return self.tokens * 2

    @property
    def stream(self) -> Path:
        return self.local / "stream.bin"

    def url(self, fmt: str) -> str:
        return f"s3://{BUCKET}/{self.key}/{fmt}"


def document_bounds(tokens: int, seed: int) -> np.ndarray:
    """Stream positions of each document's first token and the end: documents of
    ``MIN_DOC..MAX_DOC`` tokens plus one eos, until ``tokens`` are reached."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(MIN_DOC, MAX_DOC + 1, tokens // MIN_DOC + 1) + 1
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, tokens)) + 1
    return np.concatenate([[0], ends[:count]]).astype(np.int64)


def _write_stream(path: Path, bounds: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed + 1)
    stream = rng.integers(0, EOS, int(bounds[-1]), dtype=np.uint16)
    stream[bounds[1:] - 1] = EOS
    stream.tofile(path)


def _documents(stream: np.ndarray, bounds: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    for n in range(len(bounds) - 1):
        yield f"doc{n:08d}", stream[bounds[n] : bounds[n + 1] - 1]  # the writer adds eos


def _run_child(args: list[str], path: str | None) -> None:
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(CHILD), *args], env=env, text=True)
    if done.returncode:
        raise RuntimeError(f"{args[0]} failed (exit {done.returncode})")


def prepare(
    token_mb: int, seq_len: int, server: SeaweedServer, *, paths: dict[str, str], seed: int = 0
) -> Corpus:
    """Write the corpus in every format (once, kept), upload each into the bucket.

    ``paths`` has the import path of each other library that imports (``litdata``,
    ``mosaic``); a format whose library is missing is left out."""
    key = f"tokens-{token_mb}MB-seq{seq_len}-seed{seed}"
    local = OUT / "data" / key
    marker = local / "corpus.json"
    if not marker.exists():
        local.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        bounds = document_bounds(token_mb * 1_000_000 // 2, seed)
        np.save(local / "bounds.npy", bounds)
        _write_stream(local / "stream.bin", bounds, seed)
        stream = np.memmap(local / "stream.bin", dtype=np.uint16, mode="r")
        write_token_dataset(
            open_store(local / "stoker"),
            _documents(stream, bounds),
            dtype=np.dtype("uint16"),
            eos_id=EOS,
            packed_with={"benchmark": "tokens.py", "seed": seed},
        )
        print(f"[tokens] stream and stoker written in {time.perf_counter() - started:.0f} s")
        marker.write_text(json.dumps({"tokens": int(bounds[-1]), "documents": len(bounds) - 1}))
    for fmt, library in (("litdata", "litdata"), ("mds", "mosaic")):
        done = local / f"{fmt}.done"
        if done.exists() or library not in paths:
            continue
        shutil.rmtree(local / fmt, ignore_errors=True)
        started = time.perf_counter()
        _run_child([f"write-{fmt}", str(local), str(seq_len)], paths[library])
        done.touch()
        print(f"[tokens] {fmt} written in {time.perf_counter() - started:.0f} s", flush=True)
    meta = json.loads(marker.read_text())
    direct = server.storage_options()
    formats = {}
    for fmt in ("stoker", "litdata", "mds"):
        if fmt != "stoker" and not (local / f"{fmt}.done").exists():
            continue
        upload(
            local / fmt,
            open_store(f"s3://{BUCKET}/{key}/{fmt}", storage_options=direct),
            config=TransferConfig(workers=16),
        )
        formats[fmt] = sum(p.stat().st_size for p in (local / fmt).rglob("*") if p.is_file())
    corpus = Corpus(key, local, meta["tokens"], meta["documents"], seq_len, formats)
    print(
        f"[tokens] {corpus.documents:,} documents, {corpus.tokens:,} tokens "
        f"({corpus.token_bytes / 1e6:,.0f} MB); "
        + ", ".join(f"{k} {v / 1e6:,.0f} MB" for k, v in formats.items()),
        flush=True,
    )
    return corpus
