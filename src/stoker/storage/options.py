"""Per-dataset storage options: endpoint, region, credentials, addressing, TLS, timeouts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal
from urllib.parse import urlsplit

from stoker.storage.hedge import HedgePolicy
from stoker.storage.retry import RetryPolicy
from stoker.storage.shaping import ShapingPolicy
from stoker.storage.url import redact_userinfo

AddressingStyle = Literal["auto", "path", "virtual"]

_ALIASES = {
    "endpoint": "endpoint_url",
    "aws_endpoint_url": "endpoint_url",
    "aws_region": "region",
    "region_name": "region",
    "aws_access_key_id": "access_key_id",
    "key": "access_key_id",
    "aws_secret_access_key": "secret_access_key",
    "secret": "secret_access_key",
    "aws_session_token": "session_token",
    "token": "session_token",
    "verify": "verify_ssl",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageOptions:
    """Options for opening a store; anything left unset falls back to the standard sources.

    For S3 and S3-compatible stores, unset fields fall back to the AWS variables
    (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ...), then
    to ``~/.aws/credentials`` and ``~/.aws/config``, then to the default provider chain
    (web identity, container or instance credentials).

    Attributes:
        endpoint_url: S3 endpoint of a non-AWS store (MinIO, SeaweedFS, IBM COS, R2).
        region: Signing region.
        profile: Profile to read from the AWS config files.
        access_key_id: Access key; with ``secret_access_key``.
        secret_access_key: Secret key (never printed: it is left out of ``repr``).
        session_token: Temporary-credential token.
        anonymous: Send unsigned requests (public buckets).
        addressing_style: ``"path"`` (``endpoint/bucket/key``), ``"virtual"``
            (``bucket.endpoint/key``) or ``"auto"`` (virtual for AWS, path for a custom
            endpoint).
        allow_http: Allow plain-HTTP endpoints; None allows it when ``endpoint_url`` starts
            with ``http://``.
        verify_ssl: Verify TLS certificates.
        timeout_s: Limit for one whole request.
        connect_timeout_s: Limit for opening a connection.
        part_size_bytes: Part size of ranged downloads and multipart uploads.
        multipart_threshold_bytes: Objects at least this large are uploaded in parts and
            downloaded as concurrent ranged GETs.
        retry: Retry policy.
        max_requests_per_s: Most requests per second to send to one prefix of the store
            (``stoker.storage.shaping`` says what a prefix is), shared by every store of
            the process; None: no fixed cap (the rate still adapts to throttling).
        shaping: How the request rate of a prefix adapts to throttling (503 SlowDown, 429).
        hedge: When a slow ranged GET of a remote store gets a second, identical request
            (:mod:`stoker.storage.hedge`); None: never.
        extra: Further obstore configuration keys, passed through unchanged (for GCS and
            Azure, e.g. ``{"google_service_account": "/path/key.json"}``).
    """

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    anonymous: bool = False
    addressing_style: AddressingStyle = "auto"
    allow_http: bool | None = None
    verify_ssl: bool = True
    timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    part_size_bytes: int = 8 * 1024 * 1024
    multipart_threshold_bytes: int = 32 * 1024 * 1024
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_requests_per_s: float | None = None
    shaping: ShapingPolicy = field(default_factory=ShapingPolicy)
    hedge: HedgePolicy | None = None
    extra: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        # The dataclass repr, less secrets: an endpoint's user:password@ shows as ***@.
        shown = []
        for f in fields(self):
            if f.repr:
                value = getattr(self, f.name)
                if f.name == "endpoint_url" and value is not None:
                    value = redact_userinfo(value)
                shown.append(f"{f.name}={value!r}")
        return f"StorageOptions({', '.join(shown)})"

    def __post_init__(self) -> None:
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ValueError(
                f"addressing_style must be 'auto', 'path' or 'virtual', "
                f"got {self.addressing_style!r}"
            )
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("give access_key_id and secret_access_key together")
        if self.part_size_bytes < 5 * 1024 * 1024:
            raise ValueError(f"part_size_bytes must be >= 5 MiB, got {self.part_size_bytes}")
        if self.multipart_threshold_bytes < self.part_size_bytes:
            raise ValueError("multipart_threshold_bytes must be >= part_size_bytes")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("timeouts must be > 0")
        rate = self.max_requests_per_s
        if rate is not None and not (0 < rate < math.inf):
            raise ValueError(f"max_requests_per_s must be a finite number > 0, got {rate}")
        if self.endpoint_url is not None:
            check_endpoint_url(self.endpoint_url)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | StorageOptions | None) -> StorageOptions:
        """Build options from a plain dict (``storage_options={...}``), checking the keys.

        Accepts boto3/fsspec spellings too (``aws_access_key_id``, ``endpoint``,
        ``region_name``, ...). ``None`` gives the defaults.

        Raises:
            TypeError: ``options`` is not a mapping.
            ValueError: An unknown key, or a value out of range.
        """
        if options is None:
            return cls()
        if isinstance(options, StorageOptions):
            return options
        if not isinstance(options, Mapping):
            raise TypeError(
                f"storage_options must be a mapping (a dict) or StorageOptions, got {options!r}"
            )
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in options.items():
            name = _ALIASES.get(key.lower(), key.lower())
            if name not in known:
                raise ValueError(
                    f"unknown storage option {key!r}; known options: {sorted(known)} "
                    f"(put store-specific obstore keys under 'extra')"
                )
            values[name] = value
        if isinstance(values.get("retry"), Mapping):
            values["retry"] = RetryPolicy(**values["retry"])
        if isinstance(values.get("shaping"), Mapping):
            values["shaping"] = ShapingPolicy(**values["shaping"])
        if isinstance(values.get("hedge"), Mapping):
            values["hedge"] = HedgePolicy(**values["hedge"])
        return cls(**values)


def check_endpoint_url(url: str) -> None:
    """Refuse an endpoint no request can go to, naming it: not http(s), no host, a bad
    port, a query, a fragment or a space (obstore panics on some: "rust future panicked").
    A ``user:password@`` in it is not shown.

    Raises:
        ValueError: Such an endpoint.
    """
    problem = None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises on a port that is not a number in 0..65535
    except ValueError as exc:
        problem = str(exc)
    else:
        if parts.scheme.lower() not in ("http", "https"):
            problem = "not http:// or https://"
        elif not parts.hostname:
            problem = "no host"
        elif parts.query or parts.fragment or "?" in url or "#" in url:
            problem = "a query or fragment"
        elif not url.isprintable() or any(c.isspace() for c in url):
            problem = "a space or control character"
    if problem is not None:
        raise ValueError(
            f"endpoint_url must be a URL such as https://host:port, got "
            f"{redact_userinfo(url)!r} ({problem})"
        )
