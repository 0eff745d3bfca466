"""CSV and JSONL file lists: columns, path resolution, labels, errors, S3."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from stoker.errors import SourceError
from stoker.format.foreign.listfile import ListFileReader


def reloaded(reader: ListFileReader) -> ListFileReader:
    """The reader after a pickle round trip, as a worker process would get it."""
    clone: ListFileReader = pickle.loads(pickle.dumps(reader))  # noqa: S301 - our own bytes
    return clone


@pytest.fixture
def images(tmp_path: Path) -> dict[str, bytes]:
    files = {
        "img/cat.1.JPEG": b"jpeg cat",
        "img/dog.png": b"png dog",
        "img/noext": b"raw",
    }
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    return files


def test_csv_with_class_names(tmp_path: Path, images: dict[str, bytes]) -> None:
    absolute = tmp_path / "img/noext"
    (tmp_path / "train.csv").write_text(
        f'Image, Class ,extra\nimg/cat.1.JPEG,cat,x\n\n"img/dog.png",dog,y\n{absolute},cat,z\n'
    )
    reader = ListFileReader(str(tmp_path / "train.csv"))
    assert list(reader.class_names) == ["cat", "dog"]
    refs = reader.refs()
    # Keys are paths under the list's folder without the extension, as an image folder's.
    assert [r.key for r in refs] == ["img/cat_1", "img/dog", "img/noext"]
    assert [r.label for r in refs] == [0, 1, 0]
    assert [r.size for r in refs] == [8, 7, 3]
    assert refs[2].location == str(absolute)
    assert "3 rows" in reader.description
    clone = reloaded(reader)
    assert clone.read(refs[0]).fields == {"jpg": b"jpeg cat", "cls": b"0"}
    assert clone.read(refs[1]).fields == {"png": b"png dog", "cls": b"1"}
    assert clone.read(refs[2]).fields == {"bin": b"raw", "cls": b"0"}


def test_jsonl_with_int_labels_and_no_labels(tmp_path: Path, images: dict[str, bytes]) -> None:
    lines = [
        {"path": "img/dog.png", "label": 7},
        {"path": "img/cat.1.JPEG", "label": None},
        {"path": "img/noext"},
    ]
    (tmp_path / "list.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    reader = ListFileReader(str(tmp_path / "list.jsonl"))
    refs = reader.refs()
    assert [r.label for r in refs] == [7, -1, -1]
    assert reader.class_names == ()
    assert reader.read(refs[0]).fields == {"png": b"png dog", "cls": b"7"}
    assert reader.read(refs[1]).fields == {"jpg": b"jpeg cat"}


def test_given_class_names_and_sniffed_format(tmp_path: Path, images: dict[str, bytes]) -> None:
    (tmp_path / "list.txt").write_text('{"file": "img/dog.png", "target": "dog"}\n')
    reader = ListFileReader(str(tmp_path / "list.txt"), class_names=["bird", "dog"])
    assert [r.label for r in reader.refs()] == [1]
    assert reader.class_names == ("bird", "dog")
    (tmp_path / "t.tsv").write_text("filename\tlabel\nimg/dog.png\t1\n")
    assert [r.label for r in ListFileReader(str(tmp_path / "t.tsv")).refs()] == [1]


def test_relative_paths_resolve_against_the_list(
    tmp_path: Path, images: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists/l.csv").write_text("url\n../img/dog.png\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match=r"row 1 \(line 2\): '\.\./img/dog\.png' lies outside"):
        ListFileReader("lists/l.csv").refs()
    (ref,) = ListFileReader("lists/l.csv", allow_outside=True).refs()
    assert Path(ref.location).resolve() == (tmp_path / "img/dog.png").resolve()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("name,label\na.jpg,1\n", r"no path column; expected one of .* found columns \['name'"),
        ("", "the list is empty"),
        ("path,label\n", "the list has no rows"),
        ("path,label\nimg/dog.png,2.5\n", r"line 2: unparseable label '2\.5'"),
        ("path,label\nimg/dog.png,-3\n", "line 2: label -3 is negative"),
        ("path,label\nimg/dog.png,1\nimg/dog.png,cat\n", "labels mix integers and class names"),
        ("path,label\nimg/dog.png,1\nimg/gone.jpg,1\n", r"row 2 \(line 3\): file not found"),
        ("path,label\n,1\n", "line 2: empty path"),
    ],
)
def test_csv_errors(tmp_path: Path, images: dict[str, bytes], content: str, message: str) -> None:
    (tmp_path / "l.csv").write_text(content)
    with pytest.raises(SourceError, match=message):
        ListFileReader(str(tmp_path / "l.csv")).refs()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"path": "img/dog.png", "label": 1.5}', r"line 2: unparseable label 1\.5"),
        ('{"path": "img/dog.png", "label": true}', "line 2: unparseable label True"),
        ('{"name": "img/dog.png"}', r"line 2: no path key; .* found keys \['name'\]"),
        ("[1, 2]", "line 2: expected a JSON object"),
        ("{oops", "line 2: bad JSON"),
    ],
)
def test_jsonl_errors(tmp_path: Path, images: dict[str, bytes], line: str, message: str) -> None:
    (tmp_path / "l.jsonl").write_text('{"path": "img/dog.png"}\n' + line + "\n")
    with pytest.raises(SourceError, match=message):
        ListFileReader(str(tmp_path / "l.jsonl")).refs()


def test_unknown_or_out_of_range_class(tmp_path: Path, images: dict[str, bytes]) -> None:
    (tmp_path / "l.csv").write_text("path,label\nimg/dog.png,cat\n")
    with pytest.raises(SourceError, match="unknown class 'cat'"):
        ListFileReader(str(tmp_path / "l.csv"), class_names=["dog"]).refs()
    (tmp_path / "l.csv").write_text("path,label\nimg/dog.png,3\n")
    with pytest.raises(SourceError, match="label 3 is out of range for 1 class names"):
        ListFileReader(str(tmp_path / "l.csv"), class_names=["dog"]).refs()


def test_rows_that_give_one_key_are_refused_naming_both(
    tmp_path: Path, images: dict[str, bytes]
) -> None:
    (tmp_path / "img/dog.jpg").write_bytes(b"jpeg dog")
    for rows, second in (
        ("img/dog.png\nimg/cat.1.JPEG\n./img/dog.png\n", "row 3 (line 4): './img/dog.png'"),
        ("img/dog.png\nimg/dog.jpg\n", "row 2 (line 3): 'img/dog.jpg'"),
    ):
        (tmp_path / "l.csv").write_text(f"path\n{rows}")
        with pytest.raises(SourceError) as caught:
            ListFileReader(str(tmp_path / "l.csv")).refs()
        assert second in str(caught.value)
        assert "gives the key 'img/dog', as row 1 does" in str(caught.value)


def test_missing_file_at_read_names_the_row(tmp_path: Path, images: dict[str, bytes]) -> None:
    (tmp_path / "l.csv").write_text("path\nimg/dog.png\nimg/cat.1.JPEG\n")
    reader = ListFileReader(str(tmp_path / "l.csv"))
    refs = reader.refs()
    (tmp_path / "img/cat.1.JPEG").unlink()
    with pytest.raises(SourceError, match=r"l\.csv: row 2: .*cat\.1\.JPEG"):
        reader.read(refs[1])


def test_s3_list_with_relative_and_absolute_urls(s3_bucket: Any, tmp_path: Path) -> None:
    store = s3_bucket.store()
    store.put("data/img/a.jpg", b"aaa")
    store.put("other/b.webp", b"bbb")
    local = tmp_path / "c.png"
    local.write_bytes(b"ccc")
    store.put(
        "data/lists/train.csv",
        f"path,label\n../img/a.jpg,x\n{s3_bucket.url}/other/b.webp,y\n{local},x\n".encode(),
    )
    with pytest.raises(SourceError, match=r"row 1 \(line 2\): '\.\./img/a\.jpg' lies outside"):
        ListFileReader(
            f"{s3_bucket.url}/data/lists/train.csv", storage_options=s3_bucket.options()
        ).refs()
    reader = ListFileReader(
        f"{s3_bucket.url}/data/lists/train.csv",
        storage_options=s3_bucket.options(),
        allow_outside=True,
    )
    refs = reader.refs()
    assert [r.location for r in refs] == [
        f"{s3_bucket.url}/data/img/a.jpg",
        f"{s3_bucket.url}/other/b.webp",
        str(local),
    ]
    assert [(r.size, r.label) for r in refs] == [(0, 0), (0, 1), (3, 0)]
    # Outside the list's folder, a file is keyed by its whole path, without the scheme.
    assert [r.key for r in refs] == [
        f"{s3_bucket.name}/data/img/a",
        f"{s3_bucket.name}/other/b",
        local.with_suffix("").as_posix().lstrip("/").replace(".", "_"),
    ]
    clone = reloaded(reader)
    assert [clone.read(r).fields for r in refs] == [
        {"jpg": b"aaa", "cls": b"0"},
        {"webp": b"bbb", "cls": b"1"},
        {"png": b"ccc", "cls": b"0"},
    ]
    store.put("data/lists/bad.csv", b"path\n../../../x.jpg\n")
    with pytest.raises(SourceError, match="points outside the bucket"):
        ListFileReader(
            f"{s3_bucket.url}/data/lists/bad.csv",
            storage_options=s3_bucket.options(),
            allow_outside=True,
        ).refs()
    store.put("data/lists/gone.csv", b"path\nimg/gone.jpg\n")
    gone = ListFileReader(
        f"{s3_bucket.url}/data/lists/gone.csv", storage_options=s3_bucket.options()
    )
    with pytest.raises(SourceError, match=r"gone\.csv: row 1: .*gone\.jpg"):
        gone.read(gone.refs()[0])
