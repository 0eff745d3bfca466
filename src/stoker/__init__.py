"""stoker: keep accelerators fed with training data that lives in object storage."""

from stoker.errors import (
    CredentialsError,
    EndpointError,
    ObjectNotFoundError,
    RetriesExhaustedError,
    StokerError,
    StorageError,
    TransferError,
)
from stoker.storage import (
    MemoryStore,
    ObjectMeta,
    RetryPolicy,
    StorageOptions,
    Store,
    open_store,
)
from stoker.storage.transfer import TransferConfig, TransferReport, download, upload

__version__ = "0.1.0"

__all__ = [
    "CredentialsError",
    "EndpointError",
    "MemoryStore",
    "ObjectMeta",
    "ObjectNotFoundError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "StokerError",
    "StorageError",
    "StorageOptions",
    "Store",
    "TransferConfig",
    "TransferError",
    "TransferReport",
    "download",
    "open_store",
    "upload",
]
