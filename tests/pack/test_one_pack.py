"""One pack, whatever the unit (issue 33, items 3 and 4): a token pack resumes an
interrupted run as an image pack does; both refuse what they did not write in the same
words; both report progress with one signature and return one report type."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker.errors import StokerError
from stoker.format.reader import open_dataset
from stoker.format.token_reader import TokenReader
from stoker.pack import packer, tokens
from stoker.pack.packer import PackConfig, pack
from stoker.pack.tokens import TokenPackConfig, pack_tokens
from stoker.testing.images import write_image_folder

#: Documents of 40 to 80 tokens in shards of 100 tokens (200 bytes of uint16): about 20.
TOKEN_CONFIG = TokenPackConfig(eos_id=999, vocab_size=1000, max_shard_bytes=200)


def _documents(root: Path, n: int = 30) -> None:
    rng = np.random.default_rng(7)
    root.mkdir(parents=True)
    for i in range(n):
        out = io.BytesIO()
        np.save(out, rng.integers(0, 999, int(rng.integers(40, 80))).astype(np.int32))
        (root / f"doc_{i:03d}.npy").write_bytes(out.getvalue())


def _stream(root: Path) -> tuple[np.ndarray, list[str]]:
    reader = TokenReader(open_dataset(root))
    return reader.read(0, reader.tokens), reader.dataset.index.keys


def _shards(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.glob("shard-*")}


def test_an_interrupted_token_pack_resumes_writing_only_the_shards_it_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _documents(tmp_path / "in")
    whole = pack_tokens(tmp_path / "in", tmp_path / "whole", config=TOKEN_CONFIG)
    assert whole.shards > 5

    write = tokens.write_token_shard
    written: list[int] = []
    link = {"down_at": 4}

    def fail_at_the_fourth(store: Any, number: int, *args: Any, **kwargs: Any) -> Any:
        written.append(number)
        if len(written) == link["down_at"]:
            raise OSError("the link went down")
        return write(store, number, *args, **kwargs)

    monkeypatch.setattr(tokens, "write_token_shard", fail_at_the_fourth)
    with pytest.raises(OSError, match="link went down"):
        pack_tokens(tmp_path / "in", tmp_path / "ds", config=TOKEN_CONFIG)
    assert not (tmp_path / "ds" / "index.json").exists()  # nothing committed
    assert len(_shards(tmp_path / "ds")) == 3

    written.clear()
    link["down_at"] = 0  # up again
    resumed = pack_tokens(tmp_path / "in", tmp_path / "ds", config=TOKEN_CONFIG)
    assert resumed.shards_reused == 3
    assert written == list(range(3, whole.shards))  # only the missing shards
    assert resumed.bytes_out < whole.bytes_out
    assert (resumed.samples, resumed.shards, resumed.tokens) == (
        whole.samples,
        whole.shards,
        whole.tokens,
    )
    assert _shards(tmp_path / "ds") == _shards(tmp_path / "whole")
    stream, keys = _stream(tmp_path / "ds")
    assert keys == _stream(tmp_path / "whole")[1]
    assert np.array_equal(stream, _stream(tmp_path / "whole")[0])


def test_a_finished_token_pack_run_again_writes_no_shard(tmp_path: Path) -> None:
    _documents(tmp_path / "in")
    first = pack_tokens(tmp_path / "in", tmp_path / "ds", config=TOKEN_CONFIG)
    stream, keys = _stream(tmp_path / "ds")
    again = pack_tokens(tmp_path / "in", tmp_path / "ds", config=TOKEN_CONFIG)
    assert (again.shards_reused, again.bytes_out) == (first.shards, 0)
    assert (again.samples, again.tokens) == (first.samples, first.tokens)
    assert _stream(tmp_path / "ds")[1] == keys
    assert np.array_equal(_stream(tmp_path / "ds")[0], stream)


def test_a_token_pack_with_other_arguments_is_refused_naming_them(tmp_path: Path) -> None:
    _documents(tmp_path / "in")
    pack_tokens(tmp_path / "in", tmp_path / "ds", config=TOKEN_CONFIG)
    before = _shards(tmp_path / "ds")
    other = TokenPackConfig(eos_id=998, vocab_size=1000, max_shard_bytes=200)
    with pytest.raises(StokerError, match=r"eos_id: 999 then, 998 now"):
        pack_tokens(tmp_path / "in", tmp_path / "ds", config=other)
    assert _shards(tmp_path / "ds") == before


def test_both_packs_refuse_what_they_did_not_write_in_the_same_words(tmp_path: Path) -> None:
    _documents(tmp_path / "docs")
    write_image_folder(tmp_path / "images", files=6, classes=2)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "notes.txt").write_text("mine")
    refusals = []
    for run in (
        lambda: pack(tmp_path / "images", tmp_path / "ds"),
        lambda: pack_tokens(tmp_path / "docs", tmp_path / "ds"),
    ):
        with pytest.raises(ValueError, match=r"not empty, it holds 'notes.txt'") as caught:
            run()
        refusals.append(str(caught.value))
    assert refusals[0] == refusals[1]
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["notes.txt"]


def test_a_token_pack_refuses_an_image_pack_and_the_reverse(tmp_path: Path) -> None:
    _documents(tmp_path / "docs")
    write_image_folder(tmp_path / "images", files=6, classes=2)
    pack(tmp_path / "images", tmp_path / "images_ds")
    pack_tokens(tmp_path / "docs", tmp_path / "tokens_ds")
    with pytest.raises(StokerError, match="already holds a pack of other input"):
        pack_tokens(tmp_path / "docs", tmp_path / "images_ds")
    with pytest.raises(StokerError, match="already holds a pack of other input"):
        pack(tmp_path / "images", tmp_path / "tokens_ds")


def test_both_packs_report_progress_with_one_signature_and_one_report_type(
    tmp_path: Path,
) -> None:
    _documents(tmp_path / "docs")
    write_image_folder(tmp_path / "images", files=12, classes=3)
    calls: dict[str, list[tuple[int | None, int, int]]] = {"images": [], "tokens": []}
    images = pack(
        tmp_path / "images",
        tmp_path / "a",
        config=PackConfig(samples_per_shard=4),
        progress=lambda total, samples, nbytes: calls["images"].append((total, samples, nbytes)),
    )
    token_report = pack_tokens(
        tmp_path / "docs",
        tmp_path / "b",
        config=TOKEN_CONFIG,
        progress=lambda total, samples, nbytes: calls["tokens"].append((total, samples, nbytes)),
    )
    assert type(images) is type(token_report) is packer.PackReport
    assert images.tokens is None
    assert token_report.tokens is not None
    for name, report in (("images", images), ("tokens", token_report)):
        seen = calls[name]
        assert sum(samples for _, samples, _ in seen) == report.samples
        assert {total for total, _, _ in seen} == {report.samples}
        assert sum(nbytes for _, _, nbytes in seen) > 0


def test_pack_packs_tokens_given_a_token_config_and_refuses_mixed_arguments(
    tmp_path: Path,
) -> None:
    _documents(tmp_path / "docs")
    write_image_folder(tmp_path / "images", files=4, classes=2)
    report = pack(tmp_path / "docs", tmp_path / "ds", config=TOKEN_CONFIG)
    assert report.tokens is not None
    assert report.samples == 30
    assert np.array_equal(
        _stream(tmp_path / "ds")[0],
        _stream_of(pack_tokens(tmp_path / "docs", tmp_path / "again", config=TOKEN_CONFIG)),
    )
    with pytest.raises(ValueError, match="apply to a pack of samples"):
        pack(tmp_path / "docs", tmp_path / "x", config=TOKEN_CONFIG, class_names=["a"])
    with pytest.raises(ValueError, match="apply to a pack of samples"):
        pack(tmp_path / "images", tmp_path / "y", tokenizer=lambda text: [1])
    assert not (tmp_path / "x").exists()
    assert not (tmp_path / "y").exists()


def _stream_of(report: Any) -> np.ndarray:
    return _stream(Path(report.destination))[0]
