"""Token shards: the stream round-trips, crosses shards, and refuses corrupt bytes."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from stoker.errors import CorruptShardError, ShardFormatError
from stoker.format.reader import open_dataset
from stoker.format.token_reader import TokenReader
from stoker.format.token_writer import write_token_dataset
from stoker.format.tokens import token_dtype
from stoker.storage.open import open_store


def _documents(n: int = 60, vocab: int = 50_000, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(1, 300))) for _ in range(n)]


def _write(path: Path, docs: list[np.ndarray], **options: object) -> None:
    store = open_store(str(path))
    keyed = [(f"doc{i:04d}", d) for i, d in enumerate(docs)]
    write_token_dataset(store, keyed, **options)  # type: ignore[arg-type]


def test_the_stream_reads_back_across_shards_with_document_starts(tmp_path: Path) -> None:
    docs = _documents()
    _write(tmp_path, docs, dtype=np.dtype("uint16"), eos_id=7, shard_tokens=2_000)
    reader = TokenReader(open_dataset(tmp_path))
    expected = np.concatenate([np.append(d, 7) for d in docs])
    assert len(reader.dataset.shards) > 2
    assert reader.tokens == len(expected)
    assert reader.layout.dtype == np.dtype("<u2")
    assert reader.layout.eos_id == 7
    cut = int(reader.layout.shard_starts[1])
    for start, stop in [(0, 1), (0, len(expected)), (cut - 5, cut + 5), (17, 4_321)]:
        assert np.array_equal(reader.read(start, stop), expected[start:stop])
    assert np.array_equal(np.diff(reader.doc_starts), [len(d) + 1 for d in docs])
    pieces = reader.document_lengths(10, 900)
    assert pieces.sum() == 890
    assert (pieces > 0).all()
    assert open_dataset(tmp_path).verify().ok


def test_each_shard_is_a_tar_of_one_npy_member_numpy_loads(tmp_path: Path) -> None:
    docs = _documents(10, vocab=100_000)
    _write(tmp_path, docs, dtype=token_dtype(100_000), shard_tokens=10**9)
    with tarfile.open(tmp_path / "shard-000000.tar") as tar:
        (member,) = tar.getmembers()
        data = tar.extractfile(member).read()  # type: ignore[union-attr]
    assert member.name == "000000.tokens.npy"
    loaded = np.load(io.BytesIO(data), allow_pickle=False)
    assert loaded.dtype == np.dtype("<u4")
    assert np.array_equal(loaded, np.concatenate(docs))


def test_the_dtype_is_uint16_while_ids_fit_and_uint32_after() -> None:
    assert token_dtype(65_535) == np.dtype("<u2")
    assert token_dtype(65_536) == np.dtype("<u4")
    with pytest.raises(ValueError, match="does not fit"):
        token_dtype(1 << 32)


def test_ids_out_of_range_and_bad_documents_are_refused_by_name(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    u16 = np.dtype("uint16")
    with pytest.raises(ValueError, match=r"'big'.*70000 outside 0\.\.65535"):
        write_token_dataset(store, [("ok", np.arange(3)), ("big", np.array([70_000]))], dtype=u16)
    with pytest.raises(ValueError, match=r"'neg'.*-1"):
        write_token_dataset(store, [("neg", np.array([-1, 2]))], dtype=u16)
    with pytest.raises(ValueError, match="'empty'"):
        write_token_dataset(store, [("empty", np.array([], dtype=np.int64))], dtype=u16)
    with pytest.raises(ValueError, match="'floats'"):
        write_token_dataset(store, [("floats", np.array([1.5]))], dtype=u16)
    assert not (tmp_path / "index.json").exists()


def test_a_flipped_byte_names_the_shard_and_document(tmp_path: Path) -> None:
    _write(tmp_path, _documents(5), dtype=np.dtype("uint16"))
    shard = tmp_path / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[int(open_dataset(tmp_path).index.offset[0])] ^= 1  # the first document's first token
    shard.write_bytes(bytes(data))
    reader = TokenReader(open_dataset(tmp_path))
    with pytest.raises(CorruptShardError, match=r"shard-000000\.tar: document 'doc0000'"):
        reader.read(0, reader.tokens)
    assert not open_dataset(tmp_path).verify().ok


def test_a_read_that_cuts_a_document_checks_all_of_it(tmp_path: Path) -> None:
    docs = [np.arange(2, 402), np.arange(2, 302), np.arange(2, 202)]
    _write(tmp_path, docs, dtype=np.dtype("uint16"))
    shard = tmp_path / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[int(open_dataset(tmp_path).index.offset[1]) + 2 * 250] ^= 1  # doc0001, token 250
    shard.write_bytes(bytes(data))
    reader = TokenReader(open_dataset(tmp_path))
    assert np.array_equal(reader.read(10, 390), docs[0][10:390])  # inside doc0000: fine
    # Tokens 390-460 cut doc0000 and doc0001, neither whole in them, nor the flip: refused.
    with pytest.raises(CorruptShardError, match=r"document 'doc0001'"):
        reader.read(390, 460)


def test_a_manifest_whose_token_counts_disagree_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, _documents(5), dtype=np.dtype("uint16"))
    manifest = json.loads((tmp_path / "index.json").read_text())
    manifest["tokens"]["shards"][0]["tokens"] += 1
    manifest["tokens"]["tokens"] += 1
    (tmp_path / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardFormatError, match="token stream"):
        open_dataset(tmp_path)


def test_sample_reads_of_a_token_dataset_point_to_the_token_loader(tmp_path: Path) -> None:
    _write(tmp_path, _documents(5), dtype=np.dtype("uint16"))
    with pytest.raises(ShardFormatError, match="TokenLoader"):
        open_dataset(tmp_path)[0]
