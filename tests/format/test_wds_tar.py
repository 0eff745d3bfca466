"""WebDataset tar scanning and reading: offsets, grouping, refusals, S3, round trips."""

from __future__ import annotations

import io
import pickle
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.errors import SourceError
from stoker.format.foreign.wds_tar import TarSample, WebDatasetTarReader, scan_tar

Members = Sequence[tuple[str, bytes]]


def make_tar(members: Members, *, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def special_tar(name: str, kind: bytes, *, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = "target.jpg" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
        tar.addfile(info)
    return out.getvalue()


def reloaded(reader: WebDatasetTarReader) -> WebDatasetTarReader:
    """The reader after a pickle round trip, as a worker process would get it."""
    clone: WebDatasetTarReader = pickle.loads(pickle.dumps(reader))  # noqa: S301 - our own bytes
    return clone


def member_bytes(data: bytes, sample: TarSample) -> dict[str, bytes]:
    return {ext: data[offset : offset + size] for ext, offset, size in sample.members}


def test_scan_groups_members_and_gives_exact_offsets() -> None:
    members = [
        ("000.jpg", b"jpeg-0"),
        ("000.cls", b"3"),
        ("001.jpg", b"jpeg-1" * 200),
        ("001.JSON", b"{}"),
        ("001.seg.png", b""),
    ]
    data = make_tar(members)
    samples = scan_tar(data, name="t.tar")
    assert [s.key for s in samples] == ["000", "001"]
    assert member_bytes(data, samples[0]) == {"jpg": b"jpeg-0", "cls": b"3"}
    assert member_bytes(data, samples[1]) == {
        "jpg": b"jpeg-1" * 200,
        "json": b"{}",
        "seg.png": b"",
    }
    assert samples[0].span_start == 0
    assert samples[0].span_end == samples[1].span_start
    assert all(s.span_start % 512 == 0 and s.span_end % 512 == 0 for s in samples)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_long_names_in_every_format(fmt: int) -> None:
    # 150 characters: ustar needs its prefix field, GNU an 'L' member, pax an 'x' header.
    folder = "d" * 70 + "/" + "e" * 60
    members = [(f"{folder}/k1.jpg", b"a"), (f"{folder}/k1.txt", b"b"), ("k2.jpg", b"c")]
    data = make_tar(members, fmt=fmt)
    samples = scan_tar(data, name="t.tar")
    assert [s.key for s in samples] == [f"{folder}/k1", "k2"]
    assert member_bytes(data, samples[0]) == {"jpg": b"a", "txt": b"b"}
    assert samples[0].span_start == 0


def test_pax_unicode_name_and_global_header() -> None:
    out = io.BytesIO()
    with tarfile.open(
        fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "hi"}
    ) as tar:
        for name, data in [("ünï/ç.jpg", b"x"), ("ünï/ç.cls", b"1")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    samples = scan_tar(out.getvalue(), name="t.tar")
    assert [s.key for s in samples] == ["ünï/ç"]
    assert member_bytes(out.getvalue(), samples[0]) == {"jpg": b"x", "cls": b"1"}


def test_directories_dot_slash_and_extensionless_members() -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        folder = tarfile.TarInfo("./train")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, data in [("./train/a.jpg", b"1"), ("README", b"skip"), ("./train/b.jpg", b"2")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    samples = scan_tar(out.getvalue(), name="t.tar")
    assert [s.key for s in samples] == ["train/a", "train/b"]


def test_base256_size_field_is_read() -> None:
    data = bytearray(make_tar([("k.bin", b"x" * 700)]))
    data[124:136] = b"\x80" + (700).to_bytes(11, "big")
    data[148:156] = b" " * 8
    data[148:156] = f"{sum(data[:512]):06o}\0 ".encode()
    (sample,) = scan_tar(bytes(data), name="t.tar")
    assert member_bytes(bytes(data), sample) == {"bin": b"x" * 700}


@pytest.mark.parametrize("name", ["../x.jpg", "a/../../x.jpg", "/abs.jpg"])
def test_path_traversal_is_refused(name: str) -> None:
    with pytest.raises(SourceError, match=r"t\.tar: member .*(absolute|'\.\.')"):
        scan_tar(make_tar([(name, b"x")]), name="t.tar")


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        (tarfile.SYMTYPE, "symbolic link"),
        (tarfile.LNKTYPE, "hard link"),
        (tarfile.CHRTYPE, "character device"),
        (tarfile.BLKTYPE, "block device"),
        (tarfile.FIFOTYPE, "fifo"),
    ],
)
def test_links_and_devices_are_refused(kind: bytes, what: str) -> None:
    with pytest.raises(SourceError, match=f"t.tar: member 'k.jpg' is a {what}"):
        scan_tar(special_tar("k.jpg", kind), name="t.tar")


def test_truncated_tar_is_refused() -> None:
    data = make_tar([("a.jpg", b"x" * 5000), ("b.jpg", b"y" * 3000)])
    with pytest.raises(SourceError, match=r"t\.tar: truncated tar: member at offset \d+ declares"):
        scan_tar(data[:2048], name="t.tar")
    with pytest.raises(SourceError, match="truncated tar: data ends inside a header"):
        scan_tar(data[: 512 + 5120 + 100], name="t.tar")
    with pytest.raises(SourceError, match="without the end-of-archive marker"):
        scan_tar(data[: 512 + 5120], name="t.tar")


def test_corrupt_header_checksum_is_refused() -> None:
    data = bytearray(make_tar([("a.jpg", b"x"), ("b.jpg", b"y")]))
    data[1024] ^= 0x01  # first byte of the second member's name
    with pytest.raises(SourceError, match=r"t\.tar: bad header checksum .* at offset 1024"):
        scan_tar(bytes(data), name="t.tar")


def test_not_a_tar_is_refused() -> None:
    with pytest.raises(SourceError, match=r"bad header checksum .* at offset 0"):
        scan_tar(b"\x89PNG" + bytes(1020), name="t.tar")


def test_non_contiguous_sample_is_refused() -> None:
    data = make_tar([("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")])
    with pytest.raises(SourceError, match=r"member 'a\.cls' continues sample 'a'"):
        scan_tar(data, name="t.tar")


def test_duplicate_extension_is_refused() -> None:
    with pytest.raises(SourceError, match="sample 'a' has two 'jpg' members"):
        scan_tar(make_tar([("a.jpg", b"1"), ("a.JPG", b"2")]), name="t.tar")


def test_members_under_dotted_folders_keep_their_folders_in_the_key() -> None:
    # WebDataset's rule: the key is the path up to the first dot of the base name.
    samples = scan_tar(
        make_tar([("v1.2/a.jpg", b"1"), ("v1.2/a.seg.png", b"2"), ("x.y/z.w/b.cls", b"3")]),
        name="t.tar",
    )
    assert [s.key for s in samples] == ["v1.2/a", "x.y/z.w/b"]
    assert [ext for ext, _, _ in samples[0].members] == ["jpg", "seg.png"]


def test_empty_tar_has_no_samples() -> None:
    assert scan_tar(make_tar([]), name="t.tar") == []


def write_tars(root: Path, count: int, per_tar: int) -> dict[str, dict[str, bytes]]:
    expected: dict[str, dict[str, bytes]] = {}
    for t in range(count):
        members: list[tuple[str, bytes]] = []
        for i in range(per_tar):
            key = f"s{t:02d}_{i:04d}"
            fields = {"jpg": f"image {key}".encode() * (i + 1), "cls": str(i % 3).encode()}
            expected[key] = fields
            members += [(f"{key}.{ext}", data) for ext, data in fields.items()]
        (root / f"shard-{t:03d}.tar").write_bytes(make_tar(members))
    return expected


def test_reader_refs_and_ranged_reads(tmp_path: Path) -> None:
    expected = write_tars(tmp_path, count=3, per_tar=4)
    (tmp_path / "notes.txt").write_text("ignored")
    reader = WebDatasetTarReader(str(tmp_path), class_names=["a", "b", "c"])
    refs = reader.refs()
    assert [r.key for r in refs] == list(expected)
    assert [r.label for r in refs] == [i % 3 for _ in range(3) for i in range(4)]
    assert refs[0].location == str(tmp_path / "shard-000.tar")
    assert refs[0].size == sum(len(v) for v in expected[refs[0].key].values())
    assert reader.class_names == ("a", "b", "c")
    assert "3 tars, 12 samples" in reader.description
    clone = reloaded(reader)
    for ref in reversed(refs):
        sample = clone.read(ref)
        assert sample.fields == expected[ref.key]
        assert sample.label == ref.label


def test_reader_single_tar_and_errors(tmp_path: Path) -> None:
    write_tars(tmp_path, count=2, per_tar=2)
    reader = WebDatasetTarReader(str(tmp_path / "shard-001.tar"))
    assert [r.key for r in reader.refs()] == ["s01_0000", "s01_0001"]
    with pytest.raises(SourceError, match=r"no \.tar files found"):
        WebDatasetTarReader(str(tmp_path / "missing")).refs()

    dup = tmp_path / "dup"
    dup.mkdir()
    for name in ("a.tar", "b.tar"):
        (dup / name).write_bytes(make_tar([("k.jpg", b"1")]))
    with pytest.raises(SourceError, match=r"b\.tar: sample key 'k' also appears in .*a\.tar"):
        WebDatasetTarReader(str(dup)).refs()

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.tar").write_bytes(make_tar([("k.jpg", b"1"), ("k.cls", b"cat")]))
    with pytest.raises(SourceError, match=r"sample 'k' has a \.cls member that is not an integer"):
        WebDatasetTarReader(str(bad)).refs()

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.tar").write_bytes(make_tar([]))
    with pytest.raises(SourceError, match="no samples in 1 tar"):
        WebDatasetTarReader(str(empty)).refs()


def test_read_refuses_a_layout_outside_the_span(tmp_path: Path) -> None:
    write_tars(tmp_path, count=1, per_tar=1)
    reader = WebDatasetTarReader(str(tmp_path))
    (ref,) = reader.refs()
    broken = type(ref)(**{**_fields(ref), "extra": (("jpg", 0, ref.length + 1),)})
    with pytest.raises(SourceError, match="lies outside its"):
        reader.read(broken)


def _fields(ref: Any) -> dict[str, Any]:
    return {name: getattr(ref, name) for name in ref.__slots__}


def test_webdataset_tarwriter_round_trip(tmp_path: Path) -> None:
    import webdataset as wds

    path = tmp_path / "wds.tar"
    expected = {f"sample{i:03d}": {"jpg": bytes([i]) * (i * 37), "cls": str(i)} for i in range(5)}
    with open(path, "wb") as stream, wds.TarWriter(stream, encoder=False) as sink:
        for key, fields in expected.items():
            sink.write(
                {
                    "__key__": key,
                    **{k: v.encode() if isinstance(v, str) else v for k, v in fields.items()},
                }
            )
    reader = WebDatasetTarReader(str(path))
    refs = reader.refs()
    assert [r.key for r in refs] == list(expected)
    for ref in refs:
        sample = reader.read(ref)
        assert sample.fields["jpg"] == expected[ref.key]["jpg"]
        assert sample.label == int(str(expected[ref.key]["cls"]))


def test_s3_prefix(s3_bucket: Any) -> None:
    store = s3_bucket.store()
    store.put("train/b.tar", make_tar([("k2.jpg", b"two"), ("k2.cls", b"2")]))
    store.put("train/a.tar", make_tar([("k1.jpg", b"one"), ("k1.cls", b"1")]))
    store.put("other/c.tar", make_tar([("k3.jpg", b"three")]))
    reader = WebDatasetTarReader(f"{s3_bucket.url}/train", storage_options=s3_bucket.options())
    refs = reader.refs()
    assert [(r.key, r.location, r.label) for r in refs] == [
        ("k1", f"{s3_bucket.url}/train/a.tar", 1),
        ("k2", f"{s3_bucket.url}/train/b.tar", 2),
    ]
    clone = reloaded(reader)
    assert clone.read(refs[1]).fields == {"jpg": b"two", "cls": b"2"}


_segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=70)
_keys = st.lists(_segment, min_size=1, max_size=3).map("/".join)
_exts = st.lists(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8),
    min_size=1,
    max_size=2,
).map(".".join)
_samples = st.dictionaries(
    _keys, st.dictionaries(_exts, st.binary(max_size=1500), min_size=1, max_size=4), max_size=6
)


@settings(max_examples=60, deadline=None)
@given(samples=_samples, fmt=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]))
def test_scan_round_trips_arbitrary_samples(samples: dict[str, dict[str, bytes]], fmt: int) -> None:
    members = [
        (f"{key}.{ext}", data) for key, fields in samples.items() for ext, data in fields.items()
    ]
    data = make_tar(members, fmt=fmt)
    found = scan_tar(data, name="t.tar")
    assert [s.key for s in found] == list(samples)
    assert [member_bytes(data, s) for s in found] == list(samples.values())
    for sample in found:
        inside = data[sample.span_start : sample.span_end]
        for ext, offset, size in sample.members:
            assert inside[offset - sample.span_start :][:size] == samples[sample.key][ext]
