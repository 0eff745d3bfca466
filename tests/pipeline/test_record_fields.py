"""Every field of a record reaches the batch: image-caption-JSON tars written by the
webdataset library, indexed in place and streamed by the Loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stoker import DecodeConfig, FieldsConfig
from stoker.errors import StokerError
from stoker.format.reader import open_dataset
from stoker.pack.indexer import index_webdataset
from stoker.pack.packer import pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import CenterCrop
from stoker.testing.images import make_jpeg

SAMPLES = 12


def _captioned(i: int) -> dict[str, object]:
    return {
        "__key__": f"{i:04d}",
        "jpg": make_jpeg(np.random.default_rng(i), width=40 + i, height=32),
        "txt": f"caption number {i}, with ünïcode",
        "json": {"width": 40 + i, "tags": ["a"] * (i % 3)},
        "cls": i % 3,
    }


@pytest.fixture(scope="module")
def captioned_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    import webdataset as wds

    root = tmp_path_factory.mktemp("captioned")
    for shard in range(2):
        with wds.TarWriter(str(root / f"pairs-{shard:04d}.tar")) as sink:
            for i in range(shard * SAMPLES // 2, (shard + 1) * SAMPLES // 2):
                sink.write(_captioned(i))
    index_webdataset(root)
    return str(root)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_captions_and_json_reach_the_batch(captioned_url: str, method: str) -> None:
    seen: dict[str, tuple[str, object, int]] = {}
    with Loader(
        captioned_url,
        batch_size=5,
        transform=CenterCrop(16),
        decode=DecodeConfig(threads=2, method=method),  # type: ignore[arg-type]
    ) as loader:
        for batch in loader:
            assert batch["image"].shape[1:] == (16, 16, 3)
            assert isinstance(batch["txt"], list)
            assert "cls" not in batch  # the class once, as label (read from .cls)
            for key, text, meta, cls in zip(
                batch["key"], batch["txt"], batch["json"], batch["label"], strict=True
            ):
                seen[key] = (text, meta, int(cls))
    assert len(seen) == SAMPLES
    for key, (text, meta, cls) in seen.items():
        expected = _captioned(int(key))
        assert text == expected["txt"]
        assert meta == expected["json"]
        assert cls == expected["cls"]


@pytest.fixture(scope="module")
def captioned_packed_url(captioned_url: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same tars packed by stoker (which shuffles them into its own shards)."""
    out = tmp_path_factory.mktemp("captioned-packed") / "ds"
    pack(sorted(Path(captioned_url).glob("*.tar"))[0].parent, out)
    return str(out)


@pytest.mark.parametrize("kind", ["indexed", "packed"])
def test_every_field_matches_webdatasets_own_decoding(
    captioned_url: str, captioned_packed_url: str, kind: str
) -> None:
    from webdataset import autodecode, tariterators

    decode = autodecode.Decoder([autodecode.imagehandler("rgb8"), autodecode.basichandlers])
    theirs: dict[str, dict[str, object]] = {}
    for path in sorted(Path(captioned_url).glob("*.tar")):
        with path.open("rb") as stream:
            files = ({**f, "__url__": str(path)} for f in tariterators.tar_file_iterator(stream))
            for sample in tariterators.group_by_keys(files):
                theirs[sample["__key__"]] = decode(sample)
    url = captioned_url if kind == "indexed" else captioned_packed_url
    ours: dict[str, tuple[object, ...]] = {}
    with Loader(url, batch_size=4) as loader:  # no transform: whole images
        for batch in loader:
            for n, key in enumerate(batch["key"]):
                ours[key] = (batch["image"][n], batch["txt"][n], batch["json"][n])
    assert ours.keys() == theirs.keys()
    for key, (image, text, meta) in ours.items():
        assert text == theirs[key]["txt"]
        assert meta == theirs[key]["json"]
        assert json.dumps(meta) == json.dumps(theirs[key]["json"])
        np.testing.assert_array_equal(image, theirs[key]["jpg"])


def _arrays(i: int) -> dict[str, object]:
    record: dict[str, object] = {
        "__key__": f"doc{i:04d}",
        "npy": np.arange(i % 5 + 1, dtype=np.float32) * i,
        "cls": i % 2,
    }
    if i % 4 != 3:  # every fourth record has no caption
        record["txt"] = f"document {i}"
    return record


@pytest.fixture(scope="module")
def arrays_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    import webdataset as wds

    root = tmp_path_factory.mktemp("arrays")
    with wds.TarWriter(str(root / "arrays-0000.tar")) as sink:
        for i in range(SAMPLES):
            sink.write(_arrays(i))
    index_webdataset(root)
    return str(root)


def test_records_without_images_stream_with_ragged_arrays_as_lists(arrays_url: str) -> None:
    fields = FieldsConfig(select={"vector": "npy", "caption": "txt"}, missing="none")
    with Loader(arrays_url, batch_size=5, decode=DecodeConfig(fields=fields)) as loader:
        batches = list(loader)
    assert "image" not in batches[0]
    seen = {}
    for batch in batches:
        assert isinstance(batch["vector"], list)
        for key, vector, caption in zip(
            batch["key"], batch["vector"], batch["caption"], strict=True
        ):
            seen[key] = (vector, caption)
    assert len(seen) == SAMPLES
    for key, (vector, caption) in seen.items():
        expected = _arrays(int(key[3:]))
        np.testing.assert_array_equal(vector, expected["npy"])
        assert vector.dtype == np.float32
        assert caption == expected.get("txt")


def test_ragged_arrays_padded_with_lengths(arrays_url: str) -> None:
    fields = FieldsConfig(select={"vector": "npy"}, pad={"vector": -1})
    with Loader(arrays_url, batch_size=SAMPLES, decode=DecodeConfig(fields=fields)) as loader:
        (batch,) = list(loader)
    assert batch["vector"].shape == (SAMPLES, 5)
    assert batch["vector"].dtype == np.float32
    for row, (key, length) in enumerate(zip(batch["key"], batch["vector_lengths"], strict=True)):
        expected = _arrays(int(key[3:]))["npy"]
        assert length == len(expected)
        np.testing.assert_array_equal(batch["vector"][row, :length], expected)
        assert (batch["vector"][row, length:] == -1).all()


def test_a_missing_field_is_an_error_naming_sample_and_field(arrays_url: str) -> None:
    fields = FieldsConfig(select={"caption": "txt"})
    with (
        Loader(arrays_url, batch_size=4, decode=DecodeConfig(fields=fields)) as loader,
        pytest.raises(ValueError, match=r"'doc00(03|07|11)': no field 'caption' \(member 'txt'"),
    ):
        list(loader)


def test_missing_skip_counts_and_lists_the_samples(arrays_url: str) -> None:
    fields = FieldsConfig(select={"caption": "txt"}, missing="skip")
    with Loader(arrays_url, batch_size=4, decode=DecodeConfig(fields=fields)) as loader:
        keys = [k for batch in loader for k in batch["key"]]
        skipped = loader.stats().skipped
    assert sorted(k for k, _ in skipped) == ["doc0003", "doc0007", "doc0011"]
    assert all("no field 'caption'" in reason for _, reason in skipped)
    assert len(keys) == SAMPLES - 3


def test_every_field_by_default_without_images(arrays_url: str) -> None:
    with Loader(
        arrays_url, batch_size=SAMPLES, decode=DecodeConfig(fields=FieldsConfig(missing="none"))
    ) as loader:
        (batch,) = list(loader)
    assert sorted(batch) == ["index", "key", "label", "npy", "txt"]  # cls is the label
    np.testing.assert_array_equal(batch["label"], [int(k[3:]) % 2 for k in batch["key"]])


def test_members_named_key_and_label_are_kept_not_replaced(tmp_path: Path) -> None:
    # The reader's own "key" and "label" used to overwrite these members without a word.
    import webdataset as wds

    with wds.TarWriter(str(tmp_path / "named-0000.tar")) as sink:
        for i in range(4):
            sink.write({"__key__": f"s{i}", "key": f"user-{i}", "label": str(i + 5), "cls": 1})
    index_webdataset(tmp_path)
    sample = open_dataset(str(tmp_path))[0]
    assert (sample["key"], sample["label"]) == ("s0", 1)
    assert (sample["key_member"], sample["label_member"]) == (b"user-0", b"5")
    chosen = FieldsConfig(select={"user_key": "key", "user_label": "label"})
    for fields, names in [
        (None, ("key_member", "label_member")),
        (chosen, ("user_key", "user_label")),
    ]:
        decode = DecodeConfig() if fields is None else DecodeConfig(fields=fields)
        with Loader(str(tmp_path), batch_size=4, decode=decode) as loader:
            (batch,) = list(loader)
        numbers = [int(key[1:]) for key in batch["key"]]
        assert batch[names[0]] == [f"user-{i}".encode() for i in numbers]
        np.testing.assert_array_equal(batch[names[1]], [i + 5 for i in numbers])
        np.testing.assert_array_equal(batch["label"], [1, 1, 1, 1])


def test_a_transform_for_records_without_images_is_refused(arrays_url: str) -> None:
    with pytest.raises(ValueError, match="a transform was given, but the samples have no image"):
        Loader(arrays_url, batch_size=4, transform=CenterCrop(8))


def test_a_whole_batch_skipped_warns_and_a_long_run_stops(
    arrays_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stoker.pipeline import batching

    monkeypatch.setattr(batching, "MAX_SKIPPED_IN_A_ROW", 8)
    fields = FieldsConfig(select={"missing": "wav"}, missing="skip")
    with (
        Loader(arrays_url, batch_size=4, decode=DecodeConfig(fields=fields)) as loader,
        pytest.raises(StokerError, match=r"the last 8 samples all failed .* no field 'missing'"),
    ):
        list(loader)
    assert "every sample of a batch of 4 was skipped" in caplog.text
