"""The stoker exception tree.

Every error stoker raises on purpose is a :class:`StokerError`. Where a builtin already says
what went wrong, the error also derives from it, so ``except FileNotFoundError`` and
``except PermissionError`` work as callers expect.
"""

from __future__ import annotations


class StokerError(Exception):
    """Base class of every error raised by stoker."""


class StorageError(StokerError):
    """An object-store request failed."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object, bucket or local file does not exist."""


class BucketNotFoundError(ObjectNotFoundError):
    """The bucket (or, for a local path, the folder) itself does not exist; the message
    names it."""


class CredentialsError(StorageError, PermissionError):
    """The store rejected the credentials (missing, wrong or without permission).

    The message names where the credentials came from, never their values.
    """


class EndpointError(StorageError, ConnectionError):
    """The store's endpoint could not be reached."""


class RetriesExhaustedError(StorageError):
    """A request kept failing with retryable errors until the retry budget ran out."""


class ListingStalledError(StorageError):
    """A listing made no progress: the server paged in a loop, or sent no new keys within
    the listing's deadline. The message names the listing and what the server did."""


class TransferError(StokerError):
    """Some objects of a download or upload failed; ``failures`` lists them."""

    def __init__(self, message: str, failures: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.failures = failures


class ShardFormatError(StokerError, ValueError):
    """A shard or index does not follow the format (docs/FORMAT.md)."""


class CorruptShardError(ShardFormatError):
    """A shard's bytes do not match the checksums in the index."""


class SourceError(StokerError):
    """An input to ``pack`` is unreadable or invalid; the message names the file or record."""


class SkipBudgetError(StokerError):
    """More samples of an epoch were skipped than ``DecodeConfig(max_skipped=...)`` allows.

    The message gives the count, the budget and the first few keys with their reasons;
    ``skipped`` lists every ``(key, reason)`` of the epoch that this process saw (a
    resumed run counts the samples skipped before its resume point, but lists only its
    own: the skipped file holds them all).
    """

    def __init__(self, message: str, skipped: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.skipped = list(skipped or [])

    def __reduce__(self) -> tuple[type[SkipBudgetError], tuple[str, list[tuple[str, str]]]]:
        return type(self), (str(self), self.skipped)
