"""Storage options, URL parsing and the S3 credential chain (no network needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.errors import CredentialsError
from stoker.storage import StorageOptions, open_store, parse_url
from stoker.storage.s3 import build_s3

AWS_VARS = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
]


@pytest.fixture(autouse=True)
def clean_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))


@pytest.mark.parametrize(
    ("url", "scheme", "bucket", "prefix"),
    [
        ("s3://bucket/a/b/", "s3", "bucket", "a/b"),
        ("s3a://bucket", "s3", "bucket", ""),
        ("gs://b/p", "gs", "b", "p"),
        ("az://container/x", "az", "container", "x"),
        ("memory://name", "memory", "name", ""),
    ],
)
def test_parse_url(url: str, scheme: str, bucket: str, prefix: str) -> None:
    parsed = parse_url(url)
    assert (parsed.scheme, parsed.bucket, parsed.prefix) == (scheme, bucket, prefix)


def test_parse_local_paths(tmp_path: Path) -> None:
    assert parse_url(str(tmp_path)).prefix == str(tmp_path)
    assert parse_url(f"file://{tmp_path}").prefix == str(tmp_path)
    assert parse_url(tmp_path).scheme == "file"


def test_parse_url_errors() -> None:
    with pytest.raises(ValueError, match="unsupported URL scheme 'ftp'"):
        parse_url("ftp://x/y")
    with pytest.raises(ValueError, match="names no bucket"):
        parse_url("s3:///key")
    with pytest.raises(ValueError, match="credentials do not belong"):
        parse_url("s3://key:secret@bucket/x")


def test_options_from_mapping_accepts_boto_spellings() -> None:
    options = StorageOptions.from_mapping(
        {
            "aws_access_key_id": "AK",
            "aws_secret_access_key": "SK",
            "region_name": "eu-west-1",
            "endpoint": "http://127.0.0.1:1",
            "retry": {"max_attempts": 2},
        }
    )
    assert options.access_key_id == "AK"
    assert options.region == "eu-west-1"
    assert options.endpoint_url == "http://127.0.0.1:1"
    assert options.retry.max_attempts == 2


def test_options_reject_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ValueError, match="unknown storage option 'endpont_url'"):
        StorageOptions.from_mapping({"endpont_url": "http://x"})
    with pytest.raises(ValueError, match="together"):
        StorageOptions(access_key_id="AK")
    with pytest.raises(ValueError, match="addressing_style"):
        StorageOptions(addressing_style="sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="endpoint_url must be a URL"):
        StorageOptions(endpoint_url="localhost:9000")


def test_secrets_are_not_in_reprs() -> None:
    options = StorageOptions(
        access_key_id="AK", secret_access_key="CANARY-SECRET", session_token="CANARY-TOKEN"
    )
    assert "CANARY" not in repr(options)
    store = open_store("s3://bucket", storage_options=options)
    assert "CANARY" not in repr(store)


def _source(**options: object) -> str:
    return build_s3(parse_url("s3://bucket"), StorageOptions(**options)).credentials_source  # type: ignore[arg-type]


def test_chain_explicit_keys_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENV")
    assert _source(access_key_id="A", secret_access_key="B").startswith("storage_options")


def test_chain_environment_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENV")
    assert _source().startswith("environment")


def test_chain_profile_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "credentials").write_text(
        "[default]\naws_access_key_id = D\naws_secret_access_key = D\n"
        "[work]\naws_access_key_id = W\naws_secret_access_key = W\n"
    )
    (tmp_path / "config").write_text(
        "[profile work]\nregion = eu-central-1\nendpoint_url = http://127.0.0.1:9\n"
        "s3 =\n  addressing_style = virtual\n"
    )
    assert _source() == f"profile 'default' in {tmp_path / 'credentials'}"
    native = build_s3(parse_url("s3://bucket"), StorageOptions(profile="work"))
    assert "profile 'work'" in native.credentials_source
    assert native.endpoint == "http://127.0.0.1:9"
    monkeypatch.setenv("AWS_PROFILE", "work")
    assert "profile 'work'" in _source()
    # Keys in the environment outrank AWS_PROFILE, as in the AWS CLI.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENV")
    assert _source().startswith("environment")
    # ... but not an explicitly chosen profile.
    assert "profile 'work'" in _source(profile="work")


def test_chain_missing_profile_is_an_error() -> None:
    with pytest.raises(CredentialsError, match="profile 'nope' not found"):
        _source(profile="nope")


def test_chain_anonymous_and_default() -> None:
    assert _source(anonymous=True).startswith("anonymous")
    assert _source().startswith("default chain")


def test_endpoint_and_region_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    native = build_s3(parse_url("s3://bucket"), StorageOptions())
    assert native.endpoint == "http://127.0.0.1:8333"
    native = build_s3(parse_url("s3://bucket"), StorageOptions())
    assert native.endpoint == "http://127.0.0.1:8333"
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert build_s3(parse_url("s3://b"), StorageOptions()).endpoint == (
        "https://s3.ap-south-1.amazonaws.com"
    )


def test_memory_url_opens_a_shared_store() -> None:
    first = open_store("memory://shared-test")
    first.put("k", b"v")
    assert bytes(open_store("memory://shared-test").get("k")) == b"v"
    with pytest.raises(ValueError, match="name only"):
        open_store("memory://shared-test/prefix")
