"""Pack checks each member as training will decode it: a truncated npy, JSON that does not
parse, a caption that is not UTF-8, an integer member that is no integer and a broken mask
stop the pack naming the sample and the field, or with on_error="skip" are left out,
counted and listed, as a broken image is. Images are not decoded a second time."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from stoker.cli.main import cli
from stoker.errors import SourceError
from stoker.format.reader import open_dataset
from stoker.pack import fieldcheck
from stoker.pack.packer import PackConfig, pack
from stoker.pack.reencode import ImagePolicy
from stoker.testing.images import make_jpeg

SAMPLES = 12


def _npy(array: np.ndarray, **options: Any) -> bytes:
    out = io.BytesIO()
    np.save(out, array, **options)
    return out.getvalue()


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def _good(i: int) -> dict[str, bytes]:
    """One record of the issue's layout: an image, a caption, JSON, an array, a mask."""
    return {
        "jpg": make_jpeg(np.random.default_rng(i), width=24, height=16),
        "txt": f"caption {i}, ünïcode".encode(),
        "json": json.dumps({"i": i, "tags": ["a"] * (i % 3)}).encode(),
        "npy": _npy(np.arange(i % 4 + 1, dtype=np.float32)),
        "idx": str(i).encode(),
        "seg.png": _png(np.full((16, 24), i, dtype=np.uint8)),
    }


#: Key -> (member, bad bytes, what pack says about it).
BAD = {
    "0001": (
        "npy",
        _npy(np.arange(10, dtype=np.float32))[:-7],
        "npy array of shape (10,) and dtype float32 needs 40 bytes of data, has 33",
    ),
    "0003": ("json", b'{"i": 3, "tags": [', "invalid JSON: Expecting value at line 1 column 19"),
    "0005": ("txt", b"caf\xe9 au lait", "not UTF-8 text: invalid continuation byte at byte 3"),
    "0007": ("idx", b"seven", "not an integer: b'seven'"),
    "0009": ("seg.png", _png(np.zeros((16, 24), np.uint8))[:-20], "cannot decode image"),
    "0011": ("npy", b"\x93NUMPY\x01\x00" + b"\x00" * 20, "not an npy array"),
}


def _files(bad: dict[str, tuple[str, bytes, str]]) -> dict[str, bytes]:
    files = {}
    for i in range(SAMPLES):
        key = f"{i:04d}"
        members = _good(i)
        if key in bad:
            member, data, _ = bad[key]
            members[member] = data
        files.update({f"{key}.{ext}": data for ext, data in members.items()})
    return files


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_bad_member_stops_the_pack_naming_sample_and_field(tmp_path: Path, key: str) -> None:
    member, _, message = BAD[key]
    source = _folder(tmp_path / "in", _files({key: BAD[key]}))
    with pytest.raises(SourceError) as caught:
        pack(source, tmp_path / "ds", config=PackConfig(shuffle_seed=None))
    assert str(caught.value).startswith(f"{source / key}: sample {key!r}, field {member!r}: ")
    assert message in str(caught.value)
    assert not (tmp_path / "ds" / "index.json").exists()


def test_bad_members_are_skipped_counted_and_listed(tmp_path: Path) -> None:
    source = _folder(tmp_path / "in", _files(BAD))
    report = pack(source, tmp_path / "ds", config=PackConfig(on_error="skip", samples_per_shard=5))
    assert report.samples == SAMPLES - len(BAD)
    assert sorted(s["key"] for s in report.skipped) == sorted(BAD)
    for item in report.skipped:
        member, _, message = BAD[item["key"]]
        assert item["source"] == str(source / item["key"])
        assert item["reason"].startswith(f"{source / item['key']}: sample {item['key']!r}, ")
        assert f"field {member!r}: " in item["reason"]
        assert message in item["reason"]
    manifest = json.loads((tmp_path / "ds" / "index.json").read_text())
    assert sorted(manifest["skipped"], key=lambda s: s["key"]) == sorted(
        report.skipped, key=lambda s: s["key"]
    )
    dataset = open_dataset(tmp_path / "ds")
    kept = {s["key"]: s for s in dataset.read_many(range(len(dataset)))}
    assert sorted(kept) == sorted(f"{i:04d}" for i in range(SAMPLES) if f"{i:04d}" not in BAD)
    for key, sample in kept.items():
        assert {ext: sample[ext] for ext in _good(0)} == _good(int(key))


def test_the_command_lists_what_it_skipped(tmp_path: Path) -> None:
    source = _folder(tmp_path / "in", _files(BAD))
    result = CliRunner().invoke(
        cli, ["pack", str(source), str(tmp_path / "ds"), "--on-error", "skip", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert f"Skipped {len(BAD)} inputs" in result.output
    for key, (member, _, message) in BAD.items():
        assert f"sample {key!r}, field {member!r}: {message}" in result.output


def test_a_bucket_folder_is_checked_the_same_way(s3_bucket: Any) -> None:
    # Remote samples are read and checked on the I/O loop (small) or in the read pool.
    bad = {"0003": BAD["0003"], "0005": BAD["0005"]}
    store = s3_bucket.store("in")
    for name, data in _files(bad).items():
        store.put(name, data)
    options = s3_bucket.options()
    report = pack(
        f"{s3_bucket.url}/in",
        f"{s3_bucket.url}/ds",
        storage_options=options,
        config=PackConfig(on_error="skip"),
    )
    assert report.samples == SAMPLES - 2
    assert {s["key"]: s["reason"] for s in report.skipped} == {
        key: f"{s3_bucket.url}/in/{key}: sample {key!r}, field {member!r}: {message}"
        for key, (member, _, message) in bad.items()
    }


def test_members_training_reads_are_packed_unchanged(tmp_path: Path) -> None:
    unusual = {
        "0000": ("npy", _npy(np.arange(6.0).reshape(2, 3), allow_pickle=False)),
        "0001": ("npy", _npy(np.asfortranarray(np.arange(6.0).reshape(2, 3)))),
        "0002": ("npy", _npy(np.zeros((0, 4), np.int16))),
        # Python objects: the Loader gives their bytes, never unpickled; pack keeps them.
        "0003": ("npy", _npy(np.array([{"a": 1}], dtype=object), allow_pickle=True)),
        "0004": ("json", b'  [1, 2.5, "x", null, {"k": true}]\n'),
        "0005": ("txt", b""),
        "0006": ("idx", b" 12\n"),
    }
    files = _files({k: (m, d, "") for k, (m, d) in unusual.items()})
    report = pack(_folder(tmp_path / "in", files), tmp_path / "ds")
    assert (report.samples, report.skipped) == (SAMPLES, [])
    dataset = open_dataset(tmp_path / "ds")
    for sample in dataset.read_many(range(len(dataset))):
        for ext in _good(0):
            assert sample[ext] == files[f"{sample['key']}.{ext}"]


def test_without_checks_bad_members_are_packed_as_they_are(tmp_path: Path) -> None:
    source = _folder(tmp_path / "in", _files(BAD))
    report = pack(source, tmp_path / "ds", config=PackConfig(images=ImagePolicy(check=False)))
    assert (report.samples, report.skipped) == (SAMPLES, [])


def test_images_are_decoded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The image the policy checks (jpg) is not checked again as a member; a mask is checked
    # once, and never re-encoded, even when the policy re-encodes images.
    checked: list[str] = []
    original = fieldcheck.process_image

    def counting(data: bytes, ext: str, policy: ImagePolicy, *, where: str) -> tuple[str, bytes]:
        checked.append(ext)
        return original(data, ext, policy, where=where)

    monkeypatch.setattr(fieldcheck, "process_image", counting)
    files = _files({})
    config = PackConfig(images=ImagePolicy(quality=80))
    report = pack(_folder(tmp_path / "in", files), tmp_path / "ds", config=config)
    assert report.samples == SAMPLES
    assert checked == ["png"] * SAMPLES
    dataset = open_dataset(tmp_path / "ds")
    for sample in dataset.read_many(range(len(dataset))):
        assert sample["seg.png"] == files[f"{sample['key']}.seg.png"]
        assert sample["jpg"] != files[f"{sample['key']}.jpg"]  # re-encoded


@pytest.mark.parametrize(
    ("ext", "data", "message"),
    [
        ("emb.npy", b"not an array", "not an npy array"),
        ("meta.json", b"{", "invalid JSON"),
        ("caption", b"\xff", "not UTF-8 text"),
        ("cls2", b"1.5", "not an integer"),
        ("mask.jpeg", b"\xff\xd8\xff\xe0", "cannot decode image"),
    ],
)
def test_members_are_checked_by_the_decoder_the_loader_picks(
    ext: str, data: bytes, message: str
) -> None:
    with pytest.raises(SourceError, match=rf"^in/k: sample 'k', field '{re.escape(ext)}': "):
        fieldcheck.check_field(ext, data, key="k", where="in/k", policy=ImagePolicy())
    with pytest.raises(SourceError, match=message):
        fieldcheck.check_field(ext, data, key="k", where="in/k", policy=ImagePolicy())
    # Bytes the table keeps as bytes are not checked.
    fieldcheck.check_field("bin", data, key="k", where="in/k", policy=ImagePolicy())
