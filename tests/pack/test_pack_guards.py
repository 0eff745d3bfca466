"""`stoker pack` refuses what training would trip over, and what would poison its input
(issue 15: silent corruption, paths and arguments; issue 14: pack and index)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result
from PIL import Image

from stoker.cli.main import cli
from stoker.format.reader import open_dataset
from stoker.pack.imagecheck import check_jpeg_decodes, check_png_decodes
from stoker.pack.packer import pack
from stoker.pack.sources import refuse_destination_in_source
from stoker.pipeline.decode import decode_full
from stoker.storage import open_store
from stoker.storage.transfer import upload
from stoker.testing.images import make_jpeg, write_image_folder


def _stoker(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def _truncated_with_end_marker(jpeg: bytes) -> bytes:
    # The probe's reproduction: (head -c 3000 a.jpg; printf '\xff\xd9') > t.jpg
    return jpeg[:3000] + b"\xff\xd9"


@pytest.fixture
def folder_with_truncated_jpeg(tmp_path: Path) -> tuple[Path, Path]:
    write_image_folder(tmp_path / "src", files=6, classes=2, width=160, height=120)
    victim = tmp_path / "src" / "class_01" / "cut.jpg"
    victim.write_bytes(
        _truncated_with_end_marker(make_jpeg(np.random.default_rng(3), width=320, height=240))
    )
    with pytest.raises(ValueError, match="premature end of data"):
        decode_full(victim.read_bytes())  # what training would meet
    return tmp_path / "src", victim


@pytest.mark.parametrize("extra", [[], ["--quality", "90"], ["--resize", "64"]])
def test_truncated_jpeg_with_its_end_marker_is_refused(
    folder_with_truncated_jpeg: tuple[Path, Path], tmp_path: Path, extra: list[str]
) -> None:
    source, victim = folder_with_truncated_jpeg
    result = _stoker("pack", source, tmp_path / "ds", *extra)
    assert result.exit_code == 1
    assert f"{victim}: cannot decode image" in result.output
    assert "premature end of data" in result.output
    assert not (tmp_path / "ds" / "index.json").exists()


@pytest.mark.parametrize("extra", [[], ["--quality", "90"]])
def test_truncated_jpeg_is_skipped_counted_and_listed(
    folder_with_truncated_jpeg: tuple[Path, Path], tmp_path: Path, extra: list[str]
) -> None:
    source, victim = folder_with_truncated_jpeg
    result = _stoker("pack", source, tmp_path / "ds", "--on-error", "skip", *extra)
    assert result.exit_code == 0, result.output
    assert "Skipped 1 inputs" in result.output
    assert f"{victim}: " in result.output
    assert "premature end of data" in result.output
    dataset = open_dataset(tmp_path / "ds")
    assert len(dataset) == 6
    assert [s["key"] for s in dataset.index.skipped] == ["class_01/cut"]
    for i in range(len(dataset)):  # everything packed decodes as the Loader decodes it
        decode_full(dataset[i]["jpg"])


def test_cmyk_and_greyscale_jpegs_pass() -> None:
    for mode, colour in (("CMYK", (10, 20, 30, 40)), ("L", 90)):
        out = io.BytesIO()
        Image.new(mode, (40, 30), colour).save(out, format="JPEG")
        check_jpeg_decodes(out.getvalue())
    check_jpeg_decodes(make_jpeg(np.random.default_rng(0), width=640, height=480))


def _png(width: int = 300, height: int = 200) -> bytes:
    rng = np.random.default_rng(5)
    pixels = (rng.random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def test_png_checks_catch_what_pillow_would() -> None:
    good = _png()
    check_png_decodes(good)
    iend = good[-12:]
    cut = good[: len(good) // 2] + iend  # truncated, its IEND put back
    with pytest.raises(ValueError, match="runs past the end"):
        check_png_decodes(cut)
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    with pytest.raises(ValueError, match="fails its CRC"):
        check_png_decodes(bytes(flipped))
    # Whole chunks, but the image data stops: only inflating it shows that.
    first_idat = good.index(b"IDAT") - 4
    (length,) = np.frombuffer(good[first_idat : first_idat + 4], dtype=">u4")
    short = good[: first_idat + 12 + int(length)] + iend
    assert len(short) < len(good)  # Pillow wrote more than one IDAT chunk
    with pytest.raises(ValueError, match="stops short"):
        check_png_decodes(short)
    with pytest.raises(OSError, match="truncated"):
        Image.open(io.BytesIO(short)).convert("RGB")


def test_truncated_png_is_refused_by_pack(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=4, classes=1, width=32, height=24)
    good = _png()
    victim = tmp_path / "src" / "class_00" / "cut.png"
    victim.write_bytes(good[: len(good) // 2] + good[-12:])
    result = _stoker("pack", tmp_path / "src", tmp_path / "ds")
    assert result.exit_code == 1
    assert f"{victim}: cannot decode image" in result.output


def _list_folder(tmp_path: Path) -> Path:
    write_image_folder(tmp_path / "data" / "img", files=3, classes=1, width=32, height=24)
    rows = sorted(
        p.relative_to(tmp_path / "data").as_posix() for p in (tmp_path / "data").rglob("*.jpg")
    )
    (tmp_path / "data" / "train.csv").write_text("path,label\n" + "".join(f"{r},0\n" for r in rows))
    return tmp_path / "data" / "train.csv"


@pytest.mark.parametrize("row", ["{secret}", "../secret.jpg", "img/link.jpg", "file://{secret}"])
def test_list_rows_outside_the_list_folder_are_refused(tmp_path: Path, row: str) -> None:
    listing = _list_folder(tmp_path)
    secret = tmp_path / "secret.jpg"  # stands for ~/.aws/credentials
    secret.write_bytes(make_jpeg(np.random.default_rng(0), width=16, height=16))
    (tmp_path / "data" / "img" / "link.jpg").symlink_to(secret)
    row = row.format(secret=secret)
    with listing.open("a") as out:
        out.write(f"{row},0\n")
    result = _stoker("pack", listing, tmp_path / "ds")
    assert result.exit_code == 1
    assert f"row 4 (line 5): {row!r} lies outside the list's folder" in result.output
    assert "--allow-outside-list" in result.output
    assert not (tmp_path / "ds").exists() or not (tmp_path / "ds" / "index.json").exists()
    allowed = _stoker("pack", listing, tmp_path / "ds2", "--allow-outside-list")
    assert allowed.exit_code == 0, allowed.output
    assert len(open_dataset(tmp_path / "ds2")) == 4


def test_list_rows_inside_the_folder_pack(tmp_path: Path) -> None:
    listing = _list_folder(tmp_path)
    absolute = tmp_path / "data" / "img" / "class_00" / "extra.jpg"
    absolute.write_bytes(make_jpeg(np.random.default_rng(1), width=16, height=16))
    with listing.open("a") as out:
        out.write(f"{absolute},0\n")  # absolute, but inside
    result = _stoker("pack", listing, tmp_path / "ds")
    assert result.exit_code == 0, result.output
    assert len(open_dataset(tmp_path / "ds")) == 4


@pytest.mark.parametrize("where", [".", "packed", "class_00/packed"])
def test_packing_into_the_source_folder_is_refused(tmp_path: Path, where: str) -> None:
    write_image_folder(tmp_path / "src", files=4, classes=2, width=32, height=24)
    destination = tmp_path / "src" / where
    result = _stoker("pack", tmp_path / "src", destination)
    assert result.exit_code == 1
    assert f"destination {destination.resolve()} is inside the source folder" in result.output
    assert f"{(tmp_path / 'src').resolve()}" in result.output
    assert not (destination / "_stoker").exists()
    beside = _stoker("pack", tmp_path / "src", tmp_path / "packed")
    assert beside.exit_code == 0, beside.output


def test_packing_into_the_source_prefix_is_refused(s3_bucket: Any, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=4, classes=2, width=32, height=24)
    upload(
        tmp_path / "src", open_store(f"{s3_bucket.url}/raw", storage_options=s3_bucket.options())
    )
    options = s3_bucket.options()
    inside = f"destination {s3_bucket.url}/raw/ds is inside the source folder {s3_bucket.url}/raw:"
    with pytest.raises(ValueError, match=inside):
        pack(f"{s3_bucket.url}/raw", f"{s3_bucket.url}/raw/ds", storage_options=options)
    # A sibling prefix that merely starts alike is not inside.
    refuse_destination_in_source(f"{s3_bucket.url}/raw", f"{s3_bucket.url}/raw-packed")


def test_a_refused_repack_names_the_arguments_that_differ(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=6, classes=2, width=32, height=24)
    assert _stoker("pack", tmp_path / "src", tmp_path / "ds").exit_code == 0
    again = _stoker(
        "pack", tmp_path / "src", tmp_path / "ds", "--quality", "80", "--shuffle-seed", "7"
    )
    assert again.exit_code == 1
    assert "already holds a pack of other input or arguments" in again.output
    assert "images.quality: null then, 80 now" in again.output
    assert "shuffle_seed: 0 then, 7 now" in again.output
    assert "input:" not in again.output
    write_image_folder(tmp_path / "other", files=4, classes=1, width=32, height=24)
    other = _stoker("pack", tmp_path / "other", tmp_path / "ds")
    assert other.exit_code == 1
    assert "(6 inputs) then" in other.output
    assert "(4 inputs) now" in other.output
    assert "images." not in other.output


def test_pack_class_names(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "data" / "img", files=4, classes=1, width=32, height=24)
    rows = sorted(
        p.relative_to(tmp_path / "data").as_posix() for p in (tmp_path / "data").rglob("*.jpg")
    )
    (tmp_path / "data" / "l.csv").write_text(
        "path,label\n" + "".join(f"{r},{i % 2}\n" for i, r in enumerate(rows))
    )
    named = _stoker(
        "pack",
        tmp_path / "data" / "l.csv",
        tmp_path / "ds",
        "--class-name",
        "cat",
        "--class-name",
        "dog",
    )
    assert named.exit_code == 0, named.output
    assert open_dataset(tmp_path / "ds").class_names == ["cat", "dog"]
    short = _stoker("pack", tmp_path / "data" / "l.csv", tmp_path / "ds2", "--class-name", "cat")
    assert short.exit_code == 1
    assert "line 3: label 1 is out of range for 1 class names" in short.output
    folder = _stoker("pack", tmp_path / "data" / "img", tmp_path / "ds3", "--class-name", "x")
    assert folder.exit_code == 1
    assert "the input names its classes ['class_00']" in folder.output


def test_workers_are_bounded_by_the_open_file_limit(tmp_path: Path) -> None:
    import resource
    import subprocess
    import sys

    write_image_folder(tmp_path / "src", files=2, classes=1, width=32, height=24)
    command = [
        str(Path(sys.executable).with_name("stoker")),
        "pack",
        str(tmp_path / "src"),
        str(tmp_path / "ds"),
    ]

    def low_limit() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )

    refused = subprocess.run(
        [*command, "--workers", "500"],
        capture_output=True,
        text=True,
        preexec_fn=low_limit,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr
    assert "--workers" in refused.stderr
    assert "this process may open 256 (ulimit -n): use 192 workers or fewer" in refused.stderr
    fits = subprocess.run(
        [*command, "--workers", "192"],
        capture_output=True,
        text=True,
        preexec_fn=low_limit,
        timeout=120,
    )
    assert fits.returncode == 0, fits.stderr


def _users_files() -> dict[str, bytes]:
    # A common WebDataset name and an index of the user's own: what pack would write.
    return {"shard-000000.tar": b"my own tar", "index.bin": b"my own index"}


def test_packing_over_a_folder_with_files_is_refused(tmp_path: Path) -> None:
    """Issue 22.3: pack replaced the user's shard-000000.tar and index.bin without a word."""
    write_image_folder(tmp_path / "src", files=4, classes=2, width=32, height=24)
    destination = tmp_path / "mine"
    destination.mkdir()
    for name, data in _users_files().items():
        (destination / name).write_bytes(data)
    result = _stoker("pack", tmp_path / "src", destination)
    assert result.exit_code == 1, result.output
    assert f"{destination}: not empty" in result.output
    assert "index.bin" in result.output
    assert "shard-000000.tar" in result.output
    assert {p.name: p.read_bytes() for p in destination.iterdir()} == _users_files()


def test_packing_over_a_prefix_with_objects_is_refused(s3_bucket: Any, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=4, classes=2, width=32, height=24)
    store = s3_bucket.store("mine")
    for name, data in _users_files().items():
        store.put(name, data)
    with pytest.raises(ValueError, match=f"{s3_bucket.url}/mine: not empty") as refused:
        pack(tmp_path / "src", f"{s3_bucket.url}/mine", storage_options=s3_bucket.options())
    assert "index.bin" in str(refused.value)
    assert "shard-000000.tar" in str(refused.value)
    assert {m.key: bytes(store.get(m.key)) for m in store.list()} == _users_files()


def test_a_resumable_pack_with_files_of_others_is_refused(tmp_path: Path) -> None:
    """A pack of the same input resumes; a file that is not the pack's in it is named."""
    write_image_folder(tmp_path / "src", files=6, classes=2, width=32, height=24)
    assert _stoker("pack", tmp_path / "src", tmp_path / "ds").exit_code == 0
    resumed = _stoker("pack", tmp_path / "src", tmp_path / "ds")
    assert resumed.exit_code == 0, resumed.output
    (tmp_path / "ds" / "notes.txt").write_bytes(b"mine")
    refused = _stoker("pack", tmp_path / "src", tmp_path / "ds")
    assert refused.exit_code == 1
    assert "notes.txt" in refused.output
    assert (tmp_path / "ds" / "notes.txt").read_bytes() == b"mine"
