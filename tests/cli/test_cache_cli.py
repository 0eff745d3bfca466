"""``stoker cache info|verify|clear`` and ``stoker bench --cache-dir``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.pack.packer import PackConfig, pack
from stoker.storage import DiskCache
from stoker.testing.images import write_image_folder


def test_bench_fills_a_cache_that_the_cache_commands_see(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=30, classes=3, width=48, height=40)
    pack(tmp_path / "src", tmp_path / "ds", config=PackConfig(samples_per_shard=10))
    cache_dir = tmp_path / "cache"
    runner = CliRunner()
    args = ["bench", str(tmp_path / "ds"), "--batch-size", "8", "--size", "16", "--json"]
    cold = runner.invoke(cli, [*args, "--cache-dir", str(cache_dir)])
    assert cold.exit_code == 0, cold.output
    warm = runner.invoke(cli, [*args, "--cache-dir", str(cache_dir)])
    assert warm.exit_code == 0, warm.output
    assert json.loads(cold.output)["requests_per_sample"] > 0
    assert json.loads(warm.output)["requests_per_sample"] == 0

    info = runner.invoke(cli, ["cache", "info", str(cache_dir), "--json"])
    assert info.exit_code == 0, info.output
    held = json.loads(info.output)
    assert held["entries"] == DiskCache(cache_dir, max_bytes=1).entries() > 0
    assert held["bytes"] > 0

    (entry,) = sorted((cache_dir / "v1" / "entries").rglob("*/*"))[:1]
    entry.write_bytes(entry.read_bytes()[:-1])
    verified = runner.invoke(cli, ["cache", "verify", str(cache_dir)])
    assert verified.exit_code == 0, verified.output
    assert f"{held['entries']} entries checked, 1 damaged and removed" in verified.output

    cleared = runner.invoke(cli, ["cache", "clear", str(cache_dir)])
    assert cleared.exit_code == 0, cleared.output
    assert DiskCache(cache_dir, max_bytes=1).entries() == 0


def _victim(tmp_path: Path) -> dict[Path, bytes]:
    """Someone's folder, with a file named like a cache entry (damaged, to a cache)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    files = {
        victim / "notes.txt": b"mine",
        victim / ("ab" * 32): b"not a cache entry",
    }
    for path, data in files.items():
        path.write_bytes(data)
        os.utime(path, (1, 1))  # older than any entry: first in line for eviction
    return files


def _plant_links(cache_dir: Path, victim: Path) -> list[Path]:
    entries = cache_dir / "v1" / "entries"
    sub = next(p for p in entries.iterdir() if p.is_dir())
    links = [entries / "zz", entries / "ab", sub / (sub.name + "0" * 62)]
    links[0].symlink_to(victim, target_is_directory=True)
    links[1].symlink_to(victim, target_is_directory=True)
    links[2].symlink_to(victim / "notes.txt")
    return links


def test_cache_commands_never_follow_a_link_out_of_the_cache(tmp_path: Path) -> None:
    """Issue 22.2: verify and clear deleted the files of a folder linked into the cache."""
    cache_dir = tmp_path / "cache"
    cache = DiskCache(cache_dir, max_bytes=1 << 20)
    for n in range(5):
        cache.put(f"k{n}", bytes([n]) * 100)
    files = _victim(tmp_path)
    links = _plant_links(cache_dir, tmp_path / "victim")
    runner = CliRunner()

    verified = runner.invoke(cli, ["cache", "verify", str(cache_dir)])
    assert verified.exit_code == 0, verified.output
    assert "5 entries checked, 0 damaged and removed" in verified.output
    for link in links:
        assert str(link) in verified.output
    assert "symbolic link" in verified.output
    assert {p: p.read_bytes() for p in files} == files

    info = runner.invoke(cli, ["cache", "info", str(cache_dir), "--json"])
    assert json.loads(info.output.splitlines()[-1])["entries"] == 5

    cleared = runner.invoke(cli, ["cache", "clear", str(cache_dir)])
    assert cleared.exit_code == 0, cleared.output
    assert "Removed 5 entries" in cleared.output
    for link in links:
        assert str(link) in cleared.output
    assert {p: p.read_bytes() for p in files} == files
    assert all(link.is_symlink() for link in links)  # left alone, not even unlinked


@pytest.mark.parametrize("command", ["info", "verify", "clear"])
def test_cache_commands_refuse_a_folder_that_is_not_a_cache(tmp_path: Path, command: str) -> None:
    """Issue 22.2 and 22.14: `cache info` wrote v1/ into any folder; clear must not empty one."""
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"x")
    result = CliRunner().invoke(cli, ["cache", command, str(folder)])
    assert result.exit_code == 1, result.output
    assert f"{folder} is not a stoker disk cache" in result.output
    assert sorted(p.name for p in folder.iterdir()) == ["a.jpg"]
