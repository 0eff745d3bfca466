"""stoker: keep accelerators fed with training data that lives in object storage."""

from stoker.errors import (
    CorruptShardError,
    CredentialsError,
    EndpointError,
    ObjectNotFoundError,
    RetriesExhaustedError,
    ShardFormatError,
    SourceError,
    StokerError,
    StorageError,
    TransferError,
)
from stoker.format.reader import ShardDataset, open_dataset
from stoker.pack.packer import PackConfig, PackReport, pack
from stoker.pack.reencode import ImagePolicy
from stoker.pipeline import transforms
from stoker.pipeline.loader import Loader
from stoker.pipeline.mixing import MixConfig
from stoker.pipeline.stats import LoaderStats
from stoker.pipeline.windows import WindowConfig
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
    "CorruptShardError",
    "CredentialsError",
    "EndpointError",
    "ImagePolicy",
    "Loader",
    "LoaderStats",
    "MemoryStore",
    "MixConfig",
    "ObjectMeta",
    "ObjectNotFoundError",
    "PackConfig",
    "PackReport",
    "RetriesExhaustedError",
    "RetryPolicy",
    "ShardDataset",
    "ShardFormatError",
    "SourceError",
    "StokerError",
    "StorageError",
    "StorageOptions",
    "Store",
    "TransferConfig",
    "TransferError",
    "TransferReport",
    "WindowConfig",
    "download",
    "open_dataset",
    "open_store",
    "pack",
    "transforms",
    "upload",
]
