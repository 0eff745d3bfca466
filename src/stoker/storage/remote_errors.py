"""What a failed request of an :class:`~stoker.storage.remote.ObstoreStore` means, in
stoker's exception tree, with the object's URL, the endpoint and the credentials' source in
the message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stoker.errors import (
    BucketNotFoundError,
    CredentialsError,
    EndpointError,
    ObjectNotFoundError,
    RetriesExhaustedError,
    StorageError,
)
from stoker.storage.retry import RETRYABLE, classify, error_code, summarise_error
from stoker.storage.url import StorageUrl


class RangeBeyondEnd(Exception):
    """A ranged GET past the object's end. Not retried and not mapped: the caller turns it
    into ValueError (or a plain GET)."""

    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


def is_unsatisfiable_range(exc: Exception) -> bool:
    text = str(exc)
    if "Requested range was invalid" in text:  # obstore's local filesystem
        return True
    return "416" in text and ("Range Not Satisfiable" in text or "InvalidRange" in text)


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorMapper:
    """Maps obstore's exceptions for one store."""

    url: StorageUrl
    endpoint: str  # never with a password
    source: str  # where the credentials came from
    timeout_s: float
    folder_missing: Callable[[], bool]  # a local folder that does not exist

    def map(self, exc: Exception, op: str, path: str) -> Exception:
        """The stoker exception for ``exc``, raised by ``op`` of ``path``."""
        where = self.url.child(path) if path else str(self.url)
        kind = classify(exc)
        text = str(exc)
        code = error_code(text)
        verb = op.upper()
        if kind == "not_found":
            if code == "NoSuchBucket" or "NoSuchBucket" in text:
                return BucketNotFoundError(
                    f"{where}: bucket {self.url.bucket!r} does not exist at {self.endpoint}"
                )
            if self.folder_missing():
                return BucketNotFoundError(f"{where}: folder {self.url.prefix} does not exist")
            return ObjectNotFoundError(f"{where}: no such object")
        if kind == "auth":
            reason = code or "access denied"
            return CredentialsError(
                f"{verb} {where} was refused ({reason}); credentials came from "
                f"{self.source}, endpoint {self.endpoint}"
            )
        if kind == "connect":
            return EndpointError(
                f"cannot reach {self.endpoint} for {verb} {where} ({kind}, gave up after retrying)"
            )
        if kind == "reset" and "error sending request" in text:
            # No response at all, every time: a proxy or load balancer with nothing behind it.
            return EndpointError(
                f"{self.endpoint} closed the connection before answering {verb} {where} "
                f"(gave up after retrying)"
            )
        if kind == "timeout":
            return EndpointError(
                f"{verb} {where}: no complete response from {self.endpoint} within "
                f"timeout_s={self.timeout_s:g} (gave up after retrying)"
            )
        summary = summarise_error(text)
        if kind in RETRYABLE:
            return RetriesExhaustedError(f"{verb} {where}: gave up after retries: {summary}")
        return StorageError(f"{verb} {where} failed: {summary}")
