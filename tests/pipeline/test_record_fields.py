"""Every field of a record reaches the batch: image-caption-JSON tars written by the
webdataset library, indexed in place and streamed by the Loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stoker import DecodeConfig
from stoker.pack.indexer import index_webdataset
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
            for key, text, meta, cls in zip(
                batch["key"], batch["txt"], batch["json"], batch["cls"], strict=True
            ):
                seen[key] = (text, meta, int(cls))
    assert len(seen) == SAMPLES
    for key, (text, meta, cls) in seen.items():
        expected = _captioned(int(key))
        assert text == expected["txt"]
        assert meta == expected["json"]
        assert cls == expected["cls"]


def test_json_fields_match_webdatasets_own_decoding(captioned_url: str) -> None:
    from webdataset import autodecode, tariterators

    decode = autodecode.Decoder([autodecode.imagehandler("rgb8"), autodecode.basichandlers])
    theirs: dict[str, dict[str, object]] = {}
    for path in sorted(Path(captioned_url).glob("*.tar")):
        with path.open("rb") as stream:
            files = ({**f, "__url__": str(path)} for f in tariterators.tar_file_iterator(stream))
            for sample in tariterators.group_by_keys(files):
                theirs[sample["__key__"]] = decode(sample)
    with Loader(captioned_url, batch_size=4, transform=CenterCrop(16)) as loader:
        ours = {
            key: (text, meta)
            for batch in loader
            for key, text, meta in zip(batch["key"], batch["txt"], batch["json"], strict=True)
        }
    assert ours.keys() == theirs.keys()
    for key, (text, meta) in ours.items():
        assert text == theirs[key]["txt"]
        assert meta == theirs[key]["json"]
        assert json.dumps(meta) == json.dumps(theirs[key]["json"])
