"""Bad members at read time: a truncated npy, invalid JSON, a caption that is not UTF-8,
an npy header that is no Python literal and JSON nested past Python's recursion limit,
in WebDataset tars written by the webdataset library (raw bytes, encoder=False) and
indexed in place, which does not check members. The Loader names the sample and the
field, or with on_error="skip" counts and lists it."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from stoker import DecodeConfig
from stoker.format import records
from stoker.pack.indexer import index_webdataset
from stoker.pipeline import fields
from stoker.pipeline.loader import Loader

SAMPLES = 10
BAD_KEY = "rec0006"


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _good(i: int) -> dict[str, bytes]:
    return {
        "npy": _npy(np.arange(10, dtype=np.float32) * i),
        "json": json.dumps({"i": i, "tags": ["a", "b"]}).encode(),
        "txt": f"record {i}, ünïcode".encode(),
        "cls": str(i % 3).encode(),
    }


#: Kind of damage -> (member, its bytes, what the Loader says about it).
BAD = {
    "truncated npy": (
        "npy",
        _npy(np.arange(10, dtype=np.float32))[:-7],
        r"npy array of shape \(10,\) and dtype float32 needs 40 bytes of data, has 33",
    ),
    "invalid json": ("json", b'{"i": 6, "tags": ["a", ', r"invalid JSON: Expecting value"),
    "txt not utf-8": (
        "txt",
        b"caf\xe9 au lait",
        r"not UTF-8 text: invalid continuation byte at byte 3",
    ),
    # numpy reads a header that is no Python literal with the tokenizer, whose TokenError
    # is no ValueError either: the sample stopped training.
    "npy header no literal": (
        "npy",
        _npy(np.arange(10, dtype=np.float32)).replace(b"'<f4', ", b"'<f4'[ ", 1),
        r"not an npy array: ",
    ),
    # ast.literal_eval names an expression by its node's repr: "<ast.Call object at 0x...>".
    "npy header with a call": (
        "npy",
        _npy(np.arange(10, dtype=np.float32)).replace(b"(10,)", b"(f(),)", 1),
        r"not an npy array: its header holds an expression \(Call\) where numpy writes only "
        r"literals",
    ),
    # json.loads raises RecursionError here, which is no ValueError: on_error="skip" could
    # not skip it, and training stopped.
    "json nested too deep": ("json", b"[" * 100_000, r"invalid JSON: nested too deeply"),
}


@pytest.fixture(scope="module")
def bad_urls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import webdataset as wds

    urls = {}
    for n, (kind, (member, data, _)) in enumerate(BAD.items()):
        root = tmp_path_factory.mktemp(f"bad{n}")
        with wds.TarWriter(str(root / "records-0000.tar"), encoder=False) as sink:
            for i in range(SAMPLES):
                record: dict[str, object] = {"__key__": f"rec{i:04d}", **_good(i)}
                if record["__key__"] == BAD_KEY:
                    record[member] = data
                sink.write(record)
        index_webdataset(root)  # indexing reads the tar's layout, not its members
        urls[kind] = str(root)
    return urls


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_member_is_an_error_naming_sample_and_field(
    bad_urls: dict[str, str], kind: str
) -> None:
    member, _, message = BAD[kind]
    with (
        Loader(bad_urls[kind], batch_size=4, decode=DecodeConfig(threads=2)) as loader,
        pytest.raises(
            ValueError,
            match=rf"sample '{BAD_KEY}': field '{member}' \(member '{member}'\): {message}",
        ),
    ):
        list(loader)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_member_is_skipped_counted_and_listed(bad_urls: dict[str, str], kind: str) -> None:
    member, _, message = BAD[kind]
    with Loader(
        bad_urls[kind], batch_size=4, decode=DecodeConfig(threads=2, on_error="skip")
    ) as loader:
        batches = list(loader)
        stats = loader.stats()
    keys = [key for batch in batches for key in batch["key"]]
    assert sorted(keys) == [f"rec{i:04d}" for i in range(SAMPLES) if f"rec{i:04d}" != BAD_KEY]
    assert [key for key, _ in stats.skipped] == [BAD_KEY]
    (reason,) = [reason for _, reason in stats.skipped]
    assert f"field '{member}' (member '{member}')" in reason
    assert re.search(message, reason)
    # The good samples' fields are all there, decoded.
    for batch in batches:
        for key, text, meta in zip(batch["key"], batch["txt"], batch["json"], strict=True):
            i = int(key[3:])
            assert text == f"record {i}, ünïcode"
            assert meta == {"i": i, "tags": ["a", "b"]}


def test_the_read_path_decodes_with_the_format_layers_table() -> None:
    # One table for pack and the Loader: stoker.pipeline.fields re-exports it.
    for name in (
        "FIELD_DECODERS",
        "FieldDecoder",
        "decode_image",
        "decode_int",
        "decode_json",
        "decode_npy",
        "decode_text",
        "decoder_for",
        "keep_bytes",
    ):
        assert getattr(fields, name) is getattr(records, name)


def test_bad_members_in_a_tar_indexed_in_place_are_where_the_index_says(
    bad_urls: dict[str, str],
) -> None:
    # The fixture is what the tests above read: its bad member is really in the tar.
    from stoker.format.reader import open_dataset

    dataset = open_dataset(bad_urls["invalid json"])
    (sample,) = [s for s in dataset.read_many(range(len(dataset))) if s["key"] == BAD_KEY]
    assert sample["json"] == BAD["invalid json"][1]
    assert Path(bad_urls["invalid json"], "index.json").exists()
