"""Checks of a sample's members other than its images, as training will decode them.

The Loader decodes each member by its extension (:mod:`stoker.format.records`); pack runs
the same decoders before writing, so a member training would refuse (a truncated ``npy``,
JSON that does not parse, a caption that is not UTF-8, a ``cls`` that is no integer) is
refused at pack time, naming the sample and the field, or skipped and listed with
``on_error="skip"``, as a broken image is. The checks are cheap next to reading the
member: an ``npy`` member's header is read and its length checked, its data not copied;
text is decoded once; JSON is parsed once.

The images the pack's :class:`~stoker.pack.reencode.ImagePolicy` checks or re-encodes
(``jpg``, ``png``, ...) are not decoded again here; other image members (a ``seg.png``
mask) are checked as the policy checks images, and kept byte for byte. An
``ImagePolicy(check=False)`` turns these checks off too: pack then keeps every member's
bytes unchecked.
"""

from __future__ import annotations

import dataclasses

from stoker.errors import SourceError
from stoker.format.records import (
    FieldDecoder,
    decode_image,
    decode_int,
    decode_json,
    decode_npy,
    decode_text,
    decoder_for,
    read_npy_header,
)
from stoker.format.spec import normalise_extension
from stoker.pack.reencode import ImagePolicy, process_image

#: What pack runs on a member, by the decoder the Loader will use for it: the decoder
#: itself, or for ``npy`` its header check (the decoder copies the array out). Members
#: whose decoder is not named here (kept as bytes) are not checked; images are below.
FIELD_CHECKS: dict[FieldDecoder, FieldDecoder] = {
    decode_text: decode_text,
    decode_json: decode_json,
    decode_int: decode_int,
    decode_npy: read_npy_header,
}


def check_field(ext: str, data: bytes, *, key: str, where: str, policy: ImagePolicy) -> None:
    """Check one member as the Loader will decode it; ``ext`` is not one of the images
    :func:`~stoker.pack.reencode.process_image` handles.

    Args:
        ext: The member's extension, as it will be written (``json``, ``emb.npy``).
        data: Its bytes.
        key: The sample's key (for the message).
        where: The file or object the sample is read from (for the message).
        policy: Whether members are checked at all (``check``), and how images are
            (for image members such as ``seg.png``).

    Raises:
        SourceError: What training's decoder would say, naming ``where``, the sample and
            the field.
    """
    if not policy.check:
        return
    decoder = decoder_for(ext)
    try:
        if decoder is decode_image:
            # Checked as the policy checks images, and never re-encoded: a mask stays the
            # bytes it was.
            kept = dataclasses.replace(policy, resize_shorter=None, max_side=None, quality=None)
            last = normalise_extension(ext.rpartition(".")[2])
            process_image(data, last, kept, where=where)
            return
        check = FIELD_CHECKS.get(decoder)
        if check is not None:
            check(data)
    except SourceError as exc:
        reason = str(exc).removeprefix(f"{where}: ")
        raise SourceError(f"{where}: sample {key!r}, field {ext!r}: {reason}") from exc
    except ValueError as exc:
        raise SourceError(f"{where}: sample {key!r}, field {ext!r}: {exc}") from exc
