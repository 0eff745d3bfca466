"""Option values the commands cannot use are refused before any work, naming the option and
what it takes: no traceback, no Rust panic, no silent no-op."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from stoker.cli.main import cli
from stoker.pack.packer import pack
from stoker.testing.images import write_image_folder


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-arguments") / "images"
    write_image_folder(root, files=5, classes=2, width=32, height=32)
    return root


def _run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env=env).invoke(cli, list(args))


def _refused(result: Result, option: str, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert message in result.output
    assert isinstance(result.exception, SystemExit)  # a usage error, not a traceback


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ("1e400", "'1e400' is more than the largest size, 9,223,372,036,854,775,807 bytes"),
        ("infGB", "'infGB' is not a finite size"),
        ("nan", "'nan' is not a finite size"),
        ("-5MB", "'-5MB' is negative"),
        ("0", "'0' is less than 1 byte"),
        ("12 parsecs", "'12 parsecs' is not a size: use a number of bytes"),
    ],
)
def test_pack_refuses_a_shard_size_it_cannot_use(
    images: Path, tmp_path: Path, size: str, message: str
) -> None:
    result = _run("pack", "--shard-size", size, str(images), str(tmp_path / "out"))
    _refused(result, "--shard-size", message)
    assert not (tmp_path / "out").exists()


def test_pack_reads_sizes_with_units(images: Path, tmp_path: Path) -> None:
    result = _run("pack", "--shard-size", "1.5 kB", "--json", str(images), str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert '"shards": 5' in result.output  # 1,500-byte shards: one image each


@pytest.mark.parametrize(
    ("args", "option", "message"),
    [
        (["doctor", "--step-ms", "1e308"], "--step-ms", "1e+308 is not in the range 0<=x<=3600000"),
        (["doctor", "--step-ms", "inf"], "--step-ms", "'inf' is not a finite number"),
        (["doctor", "--step-ms", "nan"], "--step-ms", "'nan' is not a finite number"),
        (["doctor", "--seconds", "inf"], "--seconds", "'inf' is not a finite number"),
        (["bench", "--compare", "--rtt-ms", "nan"], "--rtt-ms", "'nan' is not a finite number"),
        (["show", "--seed", "-1"], "--seed", "-1 is not in the range x>=0"),
        (["doctor", "--seed", "-1"], "--seed", "-1 is not in the range x>=0"),
    ],
)
def test_profile_commands_refuse_numbers_they_cannot_use(
    images: Path, args: list[str], option: str, message: str
) -> None:
    _refused(_run(*args, str(images)), option, message)


@pytest.mark.parametrize("rate", ["inf", "1e400", "nan", "0"])
def test_a_request_rate_must_be_finite_and_positive(images: Path, rate: str) -> None:
    result = _run("--max-requests-per-s", rate, "ls", str(images))
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--max-requests-per-s'" in result.output


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ("http://", "no host"),
        ("https://:8333", "no host"),
        ("http://host:99999", "Port out of range"),
        ("ftp://host", "not http:// or https://"),
        ("http://a host", "a space or control character"),
        ("http://user:SECRET@:80", "no host"),
    ],
)
def test_an_endpoint_without_a_host_is_named_not_a_rust_panic(endpoint: str, problem: str) -> None:
    env = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "us-east-1"}
    result = _run("--endpoint-url", endpoint, "ls", "s3://bucket/x", env=env)
    _refused(result, "--endpoint-url", "endpoint_url must be a URL such as https://host:port")
    assert problem in result.output
    assert "panicked" not in result.output
    assert "SECRET" not in result.output


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_endpoint_from_the_environment_is_checked_too(variable: str) -> None:
    env = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", variable: "http://"}
    result = _run("ls", "s3://bucket/x", env=env)
    assert result.exit_code == 1, result.output
    assert f"got 'http://' (no host), from {variable}" in result.output
    assert "panicked" not in result.output


@pytest.mark.parametrize("pattern", ["[", "class_0[1", "[!", ""])
def test_download_refuses_a_glob_that_cannot_match_as_written(
    images: Path, tmp_path: Path, pattern: str
) -> None:
    # '[' used to be matched literally: nothing downloaded, exit status 0.
    result = _run("download", str(images), str(tmp_path / "dst"), "--include", pattern)
    assert result.exit_code == 1, result.output
    assert "include pattern" in result.output
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").iterdir())


def test_download_takes_a_bracket_set(images: Path, tmp_path: Path) -> None:
    result = _run("download", str(images), str(tmp_path / "dst"), "--include", "class_0[1]/*")
    assert result.exit_code == 0, result.output
    assert sorted(p.parent.name for p in (tmp_path / "dst").rglob("*.jpg")) == ["class_01"] * 2


def test_pack_as_hdf5_of_a_folder_says_it_is_a_folder(images: Path, tmp_path: Path) -> None:
    result = _run("pack", "--format", "hdf5", str(images), str(tmp_path / "out"))
    assert result.exit_code == 1, result.output
    assert f"{images} is a folder: the HDF5 reader takes one .h5 file" in result.output
    assert "Unable to synchronously open" not in result.output  # h5py's own dump


def test_an_empty_jpg_is_named_as_empty(images: Path, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    (folder / "cats").mkdir(parents=True)
    for source in sorted(images.rglob("*.jpg"))[:2]:
        (folder / "cats" / source.name).write_bytes(source.read_bytes())
    (folder / "cats" / "empty.jpg").write_bytes(b"")
    shown = _run("show", str(folder), "--out", str(tmp_path / "grid.png"))
    assert shown.exit_code == 1, shown.output
    assert "sample 'cats/empty': cannot decode image: empty (0 bytes), not an image" in shown.output
    assert "BytesIO" not in shown.output
    (folder / "cats" / "empty.jpg").write_bytes(b"no image, only words")
    shown = _run("show", str(folder), "--out", str(tmp_path / "grid.png"))
    assert "not an image format Pillow reads (20 bytes, starting b'no image')" in shown.output
    assert "BytesIO" not in shown.output
    (folder / "cats" / "empty.jpg").write_bytes(b"")
    packed = _run("pack", str(folder), str(tmp_path / "packed"))
    assert packed.exit_code == 1, packed.output
    assert "empty.jpg: cannot decode image: empty (0 bytes), not an image" in packed.output


def test_show_says_how_many_samples_it_drew(images: Path, tmp_path: Path) -> None:
    # Five images: the 3x3 grid has four empty cells, and the message said "9 samples".
    pack(images, tmp_path / "packed")
    for url in (str(images), str(tmp_path / "packed")):
        result = _run("show", url, "--out", str(tmp_path / "grid.png"))
        assert result.exit_code == 0, result.output
        assert f"(5 samples of {url})" in result.output
