"""stoker pack --tokens and stoker inspect on a token dataset, through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.format.reader import open_dataset
from stoker.format.token_reader import TokenReader


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def _folder(root: Path, lengths: list[int]) -> dict[str, np.ndarray]:
    root.mkdir()
    rng = np.random.default_rng(0)
    docs = {f"d{i:02d}": rng.integers(0, 500, n).astype(np.int32) for i, n in enumerate(lengths)}
    for key, doc in docs.items():
        np.save(root / f"{key}.npy", doc)
    return docs


def test_pack_then_inspect_a_token_dataset(tmp_path: Path) -> None:
    lengths = [3, 40, 17, 25, 9, 60, 1, 33]
    docs = _folder(tmp_path / "in", lengths)
    code, out, err = _run(
        "pack", str(tmp_path / "in"), str(tmp_path / "ds"), "--tokens", "--eos-id", "500",
        "--shard-size", "100B", "--shuffle-seed", "3", "--json",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    reader = TokenReader(open_dataset(tmp_path / "ds"))
    keys = reader.dataset.index.keys
    expected = np.concatenate([np.append(docs[k], 500) for k in keys])
    assert np.array_equal(reader.read(0, reader.tokens), expected)
    assert keys != sorted(keys)  # shuffled
    assert summary["samples"] == 8
    assert summary["tokens"]["tokens"] == sum(lengths) + 8
    assert summary["tokens"]["dtype"] == "uint16"
    assert summary["tokens"]["shuffle_seed"] == 3
    assert summary["shards"] == len(reader.dataset.shards) > 2

    code, out, err = _run("inspect", str(tmp_path / "ds"), "--seq-len", "7", "--json")
    assert code == 0, err
    seen = json.loads(out)
    assert seen["tokens"] == sum(lengths) + 8
    assert seen["documents"] == 8
    assert (seen["dtype"], seen["eos_id"], seen["max_id"]) == ("uint16", 500, 500)
    assert seen["sequences"] == (sum(lengths) + 8) // 8
    assert seen["document_tokens"] == {
        "mean": round(np.mean(lengths) + 1, 1),
        "min": 2,
        "max": 61,
    }
    assert [s["tokens"] for s in seen["shards"]] == reader.layout.shard_tokens.tolist()
    assert sum(s["documents"] for s in seen["shards"]) == 8

    code, out, err = _run("inspect", str(tmp_path / "ds"), "--seq-len", "7")
    assert code == 0, err
    text = " ".join(out.split())
    assert f"token dataset, {sum(lengths) + 8} tokens in 8 documents" in text
    assert "dtype uint16, largest id 500, end-of-text id 500" in text
    assert f"mean {np.mean(lengths) + 1:.1f}, min 2, max 61" in text
    assert f"sequences per epoch at --seq-len 7: {(sum(lengths) + 8) // 8}" in text


def test_bad_documents_are_named_or_skipped_and_listed(tmp_path: Path) -> None:
    _folder(tmp_path / "in", [4, 5, 6])
    np.save(tmp_path / "in" / "big.npy", np.array([1, 70_000]))
    np.save(tmp_path / "in" / "empty.npy", np.zeros(0, np.int64))
    src, dst = str(tmp_path / "in"), str(tmp_path / "ds")
    code, _, err = _run("pack", src, dst, "--tokens", "--vocab-size", "65536")
    assert code == 1
    assert f"{tmp_path / 'in' / 'big.npy'}: document 'big': token id 70000 is out of range" in err
    code, out, err = _run(
        "pack", src, dst, "--tokens", "--vocab-size", "65536", "--on-error", "skip",
        "--keep-order",
    )  # fmt: skip
    assert code == 0, err
    assert "Packed 3 documents, 15 tokens (uint16; largest id" in out
    assert "documents in the input's order" in out
    assert "Skipped 2 documents (listed in index.json):" in err
    assert "big.npy: token id 70000 is out of range (outside the vocabulary of 65,536)" in err
    assert "empty.npy: empty document" in err
    index = open_dataset(dst).index
    assert index.keys == ["d00", "d01", "d02"]
    assert [s["key"] for s in index.skipped] == ["big", "empty"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "--resize", "64"], "--resize does not apply to a token pack"),
        (["--tokens", "--class-name", "a"], "--class-name does not apply to a token pack"),
        (["--eos-id", "2"], "--eos-id applies to token packs only (add --tokens)"),
    ],
)
def test_options_of_the_other_kind_of_pack_are_refused(
    tmp_path: Path, args: list[str], message: str
) -> None:
    code, _, err = _run("pack", str(tmp_path), str(tmp_path / "ds"), *args)
    assert code == 2
    assert message in err


def test_bin_files_and_jsonl_with_a_tokenizer_file(tmp_path: Path) -> None:
    (tmp_path / "bins").mkdir()
    (tmp_path / "bins" / "a.bin").write_bytes(np.array([1, 2, 100_000], "<i4").tobytes())
    code, out, err = _run(
        "pack", str(tmp_path / "bins"), str(tmp_path / "b"), "--tokens", "--bin-dtype", "int32"
    )
    assert code == 0, err
    reader = TokenReader(open_dataset(tmp_path / "b"))
    assert reader.layout.dtype == np.dtype("<u4")
    assert reader.read(0, 3).tolist() == [1, 2, 100_000]

    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "<eos>": 1, "hello": 2, "world": 3}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "c.jsonl").write_text('{"body": "hello world"}\n{"body": "world hello x"}\n')
    code, out, err = _run(
        "pack", str(tmp_path / "c.jsonl"), str(tmp_path / "t"), "--tokens", "--keep-order",
        "--tokenizer", str(tmp_path / "tokenizer.json"), "--text-field", "body",
        "--eos-id", "1",
    )  # fmt: skip
    assert code == 0, err
    assert "with tokenizers" in out
    reader = TokenReader(open_dataset(tmp_path / "t"))
    assert reader.read(0, reader.tokens).tolist() == [2, 3, 1, 3, 2, 0, 1]
    assert reader.dataset.index.keys == ["c_00000001", "c_00000002"]
