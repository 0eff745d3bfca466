"""An image field besides the transformed one (a mask) reaches the batch whole, so its
declared size is bounded before it is decoded (issue 32 item 3: eight 236 kB PNG masks of
9000 x 9000 made a 1.94 GB batch). The bound is named with the sample and the field, and a
decoder with a larger bound reads the mask."""

from __future__ import annotations

import functools
import io

import numpy as np
import pytest
from PIL import Image

from stoker import DecodeConfig
from stoker.format.records import FIELD_MAX_PIXELS, decode_image
from stoker.pack.indexer import index_webdataset
from stoker.pipeline.fields import FieldsConfig
from stoker.pipeline.loader import Loader

BIG = (4200, 4000)  # 16.8 M pixels, just over the bound; a flat PNG of a few kB


def _png(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", size, 0).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def masks_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    import webdataset as wds

    root = tmp_path_factory.mktemp("masks")
    with wds.TarWriter(str(root / "masks-0000.tar"), encoder=False) as sink:
        for i in range(4):
            mask = _png(BIG if i == 2 else (32, 24))
            sink.write({"__key__": f"m{i}", "seg.png": mask, "cls": b"0"})
    index_webdataset(root)
    return str(root)


def test_the_bound_is_below_what_the_issue_allocated() -> None:
    assert BIG[0] * BIG[1] > FIELD_MAX_PIXELS
    assert len(_png(BIG)) < 100_000  # a few bytes declare the size


def test_a_mask_over_the_bound_is_named_before_it_is_decoded(masks_url: str) -> None:
    fields = FieldsConfig(select={"mask": "seg.png", "cls": "cls"})
    with (
        Loader(masks_url, batch_size=2, decode=DecodeConfig(threads=1, fields=fields)) as loader,
        pytest.raises(
            ValueError, match=r"sample 'm2': field 'mask' .*4200x4000 image is over 16,777,216"
        ),
    ):
        list(loader)


def test_a_decoder_with_a_larger_bound_reads_the_mask(masks_url: str) -> None:
    larger = functools.partial(decode_image, max_pixels=20_000_000)
    fields = FieldsConfig(select={"mask": "seg.png"}, decoders={"png": larger})
    with Loader(masks_url, batch_size=1, decode=DecodeConfig(fields=fields)) as loader:
        shapes = {
            key: np.asarray(mask).shape
            for b in loader
            for key, mask in zip(b["key"], b["mask"], strict=True)
        }
    assert shapes == {"m0": (24, 32), "m1": (24, 32), "m2": (4000, 4200), "m3": (24, 32)}
