"""What Pillow raises on malformed images, and how to say it: one list and one wording for
every decoder that calls it."""

from __future__ import annotations

import struct

from PIL import Image, UnidentifiedImageError

#: What Pillow's format plugins raise on malformed files; all mean "cannot decode".
PILLOW_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    SyntaxError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    EOFError,
    ZeroDivisionError,
    struct.error,
    Image.DecompressionBombError,
    # Pillow reports corrupt metadata with warnings; raised as errors (-W error) they mean
    # the same, and must not escape as anything but "cannot decode".
    Image.DecompressionBombWarning,
    UserWarning,
)


def pillow_problem(data: bytes | memoryview, exc: BaseException) -> str:
    """What ``exc``, raised by Pillow on ``data``, says about the bytes, in words: Pillow's
    "cannot identify image file <_io.BytesIO object at 0x...>" names an object of ours, not
    the trouble (the caller names the sample)."""
    if not len(data):
        return "empty (0 bytes), not an image"
    if isinstance(exc, UnidentifiedImageError):
        return f"not an image format Pillow reads ({len(data)} bytes, starting {bytes(data[:8])!r})"
    return str(exc) or type(exc).__name__
