"""The ports of `stoker bench --compare --rtt-ms` and `stoker demo` can be pinned, by flag or
environment variable (documented in --help), and a taken port is named."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stoker.cli.main import cli
from stoker.storage.transfer import upload
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import free_ports


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port of 127.0.0.1 that something listens on."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


def _env(s3_bucket: Any, **extra: str) -> dict[str, str]:
    options = s3_bucket.options()
    return {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
        **extra,
    }


def test_bench_compare_proxy_listens_on_the_port_given(s3_bucket: Any, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "src", files=8, classes=2, width=32, height=24)
    upload(tmp_path / "src", s3_bucket.store("photos"))
    (port,) = free_ports(1)
    args = ["bench", "--compare", f"{s3_bucket.url}/photos", "--batch-size", "4", "--size", "16"]
    args += ["--threads", "1", "--out", str(tmp_path / "c.png"), "--rtt-ms", "1", "--json"]
    env = _env(s3_bucket, STOKER_BENCH_PORT=str(port))
    result = CliRunner(env=env).invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["proxy"] == f"http://127.0.0.1:{port}"


def test_bench_compare_names_a_port_it_cannot_use(s3_bucket: Any, busy_port: int) -> None:
    args = ["bench", "--compare", f"{s3_bucket.url}/photos", "--rtt-ms", "1"]
    result = CliRunner(env=_env(s3_bucket)).invoke(cli, [*args, "--port", str(busy_port)])
    assert result.exit_code == 1, result.output
    assert f"cannot listen on 127.0.0.1:{busy_port}" in result.output
    assert "give another --port" in result.output


def test_bench_port_goes_with_rtt_ms(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "--compare", str(tmp_path), "--port", "9000"])
    assert result.exit_code == 2
    assert "--port is where the --rtt-ms proxy listens" in result.output


def test_help_names_the_port_variables() -> None:
    bench = CliRunner().invoke(cli, ["bench", "--help"], terminal_width=200)
    assert "env var: STOKER_BENCH_PORT" in bench.output
    demo = CliRunner().invoke(cli, ["demo", "--help"], terminal_width=200)
    assert "env var: STOKER_DEMO_PORT" in demo.output
    assert "env var: STOKER_DEMO_SERVER_PORT" in demo.output


def test_demo_takes_its_ports_from_the_environment(tmp_path: Path, busy_port: int) -> None:
    args = ["demo", "--files", "10", "--out", str(tmp_path / "d")]
    link = CliRunner(env={"STOKER_DEMO_PORT": str(busy_port)}).invoke(cli, args)
    assert link.exit_code == 1, link.output
    assert f"cannot listen on 127.0.0.1:{busy_port}" in link.output
    server = CliRunner(env={"STOKER_DEMO_SERVER_PORT": str(busy_port)}).invoke(cli, args)
    assert server.exit_code == 1, server.output
    assert f"cannot serve S3 on 127.0.0.1:{busy_port}" in server.output
