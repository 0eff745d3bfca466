"""Credentials never appear in logs, error messages, ``--json`` output or reprs.

Two canaries: a wrong secret (and session token) that the server rejects, and the test
server's real secret, which works. Each is driven through the CLI (debug logging on, every
command's ``--json`` form) and through the library (reprs, errors and their chained causes,
tracebacks), and searched for in everything that comes out, logs included.
"""

from __future__ import annotations

import logging
import secrets
import traceback
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from stoker.cli.main import cli
from stoker.errors import CredentialsError, StokerError
from stoker.format.reader import open_dataset
from stoker.storage import StorageOptions, open_store
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import SECRET_KEY

CANARY = f"CANARY-secret-{secrets.token_hex(8)}"
CANARY_TOKEN = f"CANARY-token-{secrets.token_hex(8)}"


def _everything(result: Result, caplog: pytest.LogCaptureFixture) -> str:
    parts = [result.output, result.stderr if result.stderr_bytes is not None else ""]
    if result.exc_info is not None and not isinstance(result.exception, SystemExit):
        parts.append("".join(traceback.format_exception(*result.exc_info)))
    for record in caplog.records:  # the formatted message and the raw arguments
        parts += [record.getMessage(), repr(record.args), record.exc_text or ""]
    return "\n".join(parts)


def _error_text(exc: BaseException) -> str:
    """The error, everything chained to it, and its traceback."""
    parts = ["".join(traceback.format_exception(exc))]
    while exc is not None:
        parts += [str(exc), repr(exc)]
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return "\n".join(parts)


def _env(s3_bucket: Any, secret: str, token: str | None = None) -> dict[str, str]:
    options = s3_bucket.options()
    env = {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": "us-east-1",
        "AWS_PROFILE": "",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_CONFIG_FILE": "/nonexistent",
    }
    if token is not None:
        env["AWS_SESSION_TOKEN"] = token
    return env


def test_cli_with_a_wrong_secret_never_shows_it(
    s3_bucket: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    write_image_folder(tmp_path / "src", files=4, classes=2)
    runner = CliRunner(env=_env(s3_bucket, CANARY, CANARY_TOKEN))
    url = f"{s3_bucket.url}/data"
    commands = [
        ["-vv", "ls", "--json", url],
        ["-vv", "ls", "-r", "--json", url],
        ["-vv", "download", "--json", url, str(tmp_path / "dst")],
        ["-vv", "upload", "--json", str(tmp_path / "src"), url],
        ["-vv", "pack", "--json", str(tmp_path / "src"), url],
        ["-vv", "inspect", "--json", url],
        ["-vv", "verify", "--json", url],
    ]
    for command in commands:
        caplog.clear()
        result = runner.invoke(cli, command)
        assert result.exit_code != 0, command  # the server refused the canary
        text = _everything(result, caplog)
        assert CANARY not in text, command
        assert CANARY_TOKEN not in text, command
    # The refusal still says where the credentials came from.
    result = runner.invoke(cli, ["ls", url])
    assert "credentials came from environment" in result.output


def test_cli_with_the_right_secret_never_shows_it(
    s3_bucket: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    write_image_folder(tmp_path / "src", files=6, classes=2)
    runner = CliRunner(env=_env(s3_bucket, SECRET_KEY))
    url = f"{s3_bucket.url}"
    commands = [
        ["-vv", "upload", "--json", str(tmp_path / "src"), f"{url}/raw"],
        ["-vv", "ls", "-r", "--json", f"{url}/raw"],
        ["-vv", "download", "--json", f"{url}/raw", str(tmp_path / "dst")],
        ["-vv", "pack", "--json", f"{url}/raw", f"{url}/packed"],
        ["-vv", "inspect", "--json", f"{url}/packed"],
        ["-vv", "verify", "--json", f"{url}/packed"],
    ]
    logged = 0
    for command in commands:
        caplog.clear()
        result = runner.invoke(cli, command)
        assert result.exit_code == 0, (command, result.output)
        assert SECRET_KEY not in _everything(result, caplog), command
        logged += len(caplog.records)
    assert logged > 0  # the logs were captured, so their absence of the secret means something
    # Nothing written to the bucket carries it either (the manifest records the pack).
    store = s3_bucket.store()
    for meta in store.list("packed"):
        assert SECRET_KEY.encode() not in bytes(store.get(meta.key)), meta.key


def test_library_reprs_never_show_secrets() -> None:
    options = StorageOptions(
        endpoint_url="http://127.0.0.1:9",
        access_key_id="AKIDEXAMPLE",
        secret_access_key=CANARY,
        session_token=CANARY_TOKEN,
    )
    mapped = StorageOptions.from_mapping(
        {"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": CANARY, "token": CANARY}
    )
    extra = StorageOptions(extra={"google_service_account_key": CANARY})
    store = open_store("s3://bucket/prefix", storage_options=options)
    shown_all = (repr(options), str(options), repr(mapped), repr(extra), repr(store), store.url)
    for shown in shown_all:
        assert CANARY not in shown
        assert CANARY_TOKEN not in shown
    assert "AKIDEXAMPLE" in repr(options)  # the key id is not a secret; it helps debugging


def test_option_errors_never_show_secrets() -> None:
    attempts = [
        (lambda: StorageOptions(secret_access_key=CANARY), "together"),  # no key id
        (lambda: StorageOptions.from_mapping({"secret_key": CANARY}), "unknown storage option"),
        (
            lambda: StorageOptions.from_mapping(
                {"key": "AKID", "secret": CANARY, "endpoint": "not a url"}
            ),
            "endpoint_url must be a URL",
        ),
    ]
    for attempt, message in attempts:
        with pytest.raises(ValueError, match=message) as caught:
            attempt()
        assert CANARY not in _error_text(caught.value)


def test_library_errors_with_a_wrong_secret_never_show_it(
    s3_bucket: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    options = s3_bucket.options(secret_access_key=CANARY, session_token=CANARY_TOKEN)
    store = open_store(s3_bucket.url, storage_options=options)
    failures: list[BaseException] = []
    for attempt in (
        lambda: store.get("anything"),
        lambda: store.put("anything", b"x"),
        lambda: list(store.list("")),
        lambda: open_dataset(s3_bucket.url, storage_options=options),
    ):
        with pytest.raises(StokerError) as caught:
            attempt()
        failures.append(caught.value)
    assert isinstance(failures[0], CredentialsError)
    for failure in failures:
        text = _error_text(failure)
        assert CANARY not in text
        assert CANARY_TOKEN not in text
    logged = "\n".join(r.getMessage() + repr(r.args) for r in caplog.records)
    assert CANARY not in logged
    assert CANARY_TOKEN not in logged


def _every_url_command(url: str, tmp_path: Path) -> list[list[str]]:
    """Every command that opens a store at ``url`` (each fails before reading anything)."""
    (tmp_path / "src" / "a").mkdir(parents=True, exist_ok=True)
    (tmp_path / "src" / "a" / "x.jpg").write_bytes(b"not read")
    return [
        ["ls", url],
        ["ls", "-r", "--json", url],
        ["download", "--json", url, str(tmp_path / "dst")],
        ["upload", "--json", str(tmp_path / "src"), url],
        ["pack", "--json", str(tmp_path / "src"), url],
        ["inspect", "--json", url],
        ["verify", "--json", url],
        ["index", url],
        ["show", url, "--out", str(tmp_path / "grid.png")],
        ["bench", url, "--batches", "1"],
        ["doctor", url, "--seconds", "1", "--out", str(tmp_path / "doctor")],
        ["rm", "--yes", url],
    ]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        # A broken section header, then the secret on a line without '='.
        ("[default]\naws_access_key_id = A\n[broken\naws_secret_access_key {secret}\n", "3, 4"),
        # The secret before any section header.
        ("aws_secret_access_key = {secret}\n[default]\n", "line 1"),
    ],
)
def test_a_malformed_credentials_file_is_named_never_quoted(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    text: str,
    where: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    credentials = tmp_path / "credentials"
    credentials.write_text(text.format(secret=CANARY), encoding="utf-8")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    for command in _every_url_command("s3://bucket/ds", tmp_path):
        caplog.clear()
        result = CliRunner().invoke(cli, ["-vv", *command])
        assert result.exit_code != 0, command
        everything = _everything(result, caplog)
        assert CANARY not in everything, command
        assert str(credentials) in everything, command
        assert where in everything, command
    with pytest.raises(CredentialsError) as caught:
        open_store("s3://bucket/").list_dir("")
    assert CANARY not in _error_text(caught.value)


def test_a_password_in_the_endpoint_url_is_never_shown(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    endpoint = f"http://user:{CANARY}@127.0.0.1:9"  # nothing listens on the discard port
    env = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_REGION": "us-east-1"}
    for command in _every_url_command("s3://bucket/ds", tmp_path):
        caplog.clear()
        result = CliRunner().invoke(cli, ["-vv", "--endpoint-url", endpoint, *command], env=env)
        assert result.exit_code != 0, command
        everything = _everything(result, caplog)
        assert CANARY not in everything, command
        assert "http://***@127.0.0.1:9" in everything, command  # the endpoint is still named
    options = StorageOptions(endpoint_url=endpoint, access_key_id="a", secret_access_key="b")
    assert CANARY not in repr(options)
    assert CANARY not in repr(open_store("s3://bucket/", storage_options=options))
