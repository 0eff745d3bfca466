"""The lean walk of verified spans gives what the full, checking walk gives."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from stoker.format import tar
from stoker.format.tar import parse_members

names = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="/\\"),
    min_size=1,
    max_size=120,
)
members = st.lists(
    st.tuples(names, st.sampled_from(["jpg", "cls", "json", "tar.gz", "JPG", ""]), st.binary()),
    min_size=1,
    max_size=4,
)
formats = st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])


def _span(entries: list[tuple[str, str, bytes]], fmt: int, folder: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for stem, ext, data in entries:
            info = tarfile.TarInfo(f"{folder}{stem}.{ext}" if ext else f"{folder}{stem}")
            info.size, info.mtime = len(data), 0
            archive.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        last = archive.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512
    return raw[:end]  # a sample's span: its members, not the archive's end blocks


def _outcome(span: bytes, verified: bool) -> object:
    try:
        return parse_members(span, where="s", verified=verified)
    except Exception as exc:  # the same error either way
        return type(exc), str(exc)


@settings(max_examples=300, deadline=None)
@given(entries=members, fmt=formats, folder=st.sampled_from(["", "a/", "x" * 150 + "/"]))
def test_the_lean_walk_agrees_with_the_full_one(entries, fmt, folder) -> None:
    try:
        span = _span(entries, fmt, folder)
    except (ValueError, UnicodeError):
        return  # a name this tar format cannot hold
    full = _outcome(span, verified=False)
    # A span the full walk refuses never gets verified: the index builder refused it first.
    assume(isinstance(full, dict))
    assert _outcome(span, verified=True) == full


def test_the_lean_walk_is_taken_for_plain_members(monkeypatch: pytest.MonkeyPatch) -> None:
    span = _span([("x", "jpg", b"\xff" * 100_000), ("x", "cls", b"3")], tarfile.USTAR_FORMAT, "")
    expected = {"jpg": b"\xff" * 100_000, "cls": b"3"}
    assert parse_members(span, where="s", verified=False) == expected

    def no_full_walk(*args: object, **kwargs: object) -> None:
        raise AssertionError("the full walk was taken")

    monkeypatch.setattr(tar, "iter_members", no_full_walk)
    assert parse_members(span, where="s", verified=True) == expected
    with pytest.raises(AssertionError, match="full walk"):
        parse_members(span, where="s", verified=False)
