"""What Pillow raises on malformed images: one list for every decoder that calls it."""

from __future__ import annotations

import struct

from PIL import Image

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
