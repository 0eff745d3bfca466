"""Checks of JPEG and PNG bytes: is it whole, will the decoder take it, how many pixels?

Packing keeps the original bytes by default but must still refuse a file that cannot be an
image (garbage, truncated, an HTML error page saved as .jpg) and decompression bombs, and
a file that training's decoder would refuse: a JPEG truncated and then given back its end
marker has intact markers, and only decoding its entropy-coded data finds it short.

- :func:`jpeg_size` / :func:`png_size` walk the markers or chunks (microseconds) and give
  the declared size, checked against the pixel limit before any decoder runs.
- :func:`check_jpeg_decodes` entropy-decodes the whole scan with libjpeg-turbo (the
  Loader's decoder, simplejpeg) in strict mode, where every libjpeg warning ("premature end
  of data segment", "extraneous bytes before marker") is an error; at 1/8 DCT scale, so
  the inverse DCT and colour conversion cost almost nothing and the GIL is released.
- :func:`check_png_decodes` checks every chunk's CRC and that the image data inflates to
  its end (what Pillow needs to decode it).
"""

from __future__ import annotations

import struct
import zlib

from stoker.core.crc import crc32
from stoker.format.spec import JPEG_SOF_MARKERS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def jpeg_size(data: bytes) -> tuple[int, int]:
    """Width and height of a JPEG whose markers are intact and which ends with EOI.

    Raises:
        ValueError: What is wrong with the bytes.
    """
    if data[:2] != b"\xff\xd8":
        raise ValueError("no JPEG start-of-image marker")
    if data.rstrip(b"\x00")[-2:] != b"\xff\xd9":
        raise ValueError("no JPEG end-of-image marker (truncated file?)")
    position = 2
    size = len(data)
    while position + 4 <= size:
        if data[position] != 0xFF:
            raise ValueError(f"bad JPEG marker at byte {position}")
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            position += 2
            continue
        (length,) = struct.unpack_from(">H", data, position + 2)
        if length < 2 or position + 2 + length > size:
            raise ValueError(f"JPEG segment at byte {position} runs past the end")
        if marker in JPEG_SOF_MARKERS:
            if length < 7:
                raise ValueError("short JPEG frame header")
            height, width = struct.unpack_from(">HH", data, position + 5)
            if width == 0 or height == 0:
                raise ValueError("JPEG frame of zero size")
            return width, height
        if marker == 0xDA:
            break
        position += 2 + length
    raise ValueError("JPEG has no frame header before its scan")


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG that starts with IHDR and ends with IEND.

    Raises:
        ValueError: What is wrong with the bytes.
    """
    if data[:8] != PNG_SIGNATURE:
        raise ValueError("no PNG signature")
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise ValueError("PNG does not start with IHDR")
    if data[-8:-4] != b"IEND":
        raise ValueError("no PNG IEND chunk (truncated file?)")
    width, height = struct.unpack_from(">II", data, 16)
    if width == 0 or height == 0:
        raise ValueError("PNG of zero size")
    return width, height


def check_jpeg_decodes(data: bytes | memoryview) -> None:
    """Decode the whole JPEG as the Loader would, warnings counted as errors.

    Call after :func:`jpeg_size` and the pixel limit: this allocates the 1/8-scale image.

    Raises:
        ValueError: What libjpeg-turbo says is wrong (a corrupt or short scan).
    """
    import simplejpeg

    try:
        simplejpeg.decode_jpeg(
            data,
            colorspace="RGB",
            min_factor=8,
            min_width=1,
            min_height=1,
            fastdct=True,
            fastupsample=True,
            strict=True,
        )
    except ValueError as exc:
        raise ValueError(f"the JPEG decoder refuses it: {exc}") from None


# Inflate the image data this many output bytes at a time, so a check holds little memory.
_INFLATE_STEP_BYTES = 1 << 20


def check_png_decodes(data: bytes | memoryview) -> None:
    """Walk every PNG chunk, checking its CRC, and inflate the image data to its end.

    Raises:
        ValueError: A chunk that runs past the end or fails its CRC, no image data, or
            image data that stops short or is not a zlib stream.
    """
    view = memoryview(data)
    position = len(PNG_SIGNATURE)
    inflater = zlib.decompressobj()
    seen_data = False
    while position + 12 <= len(view):
        (length,) = struct.unpack_from(">I", view, position)
        kind = bytes(view[position + 4 : position + 8])
        end = position + 12 + length
        if end > len(view):
            raise ValueError(f"PNG chunk {kind!r} at byte {position} runs past the end")
        body = view[position + 8 : end - 4]
        (crc,) = struct.unpack_from(">I", view, end - 4)
        if crc32(body, crc32(kind)) != crc:
            raise ValueError(f"PNG chunk {kind!r} at byte {position} fails its CRC")
        if kind == b"IDAT":
            seen_data = True
            pending = bytes(body)
            try:
                while True:  # output in steps; what it holds back waits in unconsumed_tail
                    out = inflater.decompress(pending, _INFLATE_STEP_BYTES)
                    pending = inflater.unconsumed_tail
                    if not pending and len(out) < _INFLATE_STEP_BYTES:
                        break
            except zlib.error as exc:
                raise ValueError(f"PNG image data is corrupt: {exc}") from None
        position = end
        if kind == b"IEND":
            break
    if not seen_data or not inflater.eof:
        raise ValueError("PNG image data stops short (truncated file?)")
