"""``stoker cache info|verify|clear`` and ``stoker bench --cache-dir``."""

from __future__ import annotations

import json
from pathlib import Path

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
