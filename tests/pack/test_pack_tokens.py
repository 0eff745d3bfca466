"""pack_tokens: every kind of input packs to the stream of its documents (+ eos) in the
recorded order, the dtype is the narrowest that fits, and bad documents are named or
skipped and listed."""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker.errors import SourceError
from stoker.format.reader import open_dataset
from stoker.format.token_reader import TokenReader
from stoker.pack.tokens import TokenPackConfig, pack_tokens


def _docs(n: int = 30, vocab: int = 1000, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(1, 80))).astype(np.int32) for _ in range(n)]


def _npy(array: np.ndarray, **options: Any) -> bytes:
    out = io.BytesIO()
    np.save(out, array, **options)
    return out.getvalue()


def _stream(url: str | Path, **options: Any) -> tuple[np.ndarray, list[str], TokenReader]:
    reader = TokenReader(open_dataset(url, **options))
    return reader.read(0, reader.tokens), reader.dataset.index.keys, reader


def _expected(by_key: dict[str, np.ndarray], keys: list[str], eos: int | None) -> np.ndarray:
    tail = [] if eos is None else [eos]
    return np.concatenate([np.append(by_key[k], tail) for k in keys])


def test_an_npy_folder_packs_its_documents_shuffled_by_the_seed(tmp_path: Path) -> None:
    docs = _docs()
    by_key = {}
    for i, doc in enumerate(docs):
        # Nested folders and a dotted name: the key is the path without its extension.
        name = f"part{i % 3}/doc.{i:03d}.npy" if i % 2 else f"doc{i:03d}.npy"
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_bytes(_npy(doc))
        by_key[name.removesuffix(".npy").replace(".", "_")] = doc
    config = TokenPackConfig(eos_id=1000, shuffle_seed=7, max_shard_bytes=400)
    report = pack_tokens(tmp_path / "in", tmp_path / "ds", config=config)
    stream, keys, reader = _stream(tmp_path / "ds")
    assert sorted(keys) == sorted(by_key)
    assert np.array_equal(stream, _expected(by_key, keys, 1000))
    listed = sorted(by_key, key=lambda k: k.replace("_", "."))
    shuffled = list(range(len(listed)))
    random.Random(7).shuffle(shuffled)
    assert keys == [listed[n] for n in shuffled]  # the seed's order of the listing
    assert reader.dataset.index.packed_with["shuffle_seed"] == 7
    assert len(reader.dataset.shards) > 3
    assert reader.layout.dtype == np.dtype("<u2")
    assert reader.layout.eos_id == 1000
    assert report.tokens is not None
    assert (report.samples, report.tokens.tokens, report.tokens.dtype) == (
        30,
        len(stream),
        "uint16",
    )
    assert report.tokens.max_id == 1000
    assert report.shards == len(reader.dataset.shards)
    kept = pack_tokens(
        tmp_path / "in", tmp_path / "kept", config=TokenPackConfig(shuffle_seed=None)
    )
    stream, keys, reader = _stream(tmp_path / "kept")
    assert keys == listed
    assert kept.tokens is not None
    assert kept.tokens.shuffle_seed is None
    assert reader.dataset.index.packed_with["shuffle_seed"] is None
    assert np.array_equal(stream, _expected(by_key, keys, None))


def test_bin_files_need_their_dtype_and_large_ids_make_uint32(tmp_path: Path) -> None:
    docs = _docs(8, vocab=100_000, seed=1)
    for i, doc in enumerate(docs):
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"{i}.bin").write_bytes(doc.astype("<u4").tobytes())
    with pytest.raises(ValueError, match="--bin-dtype"):
        pack_tokens(tmp_path / "in", tmp_path / "ds")
    config = TokenPackConfig(bin_dtype="uint32", shuffle_seed=None)
    pack_tokens(tmp_path / "in", tmp_path / "ds", config=config)
    stream, keys, reader = _stream(tmp_path / "ds")
    assert reader.layout.dtype == np.dtype("<u4")
    assert np.array_equal(stream, _expected({str(i): d for i, d in enumerate(docs)}, keys, None))


@pytest.mark.parametrize(
    ("vocab_size", "top", "dtype"),
    [
        (None, 65_535, "uint16"),
        (None, 65_536, "uint32"),
        (65_536, 10, "uint16"),
        (65_537, 10, "uint32"),
    ],
)
def test_the_dtype_is_the_narrowest_for_the_vocabulary_or_the_largest_id(
    tmp_path: Path, vocab_size: int | None, top: int, dtype: str
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.npy").write_bytes(_npy(np.array([0, top], dtype=np.int64)))
    config = TokenPackConfig(vocab_size=vocab_size)
    stats = pack_tokens(tmp_path / "in", tmp_path / "ds", config=config).tokens
    assert stats is not None
    assert stats.dtype == dtype
    stream, _, reader = _stream(tmp_path / "ds")
    assert reader.layout.dtype.name == dtype
    assert stream.tolist() == [0, top]


def _bad_folder(root: Path) -> dict[str, str]:
    """Good documents, and bad ones with the reason each is named for."""
    root.mkdir()
    for i, doc in enumerate(_docs(5, vocab=900)):
        (root / f"ok{i}.npy").write_bytes(_npy(doc))
    bad = {
        "big": (
            _npy(np.array([3, 900, 4])),
            "token id 900 is out of range (outside the vocabulary of 900)",
        ),
        "neg": (_npy(np.array([3, -2])), "token id -2 is negative"),
        "empty": (_npy(np.zeros(0, np.int32)), "empty document"),
        "flat": (_npy(np.ones(3, np.float32)), "an array of float32, expected integer token ids"),
        "square": (_npy(np.ones((2, 2), np.int32)), "a 2-D array of shape (2, 2)"),
        "pickled": (_npy(np.array([{"a": 1}], dtype=object), allow_pickle=True), "Python objects"),
        "cut": (_npy(np.arange(9))[:-5], "needs 72 bytes of data, has 67"),
    }
    for key, (data, _) in bad.items():
        (root / f"{key}.npy").write_bytes(data)
    return {key: reason for key, (_, reason) in bad.items()}


@pytest.mark.parametrize(
    "wrong", [{"eos_id": True}, {"vocab_size": False}, {"eos_id": 2.0}, {"workers": True}]
)
def test_a_bool_or_float_is_not_an_id(wrong: dict[str, Any], tmp_path: Path) -> None:
    # eos_id=True packed (True == 1 to Python) a dataset whose index could not be read.
    ((name, value),) = wrong.items()
    with pytest.raises(TypeError, match=f"{name} must be an int, got {value!r}"):
        TokenPackConfig(**wrong)


def test_bad_documents_are_named_or_skipped_and_listed(tmp_path: Path) -> None:
    reasons = _bad_folder(tmp_path / "in")
    config = TokenPackConfig(vocab_size=900)
    with pytest.raises(
        SourceError, match=r"big\.npy: document 'big': token id 900 is out of range"
    ):
        pack_tokens(tmp_path / "in", tmp_path / "ds", config=config)
    assert not (tmp_path / "ds" / "index.json").exists()
    with pytest.raises(ValueError, match="eos id 900 is outside the vocabulary of 900"):
        pack_tokens(
            tmp_path / "in", tmp_path / "ds1", config=TokenPackConfig(vocab_size=900, eos_id=900)
        )
    config = TokenPackConfig(vocab_size=900, on_error="skip", eos_id=5)
    report = pack_tokens(tmp_path / "in", tmp_path / "ds2", config=config)
    skipped = {s["key"]: s for s in report.skipped}
    assert set(skipped) == set(reasons)
    for key, reason in reasons.items():
        assert reason in skipped[key]["reason"], (key, skipped[key])
        assert skipped[key]["source"] == str(tmp_path / "in" / f"{key}.npy")
    assert report.samples == 5
    index = open_dataset(tmp_path / "ds2").index
    assert index.skipped == report.skipped
    assert len(index) == 5


def test_concatenated_tokens_are_cut_at_their_offsets(tmp_path: Path) -> None:
    docs = _docs(12, vocab=70_000, seed=2)
    tokens = np.concatenate(docs).astype(np.uint32)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    np.save(tmp_path / "train.npy", tokens)
    np.save(tmp_path / "offsets.npy", offsets)
    report = pack_tokens(
        tmp_path / "train.npy",
        tmp_path / "ds",
        offsets=tmp_path / "offsets.npy",
        config=TokenPackConfig(eos_id=0),
    )
    stream, keys, reader = _stream(tmp_path / "ds")
    by_key = {f"train_{i:08d}": d for i, d in enumerate(docs)}
    assert np.array_equal(stream, _expected(by_key, keys, 0))
    assert report.source_format == "concatenated"
    assert reader.layout.dtype == np.dtype("<u4")
    # An empty document (two equal offsets) is named by its number and tokens.
    np.save(tmp_path / "holes.npy", np.array([0, 5, 5, len(tokens)]))
    with pytest.raises(SourceError, match=r"train\.npy document 1 \(tokens 5:5\).*empty"):
        pack_tokens(tmp_path / "train.npy", tmp_path / "ds2", offsets=tmp_path / "holes.npy")
    np.save(tmp_path / "short.npy", np.array([0, 5]))
    with pytest.raises(ValueError, match=r"from 0 to the \d+ tokens"):
        pack_tokens(tmp_path / "train.npy", tmp_path / "ds3", offsets=tmp_path / "short.npy")
    with pytest.raises(ValueError, match="--offsets"):
        pack_tokens(tmp_path / "train.npy", tmp_path / "ds4")
    # Raw concatenated ids: the same documents.
    (tmp_path / "train.bin").write_bytes(tokens.astype("<i8").tobytes())
    config = TokenPackConfig(bin_dtype="int64", shuffle_seed=None)
    pack_tokens(
        tmp_path / "train.bin", tmp_path / "ds5", offsets=tmp_path / "offsets.npy", config=config
    )
    stream, keys, _ = _stream(tmp_path / "ds5")
    assert keys == sorted(by_key)
    assert np.array_equal(stream, _expected(by_key, keys, None))


def _bytes_tokenizer(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_jsonl_text_with_a_function_tokenizer(tmp_path: Path) -> None:
    texts = ["hello world", "ünïcode text", "a", "the last line, no newline"]
    lines = [json.dumps({"text": t, "id": n}) for n, t in enumerate(texts)]
    lines.insert(2, "")  # blank lines are no documents
    lines.insert(3, json.dumps({"body": "no text field"}))
    lines.insert(4, "{not json")
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines))
    with pytest.raises(
        SourceError, match=r"corpus\.jsonl line 4: document 'corpus_00000004': no 'text'"
    ):
        pack_tokens(tmp_path / "corpus.jsonl", tmp_path / "ds", tokenizer=_bytes_tokenizer)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        pack_tokens(tmp_path / "corpus.jsonl", tmp_path / "ds")
    config = TokenPackConfig(on_error="skip", eos_id=256, vocab_size=257)
    report = pack_tokens(
        tmp_path / "corpus.jsonl", tmp_path / "ds", tokenizer=_bytes_tokenizer, config=config
    )
    assert [s["key"] for s in report.skipped] == ["corpus_00000004", "corpus_00000005"]
    assert "not JSON" in report.skipped[1]["reason"]
    stream, keys, _ = _stream(tmp_path / "ds")
    numbers = [1, 2, 6, 7]  # line numbers of the texts
    by_key = {
        f"corpus_{n:08d}": np.array(_bytes_tokenizer(t))
        for n, t in zip(numbers, texts, strict=False)
    }
    assert np.array_equal(stream, _expected(by_key, keys, 256))
    assert report.tokens is not None
    assert report.tokens.tokenizer == "function _bytes_tokenizer"


def _word_level_tokenizer(path: Path, words: list[str]) -> int:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {w: n for n, w in enumerate(["[UNK]", *words])}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return len(vocab)


def test_parquet_text_with_a_tokenizers_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    size = _word_level_tokenizer(tmp_path / "tokenizer.json", words)
    texts = ["the cat sat", "a dog ran on the mat", "unknown words here", "cat"]
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"content": texts[:2], "n": [1, 2]}), tmp_path / "data" / "a.parquet")
    pq.write_table(pa.table({"content": texts[2:], "n": [3, 4]}), tmp_path / "data" / "b.parquet")
    with pytest.raises(ValueError, match=r"no column 'text'.*--text-field"):
        pack_tokens(tmp_path / "data", tmp_path / "ds", tokenizer=tmp_path / "tokenizer.json")
    config = TokenPackConfig(text_field="content", eos_id=size - 1)
    report = pack_tokens(
        tmp_path / "data", tmp_path / "ds", tokenizer=tmp_path / "tokenizer.json", config=config
    )
    ids = {w: n for n, w in enumerate(["[UNK]", *words])}
    by_key = {
        f"{f}_{row:08d}": np.array([ids.get(w, 0) for w in texts[k].split()])
        for k, (f, row) in enumerate([("a", 0), ("a", 1), ("b", 0), ("b", 1)])
    }
    stream, keys, reader = _stream(tmp_path / "ds")
    assert np.array_equal(stream, _expected(by_key, keys, size - 1))
    assert reader.dataset.index.packed_with["vocab_size"] == size
    assert report.tokens is not None
    assert report.tokens.tokenizer is not None
    assert "vocabulary 9" in report.tokens.tokenizer


def test_a_tokenizer_file_without_tokenizers_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "t.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails as if not installed
    with pytest.raises(ImportError, match="pip install"):
        pack_tokens(tmp_path / "t.jsonl", tmp_path / "ds", tokenizer=tmp_path / "tokenizer.json")


def test_the_destination_must_be_empty_and_outside_the_source(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.npy").write_bytes(_npy(np.arange(4)))
    with pytest.raises(ValueError, match="inside the source folder"):
        pack_tokens(tmp_path / "in", tmp_path / "in" / "ds")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"not empty, it holds 'notes.txt'"):
        pack_tokens(tmp_path / "in", tmp_path / "ds")
    assert [p.name for p in (tmp_path / "ds").iterdir()] == ["notes.txt"]


def test_a_bucket_folder_of_documents_packs_into_a_bucket(s3_bucket: Any) -> None:
    docs = _docs(20, seed=3)
    store = s3_bucket.store("in")
    for i, doc in enumerate(docs):
        store.put(f"shard{i % 2}/{i:02d}.npy", _npy(doc))
    store.put("bad.npy", _npy(np.array([5, 2000])))
    options = s3_bucket.options()
    config = TokenPackConfig(eos_id=0, vocab_size=1000, on_error="skip", workers=4)
    report = pack_tokens(
        f"{s3_bucket.url}/in", f"{s3_bucket.url}/ds", config=config, storage_options=options
    )
    assert [s["source"] for s in report.skipped] == [f"{s3_bucket.url}/in/bad.npy"]
    stream, keys, _ = _stream(f"{s3_bucket.url}/ds", storage_options=options)
    by_key = {f"shard{i % 2}/{i:02d}": d for i, d in enumerate(docs)}
    assert np.array_equal(stream, _expected(by_key, keys, 0))
    assert report.requests["source"]["requests.get"] >= 21


def test_bucket_jsonl_in_small_chunks_parquet_and_concatenated_tokens(
    s3_bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stoker.pack import token_text

    monkeypatch.setattr(token_text, "JSONL_CHUNK_BYTES", 7)  # lines cut across reads
    texts = ["first text", "", "второй", "the third, longer than a chunk"]
    store = s3_bucket.store()
    store.put("j/a.jsonl", "\n".join(json.dumps({"text": t}) for t in texts).encode())
    out = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), out)
    store.put("p/b.parquet", out.getvalue())
    docs = _docs(5, seed=4)
    store.put("c/cat.npy", _npy(np.concatenate(docs)))
    store.put("c/_offsets.npy", _npy(np.cumsum([0, *map(len, docs)])))
    options = s3_bucket.options()
    for name, key in [("j", "a_{:08d}"), ("p", "b_{:08d}")]:
        pack_tokens(
            f"{s3_bucket.url}/{name}",
            f"{s3_bucket.url}/{name}-ds",
            tokenizer=_bytes_tokenizer,
            config=TokenPackConfig(on_error="skip", eos_id=300),
            storage_options=options,
        )
        stream, keys, _ = _stream(f"{s3_bucket.url}/{name}-ds", storage_options=options)
        first = 1 if name == "j" else 0  # JSONL lines count from 1, Parquet rows from 0
        by_key = {
            key.format(n + first): np.array(_bytes_tokenizer(t)) for n, t in enumerate(texts) if t
        }
        assert np.array_equal(stream, _expected(by_key, keys, 300))
        assert sorted(keys) == sorted(by_key)
    pack_tokens(
        f"{s3_bucket.url}/c/cat.npy",
        f"{s3_bucket.url}/c-ds",
        offsets=f"{s3_bucket.url}/c/_offsets.npy",
        storage_options=options,
    )
    stream, keys, _ = _stream(f"{s3_bucket.url}/c-ds", storage_options=options)
    by_key = {f"cat_{n:08d}": d for n, d in enumerate(docs)}
    assert np.array_equal(stream, _expected(by_key, keys, None))


def test_parquet_text_is_read_by_the_one_parquet_reader_and_a_broken_file_is_named(
    tmp_path: Path,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"text": ["ab", "cde"]}), tmp_path / "data" / "a.parquet")
    (tmp_path / "data" / "_SUCCESS").write_bytes(b"")  # Spark's marker: hidden, not read
    report = pack_tokens(tmp_path / "data", tmp_path / "ds", tokenizer=_bytes_tokenizer)
    assert report.samples == 2
    (tmp_path / "data" / "b.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(SourceError, match=r"b\.parquet: cannot read as Parquet"):
        pack_tokens(tmp_path / "data", tmp_path / "ds2", tokenizer=_bytes_tokenizer)
