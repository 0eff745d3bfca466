"""Build obstore stores for S3 (and S3-compatible servers), GCS, Azure and local paths.

This is the one module of stoker that reads the environment: the S3 credential chain is
defined by the AWS variables and config files, and users expect it to be honoured.

Precedence, highest first:

1. ``StorageOptions`` given by the caller (``anonymous``, explicit keys, ``profile``);
2. ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``);
3. the profile named by ``AWS_PROFILE`` (or ``default``) in ``~/.aws/credentials`` and
   ``~/.aws/config`` (paths overridable with ``AWS_SHARED_CREDENTIALS_FILE`` and
   ``AWS_CONFIG_FILE``);
4. obstore's default chain: web identity, container and instance-metadata credentials.

The chosen source is kept as a description (never the values) so that a rejected
request can say where its credentials came from.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from stoker.errors import CredentialsError
from stoker.storage.native import native
from stoker.storage.options import StorageOptions, check_endpoint_url
from stoker.storage.url import StorageUrl

DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True, slots=True)
class NativeConfig:
    """An obstore store plus what errors should say about how it was configured."""

    # An S3Store, GCSStore, AzureStore or LocalStore of this process's obstore (their
    # classes differ in a forked child, see stoker.storage.native); None: a local folder
    # that does not exist (yet).
    store: Any
    credentials_source: str
    endpoint: str


@dataclass(frozen=True, slots=True)
class _Profile:
    name: str
    values: dict[str, str]
    files: str


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None


def _read_profile(name: str, *, required: bool) -> _Profile | None:
    cred_file = Path(_env("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials").expanduser()
    conf_file = Path(_env("AWS_CONFIG_FILE") or "~/.aws/config").expanduser()
    values: dict[str, str] = {}
    found_in: list[str] = []
    for path, section in (
        (conf_file, "default" if name == "default" else f"profile {name}"),
        (cred_file, name),
    ):
        if not path.is_file():
            continue
        parser = configparser.RawConfigParser()
        problem = None
        try:
            parser.read(path, encoding="utf-8")
        except configparser.Error as exc:
            problem = _parse_problem(exc)
        if problem is not None:
            # Never the offending text: a malformed line may hold a secret key. Raised out
            # here so that the parser's error, which quotes the line, is not its context.
            raise CredentialsError(
                f"cannot parse AWS config file {path}: {problem} "
                "(the text is not shown: it may hold a secret)"
            )
        if not parser.has_section(section) and path == conf_file and parser.has_section(name):
            section = name
        if parser.has_section(section):
            found_in.append(str(path))
            values.update({k.lower(): v.strip() for k, v in parser.items(section)})
    if not found_in:
        if required:
            raise CredentialsError(f"AWS profile {name!r} not found in {conf_file} or {cred_file}")
        return None
    return _Profile(name, values, " and ".join(found_in))


def _parse_problem(exc: configparser.Error) -> str:
    """What is wrong with a config file, and where, without quoting any of its text."""
    if isinstance(exc, configparser.MissingSectionHeaderError):
        return f"a line before any [section] header, line {exc.lineno}"
    if isinstance(exc, configparser.ParsingError):
        lines = ", ".join(str(number) for number, _ in exc.errors)
        return f"malformed line(s) {lines}"
    if isinstance(exc, configparser.DuplicateSectionError | configparser.DuplicateOptionError):
        return f"a name given twice, line {exc.lineno}"
    return type(exc).__name__


def _s3_section_value(profile: _Profile | None, key: str) -> str | None:
    # `s3 =` sub-sections in ~/.aws/config arrive as one indented text value.
    if profile is None or "s3" not in profile.values:
        return None
    for line in profile.values["s3"].splitlines():
        sub_key, _, sub_value = line.partition("=")
        if sub_key.strip().lower() == key:
            return sub_value.strip()
    return None


def _client_options(options: StorageOptions, endpoint: str | None) -> Any:
    # Any: obstore's ClientConfig TypedDict cannot be imported at run time.
    allow_http = options.allow_http
    if allow_http is None:
        allow_http = bool(endpoint and endpoint.lower().startswith("http://"))
    return {
        "allow_http": allow_http,
        "allow_invalid_certificates": not options.verify_ssl,
        "timeout": timedelta(seconds=options.timeout_s),
        "connect_timeout": timedelta(seconds=options.connect_timeout_s),
        "pool_max_idle_per_host": "512",
    }


# Our retry loop counts every attempt, so obstore's own retries are off.
_NO_RETRY: Any = {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}


def build_s3(url: StorageUrl, options: StorageOptions) -> NativeConfig:
    """Resolve credentials, endpoint and region, and build an obstore ``S3Store``."""
    profile_name = options.profile
    profile = _read_profile(profile_name, required=True) if profile_name else None
    env_keys = _env("AWS_ACCESS_KEY_ID") and _env("AWS_SECRET_ACCESS_KEY")
    if profile is None and not env_keys and options.access_key_id is None:
        profile = _read_profile(
            _env("AWS_PROFILE") or _env("AWS_DEFAULT_PROFILE") or "default",
            required=bool(_env("AWS_PROFILE")),
        )

    config, source = _credentials(options, profile, env_keys=bool(env_keys))
    endpoint = _endpoint(options, profile)
    region = (
        options.region
        or _env("AWS_REGION")
        or _env("AWS_DEFAULT_REGION")
        or (profile.values.get("region") if profile else None)
        or DEFAULT_REGION
    )
    config["region"] = region
    if endpoint:
        config["endpoint"] = endpoint.rstrip("/")
    style: str = options.addressing_style
    if style == "auto":
        style = _s3_section_value(profile, "addressing_style") or (
            "path" if endpoint else "virtual"
        )
        if style not in ("path", "virtual"):
            style = "path" if endpoint else "virtual"
    config["virtual_hosted_style_request"] = style == "virtual"
    config.update(options.extra)

    store = native().stores.S3Store(
        url.bucket,
        prefix=url.prefix or None,
        config=config,
        client_options=_client_options(options, endpoint),
        retry_config=_NO_RETRY,
    )
    shown_endpoint = endpoint or f"https://s3.{region}.amazonaws.com"
    return NativeConfig(store, source, shown_endpoint)


def _credentials(
    options: StorageOptions, profile: _Profile | None, *, env_keys: bool
) -> tuple[Any, str]:
    """obstore's S3 config with the credentials in it, and where they came from: the
    options, a named profile, the environment's keys, the default profile, or the default
    chain."""
    profile_name = options.profile
    config: Any = {}  # obstore's S3Config TypedDict, built key by key
    if options.anonymous:
        config["skip_signature"] = True
        source = "anonymous (unsigned requests)"
    elif options.access_key_id is not None:
        config["access_key_id"] = options.access_key_id
        config["secret_access_key"] = options.secret_access_key
        if options.session_token:
            config["session_token"] = options.session_token
        source = "storage_options (access_key_id/secret_access_key)"
    elif profile_name and profile is not None and "aws_access_key_id" in profile.values:
        source = _use_profile(config, profile)
    elif env_keys:
        config["access_key_id"] = _env("AWS_ACCESS_KEY_ID")
        config["secret_access_key"] = _env("AWS_SECRET_ACCESS_KEY")
        if _env("AWS_SESSION_TOKEN"):
            config["session_token"] = _env("AWS_SESSION_TOKEN")
        source = "environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
    elif profile is not None and "aws_access_key_id" in profile.values:
        source = _use_profile(config, profile)
    else:
        source = "default chain (web identity, container or instance metadata)"
    return config, source


def _endpoint(options: StorageOptions, profile: _Profile | None) -> str | None:
    """The endpoint from the options, the environment or the profile, checked; None for
    AWS's own."""
    endpoint, endpoint_from = next(
        (
            (value, where)
            for value, where in (
                (options.endpoint_url, "storage_options"),
                (_env("AWS_ENDPOINT_URL_S3"), "AWS_ENDPOINT_URL_S3"),
                (_env("AWS_ENDPOINT_URL"), "AWS_ENDPOINT_URL"),
                (_s3_section_value(profile, "endpoint_url"), "the profile's s3 section"),
                (profile.values.get("endpoint_url") if profile else None, "the profile"),
            )
            if value
        ),
        (None, ""),
    )
    if endpoint:
        try:  # obstore panics on some ("rust future panicked"): say which setting it is
            check_endpoint_url(endpoint)
        except ValueError as exc:
            raise ValueError(f"{exc}, from {endpoint_from}") from None
    return endpoint


def open_local(root: Path, *, create: bool) -> Any:
    """The obstore store of a local folder; only a write (``create``) makes a missing one."""
    if not root.is_dir():
        if not create:
            raise FileNotFoundError(f"{root}: no such folder")
        root.mkdir(parents=True, exist_ok=True)
    return native().stores.LocalStore(root)


def _use_profile(config: dict[str, Any], profile: _Profile) -> str:
    config["access_key_id"] = profile.values["aws_access_key_id"]
    config["secret_access_key"] = profile.values.get("aws_secret_access_key", "")
    if profile.values.get("aws_session_token"):
        config["session_token"] = profile.values["aws_session_token"]
    return f"profile {profile.name!r} in {profile.files}"


def build_native(url: StorageUrl, options: StorageOptions) -> NativeConfig:
    """Build the obstore store for ``url`` (any scheme but ``memory``)."""
    if url.scheme == "s3":
        return build_s3(url, options)
    if url.scheme == "file":
        root = Path(url.prefix)
        # A missing folder is created by the first write, never by opening or reading it
        # (a mistyped path given to ls, inspect or show must not appear on disk).
        local = native().stores.LocalStore(root) if root.is_dir() else None
        return NativeConfig(local, "local filesystem", str(root))
    client = _client_options(options, options.endpoint_url)
    extra: Any = dict(options.extra)  # obstore's GCSConfig / AzureConfig
    if options.anonymous:
        extra["skip_signature"] = "true"
    source = "storage_options" if options.extra else "obstore default credential chain"
    if url.scheme == "gs":
        gcs = native().stores.GCSStore(
            url.bucket,
            prefix=url.prefix or None,
            config=extra or None,
            client_options=client,
            retry_config=_NO_RETRY,
        )
        return NativeConfig(gcs, source, "https://storage.googleapis.com")
    if url.scheme == "az":
        azure = native().stores.AzureStore(
            url.bucket,
            prefix=url.prefix or None,
            config=extra or None,
            client_options=client,
            retry_config=_NO_RETRY,
        )
        return NativeConfig(azure, source, "https://*.blob.core.windows.net")
    raise ValueError(f"no native store for scheme {url.scheme!r}")
