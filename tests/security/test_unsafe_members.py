"""Unsafe tar members are refused: path traversal, absolute names, links, devices, fifos.

Both tar readers are checked: ``parse_members`` (every sample read from a packed dataset goes
through it) and ``scan_tar`` (``stoker pack`` from WebDataset tars and ``stoker index``). The
shards are built with Python's ``tarfile``, as an attacker's tool would build them, and the
dataset around them is made consistent (CRCs and SHA-256 match), so only the member check can
stop them. Plus: keys that would make such names are refused when writing, and
``safe_local_path`` (used by ``stoker download``) keeps every key under its destination.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import zlib
from pathlib import Path

import pytest

from stoker.errors import ShardFormatError, SourceError
from stoker.format.foreign.base import Sample
from stoker.format.foreign.wds_tar import scan_tar
from stoker.format.index import DatasetIndex, write_index
from stoker.format.reader import open_dataset
from stoker.format.spec import check_key
from stoker.format.tar import parse_members
from stoker.format.writer import SampleRecord, ShardRecord, ShardWriter
from stoker.pack.indexer import index_webdataset
from stoker.storage import open_store
from stoker.storage.transfer import safe_local_path

TRAVERSAL = [
    "../evil.jpg",
    "a/../../evil.jpg",
    "/etc/evil.jpg",
    "C:evil.jpg",
    "a\\..\\evil.jpg",
    "nul\x00byte.jpg",  # only a pax record can carry a NUL; a header field ends at one
    "bell\x07.jpg",
]
SPECIAL = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a fifo",
    tarfile.DIRTYPE: "a directory entry",
}


def tar_of(*members: tarfile.TarInfo, data: bytes = b"payload") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info in members:
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return out.getvalue()


def regular(name: str, *, pax: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    if pax:
        info.pax_headers = {"path": name}
    return info


def special(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        info.linkname = "/etc/passwd"
    return info


def span_of(data: bytes) -> bytes:
    """The tar without its end-of-archive blocks: one sample's span."""
    return data[: len(data.rstrip(b"\0")) + (-len(data.rstrip(b"\0")) % 512)]


def dataset_with_shard(root: Path, shard: bytes) -> str:
    """A dataset whose one sample is the whole given shard, with a consistent index."""
    store = open_store(root)
    store.put("shard-000000.tar", shard)
    span = span_of(shard)
    record = ShardRecord(
        "shard-000000.tar",
        len(shard),
        hashlib.sha256(shard).hexdigest(),
        [SampleRecord("k", -1, 0, len(span), zlib.crc32(span))],
    )
    write_index(store, DatasetIndex.from_shards([record], class_names=[], fields={}))
    return str(root)


@pytest.mark.parametrize("pax", [False, True])
@pytest.mark.parametrize("name", TRAVERSAL)
def test_parse_members_refuses_unsafe_names(name: str, pax: bool) -> None:
    span = span_of(tar_of(regular(name, pax=pax or "\0" in name)))
    with pytest.raises(ShardFormatError, match=r"^shard\.tar:k: .*not allowed") as caught:
        parse_members(span, where="shard.tar:k")
    assert repr(name)[1:-1][:8] in str(caught.value)  # the member is named


@pytest.mark.parametrize("pax", [False, True])
@pytest.mark.parametrize("name", TRAVERSAL)
def test_scan_tar_refuses_unsafe_names(name: str, pax: bool) -> None:
    with pytest.raises(SourceError, match=r"^in\.tar: .*not allowed"):
        scan_tar(tar_of(regular(name, pax=pax or "\0" in name)), name="in.tar")


@pytest.mark.parametrize(("kind", "what"), SPECIAL.items())
def test_parse_members_refuses_links_devices_fifos_and_directories(kind: bytes, what: str) -> None:
    span = span_of(tar_of(regular("k.jpg"), special("k.lnk", kind)))
    with pytest.raises(ShardFormatError, match=rf"shard\.tar:k: member 'k\.lnk/?' is {what}"):
        parse_members(span, where="shard.tar:k")


@pytest.mark.parametrize(("kind", "what"), [(k, w) for k, w in SPECIAL.items() if "dir" not in w])
def test_scan_tar_refuses_links_devices_and_fifos(kind: bytes, what: str) -> None:
    with pytest.raises(SourceError, match=rf"in\.tar: member 'k\.lnk' is {what}"):
        scan_tar(tar_of(regular("k.jpg"), special("k.lnk", kind)), name="in.tar")


def test_scan_tar_refuses_a_directory_inside_a_sample_but_not_between_samples() -> None:
    between = tar_of(special("a/", tarfile.DIRTYPE), regular("a/k.jpg"), regular("b.jpg"))
    assert [s.key for s in scan_tar(between, name="in.tar")] == ["a/k", "b"]
    inside = tar_of(regular("k.jpg"), special("d/", tarfile.DIRTYPE), regular("k.cls"))
    with pytest.raises(SourceError, match="directory entry 'd/' lies between the members"):
        scan_tar(inside, name="in.tar")


@pytest.mark.parametrize("name", ["../evil.jpg", "/etc/evil.jpg", "a\\..\\evil.jpg"])
def test_reading_a_dataset_with_an_unsafe_member_names_shard_and_sample(
    name: str, tmp_path: Path
) -> None:
    url = dataset_with_shard(tmp_path / "ds", tar_of(regular(name)))
    dataset = open_dataset(url)
    with pytest.raises(ShardFormatError, match=r"shard-000000\.tar:k: .*member .*not allowed"):
        dataset[0]
    with pytest.raises(ShardFormatError, match="not allowed"):
        dataset.read_many([0])
    report = dataset.verify()
    assert [(shard, key) for shard, key, _ in report.corrupt] == [("shard-000000.tar", "k")]
    assert "not allowed" in report.corrupt[0][2]


def test_reading_a_dataset_with_a_symlink_member_is_refused(tmp_path: Path) -> None:
    shard = tar_of(regular("k.jpg"), special("k.txt", tarfile.SYMTYPE))
    dataset = open_dataset(dataset_with_shard(tmp_path / "ds", shard))
    with pytest.raises(ShardFormatError, match=r"member 'k\.txt' is a symbolic link"):
        dataset[0]


def test_index_command_refuses_unsafe_tars_and_writes_no_index(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    store = open_store(root)
    store.put("a.tar", tar_of(regular("k.jpg"), special("k.cls", tarfile.SYMTYPE)))
    with pytest.raises(SourceError, match="is a symbolic link"):
        index_webdataset(str(root))
    assert not (root / "index.json").exists()


@pytest.mark.parametrize("key", ["a\\b", "nul\x00", "C:x", "tab\there", "../x", "/abs"])
def test_writer_refuses_keys_that_make_unsafe_member_names(key: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid sample key"):
        check_key(key)
    writer = ShardWriter(open_store(tmp_path), "s.tar")
    with pytest.raises(ValueError, match="invalid sample key"):
        writer.add(Sample(key=key, fields={"jpg": b"x"}))


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/abs", "a//b", "./x", "a/./b", "nul\x00"])
def test_download_paths_stay_under_the_destination(key: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsafe path"):
        safe_local_path(tmp_path, key)
    # And what it accepts resolves under the root.
    assert safe_local_path(tmp_path, "a/b..c/d").resolve().is_relative_to(tmp_path.resolve())
