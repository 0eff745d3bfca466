"""stoker bench --seq-len: tokens/s, GETs and bytes of the TokenLoader over a token dataset,
through click's CliRunner, on a local dataset and in a SeaweedFS bucket behind a proxy."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.format.token_writer import write_token_dataset
from stoker.storage import open_store
from stoker.storage.base import Store

EOS = 50_256


def _write(store: Store, *, documents: int, dtype: str, seed: int) -> int:
    """Random documents of 50-3,000 tokens; returns the stream's length (eos included)."""
    rng = np.random.default_rng(seed)
    high = EOS if dtype == "uint16" else 100_000
    docs = [
        (f"doc{i:05d}", rng.integers(0, high, int(rng.integers(50, 3001))))
        for i in range(documents)
    ]
    write_token_dataset(store, docs, dtype=np.dtype(dtype), eos_id=EOS, shard_tokens=100_000)
    return sum(len(tokens) + 1 for _, tokens in docs)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    root = tmp_path_factory.mktemp("token-bench") / "ds"
    return str(root), _write(open_store(root), documents=400, dtype="uint16", seed=1)


def test_bench_seq_len_reports_a_whole_epoch(local: tuple[str, int]) -> None:
    url, stream = local
    seq_len, batch = 512, 8
    result = CliRunner().invoke(cli, ["bench", url, "--seq-len", str(seq_len), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    # Batches of 8 by default, all full: the epoch is every whole sequence but the last,
    # incomplete batch (not read).
    sequences = stream // (seq_len + 1)
    sequences -= sequences % batch
    assert report["batch_size"] == batch
    assert report["whole_epoch"] is True
    assert report["sequences"] == sequences
    assert report["batches"] == report["epoch_batches"] == sequences // batch
    assert report["tokens"] == sequences * seq_len
    assert report["stream_tokens"] == stream
    assert report["token_bytes"] == sequences * (seq_len + 1) * 2  # uint16
    # It read every token it delivered, each once (the stream's tail, under one sequence,
    # is not read), and the rest of the documents cut by each read's ends, to check them
    # whole: under one document (3,001 tokens) at each end of each GET.
    edges = report["requests"] * 2 * 3001 * 2
    assert report["token_bytes"] < report["bytes_read"] < report["token_bytes"] + edges
    assert report["bytes_per_token_byte"] == pytest.approx(
        report["bytes_read"] / report["token_bytes"], abs=1e-4
    )
    assert report["requests"] == report["requests_per_epoch"] >= 1
    assert report["tokens_per_s"] > 0
    assert report["cpu_s"] >= 0
    assert 0 < report["first_batch_s"] <= report["seconds"]


def test_bench_seq_len_text_and_refusals(local: tuple[str, int]) -> None:
    url, _ = local
    runner = CliRunner()
    text = runner.invoke(cli, ["bench", url, "--seq-len", "256", "--batch-size", "4"])
    assert text.exit_code == 0, text.output
    assert "sequences of 256 tokens" in text.output
    assert "batches of 4" in text.output
    assert "bytes per token byte" in text.output
    assert "GETs" in text.output
    # A token dataset without --seq-len: the Loader's refusal, and what to give instead.
    plain = runner.invoke(cli, ["bench", url])
    assert plain.exit_code == 2
    assert "is a token dataset" in plain.output
    assert "--seq-len" in plain.output
    for extra in (["--compare"], ["--size", "64"], ["--transform", "center-crop"]):
        refused = runner.invoke(cli, ["bench", url, "--seq-len", "256", *extra])
        assert refused.exit_code == 2, (extra, refused.output)


def test_bench_seq_len_counts_what_crossed_the_wire(s3_bucket: Any, proxy: Any) -> None:
    """uint32 tokens in a bucket, part of an epoch: the GETs and bytes the report gives are
    the ones the proxy carried (less the index the loader read before the run)."""
    stream = _write(s3_bucket.store("tokens"), documents=150, dtype="uint32", seed=2)
    options = s3_bucket.options(proxy.endpoint)
    env = {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
    }
    seq_len, batch = 1024, 2
    args = ["bench", f"{s3_bucket.url}/tokens", "--seq-len", str(seq_len), "--json"]
    args += ["--batch-size", str(batch), "--batches", "3"]
    before = proxy.stats()
    result = CliRunner(env=env).invoke(cli, args)
    after = proxy.stats()
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["batches"] == 3
    assert report["whole_epoch"] is False
    assert report["token_bytes"] == 3 * batch * (seq_len + 1) * 4  # uint32
    assert report["stream_tokens"] == stream
    assert report["epoch_batches"] == stream // (seq_len + 1) // batch
    # GETs are counted as they start: one the run's end cancelled before it was sent is in
    # the report and not at the proxy, which also carried the index's two GETs (equal once
    # in a full run on a busy machine).
    assert 1 <= report["requests"] <= after.requests - before.requests
    assert report["token_bytes"] <= report["bytes_read"] < after.bytes_down - before.bytes_down
