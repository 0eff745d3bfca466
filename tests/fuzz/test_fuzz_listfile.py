"""Fuzzing CSV/JSONL list rows: whatever a row says, the list reader either refuses it with a
SourceError or returns references to files inside the list's folder (issue 15, item 5)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.errors import SourceError
from stoker.format.foreign.listfile import ListFileReader

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

PIECES = [
    "img",
    "a.jpg",
    "..",
    ".",
    "",
    "/",
    "//",
    "~",
    "secret.jpg",
    "link.jpg",
    "file://",
    "s3://bucket/",
    "C:",
    "\\",
    "%2e%2e",
    " ",
    "\x00",
    "\n",
    '"',
    ",",
]
ROW = st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("/".join) | st.text(max_size=30)


def _layout(root: Path) -> Path:
    folder = root / "data"
    (folder / "img").mkdir(parents=True)
    (folder / "img" / "a.jpg").write_bytes(b"inside")
    (folder / "a.jpg").write_bytes(b"inside")
    (root / "secret.jpg").write_bytes(b"outside")
    (folder / "link.jpg").symlink_to(root / "secret.jpg")
    (folder / "img" / "link.jpg").symlink_to(root / "secret.jpg")
    return folder


def _check(folder: Path, listing: Path) -> None:
    try:
        refs = ListFileReader(str(listing)).refs()
    except SourceError:
        return
    for ref in refs:
        assert Path(ref.location).resolve().is_relative_to(folder.resolve()), ref.location


@FUZZ
@given(rows=st.lists(ROW, min_size=1, max_size=4))
def test_csv_rows_stay_inside_the_list_folder(rows: list[str]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = _layout(Path(scratch))
        listing = folder / "l.csv"
        text = "path,label\n" + "".join(f'"{r.replace(chr(34), chr(34) * 2)}",0\n' for r in rows)
        listing.write_text(text, encoding="utf-8", errors="surrogatepass")
        _check(folder, listing)


@FUZZ
@given(rows=st.lists(ROW, min_size=1, max_size=4))
def test_jsonl_rows_stay_inside_the_list_folder(rows: list[str]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = _layout(Path(scratch))
        listing = folder / "l.jsonl"
        listing.write_text("".join(json.dumps({"path": r}) + "\n" for r in rows))
        _check(folder, listing)
