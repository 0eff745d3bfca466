"""Decompression bombs: small files that declare huge images are refused before decoding.

Each bomb is a real, small image whose header is edited to declare 60,000 x 60,000 pixels
(3.6 gigapixels, about 10 GB as RGB; WebP's 14-bit fields stop at 16,384 x 16,384). The
decoders must refuse it from the header alone: the tests make the real decoders explode if
they are reached at all.
"""

from __future__ import annotations

import io
import random
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from stoker import DecodeConfig, OrderConfig
from stoker.errors import SourceError
from stoker.format.foreign.base import Sample
from stoker.format.index import DatasetIndex, write_index
from stoker.format.spec import DEFAULT_MAX_PIXELS, declared_image_size
from stoker.format.writer import ShardWriter
from stoker.pack.reencode import ImagePolicy, process_image
from stoker.pipeline.decode import decode_full, decode_planned
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import CenterCrop
from stoker.storage import open_store
from stoker.testing.images import make_jpeg

HUGE = 60_000
RNG = np.random.default_rng(7)
PIXELS = RNG.integers(0, 255, (48, 64, 3), dtype=np.uint8)


def _saved(fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(PIXELS).save(out, fmt, **options)
    return out.getvalue()


def jpeg_bomb() -> bytes:
    data = bytearray(make_jpeg(RNG, width=64, height=48))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", HUGE, HUGE)
    return bytes(data)


def png_bomb() -> bytes:
    data = bytearray(_saved("PNG"))
    data[16:24] = struct.pack(">II", HUGE, HUGE)
    data[29:33] = struct.pack(">I", zlib.crc32(data[12:29]))  # a valid IHDR
    return bytes(data)


def gif_bomb() -> bytes:
    data = bytearray(_saved("GIF"))
    data[6:10] = struct.pack("<HH", HUGE, HUGE)
    return bytes(data)


def bmp_bomb() -> bytes:
    data = bytearray(_saved("BMP"))
    data[18:26] = struct.pack("<ii", HUGE, -HUGE)
    return bytes(data)


def webp_bomb() -> bytes:
    data = bytearray(_saved("WEBP", lossless=True))  # VP8L: 14-bit width-1 and height-1
    top_bits = int.from_bytes(data[21:25], "little") & 0xF000_0000
    data[21:25] = struct.pack("<I", top_bits | 0x3FFF | 0x3FFF << 14)
    return bytes(data)


BOMBS = {"jpg": jpeg_bomb, "png": png_bomb, "gif": gif_bomb, "bmp": bmp_bomb, "webp": webp_bomb}
SIDE = {"jpg": HUGE, "png": HUGE, "gif": HUGE, "bmp": HUGE, "webp": 16_384}


@pytest.fixture
def decoders_explode() -> Iterator[None]:
    """Any call into a pixel decoder (or Pillow's open) fails the test."""

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("a decoder ran on a decompression bomb")

    with (
        mock.patch.object(simplejpeg, "decode_jpeg", boom),
        mock.patch.object(Image, "open", boom),
    ):
        yield


@pytest.mark.parametrize("fmt", BOMBS)
def test_bombs_declare_a_huge_size_in_a_small_file(fmt: str) -> None:
    data = BOMBS[fmt]()
    assert len(data) < 20_000
    assert declared_image_size(data) == (SIDE[fmt], SIDE[fmt])


@pytest.mark.parametrize("fmt", BOMBS)
@pytest.mark.usefixtures("decoders_explode")
def test_loader_decoders_refuse_bombs_before_decoding(fmt: str) -> None:
    data = BOMBS[fmt]()
    side = SIDE[fmt]
    with pytest.raises(ValueError, match=f"{side}x{side} image exceeds max_pixels"):
        decode_planned(data, CenterCrop(32), random.Random(0))
    with pytest.raises(ValueError, match="exceeds max_pixels"):
        decode_full(data)


@pytest.mark.parametrize("fmt", BOMBS)
@pytest.mark.usefixtures("decoders_explode")
@pytest.mark.parametrize("policy", [ImagePolicy(), ImagePolicy(resize_shorter=64)])
def test_pack_refuses_bombs_before_decoding(fmt: str, policy: ImagePolicy) -> None:
    with pytest.raises(SourceError, match=f"in/x.{fmt}: .*exceeds max_pixels"):
        process_image(BOMBS[fmt](), fmt, policy, where=f"in/x.{fmt}")


def test_the_pixel_limit_is_a_parameter() -> None:
    jpeg, png = make_jpeg(RNG, width=64, height=48), _saved("PNG")
    for data in (jpeg, png):  # 3,072 pixels
        assert decode_full(data, max_pixels=3072).size == (64, 48)
        with pytest.raises(ValueError, match="64x48 image exceeds max_pixels=3071"):
            decode_full(data, max_pixels=3071)
        with pytest.raises(ValueError, match="max_pixels=3071"):
            decode_planned(data, CenterCrop(16), random.Random(0), max_pixels=3071)
        assert process_image(
            data, "jpg" if data is jpeg else "png", ImagePolicy(max_pixels=3072), where="x"
        )
        with pytest.raises(SourceError, match="max_pixels=3071"):
            process_image(data, "png", ImagePolicy(max_pixels=3071, quality=80), where="x")
    with pytest.raises(ValueError, match="max_pixels must be >= 1"):
        ImagePolicy(max_pixels=0)


def test_default_limit_admits_large_real_photos() -> None:
    # 9,000 x 9,000 (81 MP) is under the default; one pixel over the default is not.
    assert DEFAULT_MAX_PIXELS >= 9_000 * 9_000
    side = int(DEFAULT_MAX_PIXELS**0.5) + 1
    data = bytearray(_saved("PNG"))
    data[16:24] = struct.pack(">II", side, side)
    with pytest.raises(ValueError, match="exceeds max_pixels"):
        decode_full(bytes(data))


def test_loader_skips_or_raises_on_a_bomb(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = ShardWriter(store, "shard-000000.tar")
    for i in range(6):
        image = jpeg_bomb() if i == 3 else make_jpeg(RNG, width=40, height=30)
        writer.add(Sample(key=f"k{i}", fields={"jpg": image}, label=i))
    write_index(store, DatasetIndex.from_shards([writer.close()], class_names=[], fields={}))
    loader = Loader(
        str(tmp_path), batch_size=6, transform=CenterCrop(16), order=OrderConfig(mode="none")
    )
    with loader, pytest.raises(ValueError, match=r"'k3'.*exceeds max_pixels"):
        list(loader)
    with Loader(
        str(tmp_path),
        batch_size=6,
        transform=CenterCrop(16),
        order=OrderConfig(mode="none"),
        decode=DecodeConfig(on_error="skip"),
    ) as loader:
        (batch,) = list(loader)
        assert batch["key"] == ["k0", "k1", "k2", "k4", "k5"]
        assert [key for key, _ in loader.stats().skipped] == ["k3"]
