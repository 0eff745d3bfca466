"""Parse storage URLs: ``s3://bucket/prefix``, ``gs://``, ``az://``, ``file://``, ``memory://``
and plain local paths."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

Scheme = Literal["s3", "gs", "az", "file", "memory"]

_ALIASES: dict[str, Scheme] = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gs",
    "gcs": "gs",
    "az": "az",
    "azure": "az",
    "abfs": "az",
    "file": "file",
    "memory": "memory",
}


@dataclass(frozen=True, slots=True)
class StorageUrl:
    """A parsed storage URL.

    Attributes:
        scheme: Canonical scheme.
        bucket: Bucket or container name; empty for local paths; the name for ``memory://``.
        prefix: Key prefix inside the bucket (no leading or trailing ``/``), or, for local
            paths, the absolute directory.
    """

    scheme: Scheme
    bucket: str
    prefix: str

    def __str__(self) -> str:
        if self.scheme == "file":
            return self.prefix
        tail = f"/{self.prefix}" if self.prefix else ""
        return f"{self.scheme}://{self.bucket}{tail}"

    def child(self, key: str) -> str:
        """The URL of ``key`` under this URL, for messages."""
        return f"{str(self).rstrip('/')}/{key}"

    def contains(self, other: StorageUrl) -> bool:
        """Whether ``other`` is this location or lies under it: the same bucket and a key
        prefix inside this one's, or a local path inside this folder."""
        if (self.scheme, self.bucket) != (other.scheme, other.bucket):
            return False
        if self.scheme == "file":
            return Path(other.prefix).is_relative_to(Path(self.prefix))
        inside = other.prefix == self.prefix or other.prefix.startswith(f"{self.prefix}/")
        return not self.prefix or inside


def parse_url(url: str | os.PathLike[str]) -> StorageUrl:
    """Parse ``url`` into scheme, bucket and prefix.

    Everything after ``SCHEME://BUCKET/`` is the key prefix, literally: ``#``, ``?``, ``%``,
    spaces and every other character are part of the key (S3 keys may hold any of them), so
    ``s3://b/data#x`` names the prefix ``data#x`` and ``s3://b/a%23b`` the prefix ``a%23b``,
    never ``data`` or ``a#b``. Nothing is percent-decoded, and a URL is never shortened.
    Plain paths (absolute or relative) and ``file://`` URLs become local paths, read the same
    literal way (``file://`` removed) and resolved to absolute form.

    Raises:
        ValueError: Unknown scheme, a bucket URL without a bucket name, a bucket name with a
            character no bucket name has (``#``, ``?``, ``%``, a space or a control
            character), a prefix with an empty, ``.`` or ``..`` segment or a control
            character, or credentials in the URL.
    """
    text = os.fspath(url)
    if "://" not in text:
        return StorageUrl("file", "", str(Path(text).expanduser().resolve()))
    given, _, rest = text.partition("://")
    scheme = _ALIASES.get(given.lower())
    if scheme is None:
        raise ValueError(
            f"unsupported URL scheme {given!r} in {text!r}; "
            f"use one of {sorted(set(_ALIASES.values()))} or a local path"
        )
    if scheme == "file":
        return StorageUrl("file", "", str(Path(rest).resolve()))
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket:
        raise ValueError("credentials do not belong in a storage URL; use storage_options")
    if not bucket:
        raise ValueError(f"{text!r} names no bucket; expected {scheme}://BUCKET[/PREFIX]")
    odd = next((c for c in bucket if c in "#?%" or c.isspace() or not c.isprintable()), None)
    if odd is not None:
        raise ValueError(
            f"{text!r}: bucket name {bucket!r} holds {odd!r}, which no bucket name has; "
            f"expected {scheme}://BUCKET[/PREFIX]"
        )
    prefix = prefix.strip("/")
    problem = key_problem(prefix) if prefix and scheme != "memory" else None
    if problem is not None:  # obstore's own words were "Could not parse path: ..."
        raise ValueError(
            f"{text!r}: the prefix {prefix!r} cannot be addressed in an object store "
            f"({problem}); write it without '//', '.' or '..' segments"
        )
    return StorageUrl(scheme, bucket, prefix)


def key_problem(key: str) -> str | None:
    """Why an object key cannot be used as a relative path, or None if it can.

    Such a key (a listing may hold one: S3 takes any bytes) is never written to a local
    file, and obstore cannot address it; commands name it as a failure and go on.
    """
    if not key:
        return "empty key"
    if any("\ud800" <= c <= "\udfff" for c in key):  # bytes a listing could not decode
        return "bytes that are not UTF-8"
    control = next((c for c in key if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if control is not None:
        return f"control character {control!r}"
    for part in key.split("/"):
        if part in ("", ".", ".."):
            return f"{part!r} segment" if part else "empty segment (leading, trailing or //)"
    return None


def redact_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` before its host shown as ``***@``, for messages.

    An endpoint may carry credentials (``http://user:PW@host:8333``); nothing stoker prints
    may show them.
    """
    if not url or "@" not in url:
        return url
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"***@{host}").geturl()
