"""stoker: keep accelerators fed with training data that lives in object storage."""

from stoker import transforms
from stoker.core.metrics import Stage
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
from stoker.pack.tokens import TokenPackConfig, TokenPackReport, pack_tokens
from stoker.pipeline.autotune import AutotuneConfig
from stoker.pipeline.config import CacheConfig, DecodeConfig, LoaderOptions, SourceConfig
from stoker.pipeline.fields import FieldsConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.mixing import MixConfig
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.stats import LoaderStats
from stoker.pipeline.token_loader import TokenLoader
from stoker.pipeline.windows import WindowConfig
from stoker.pipeline.world import World
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
    "AutotuneConfig",
    "CacheConfig",
    "CorruptShardError",
    "CredentialsError",
    "DecodeConfig",
    "EndpointError",
    "FieldsConfig",
    "ImagePolicy",
    "Loader",
    "LoaderOptions",
    "LoaderStats",
    "MemoryStore",
    "MixConfig",
    "ObjectMeta",
    "ObjectNotFoundError",
    "OrderConfig",
    "PackConfig",
    "PackReport",
    "RetriesExhaustedError",
    "RetryPolicy",
    "ShardDataset",
    "ShardFormatError",
    "SourceConfig",
    "SourceError",
    "Stage",
    "StokerError",
    "StorageError",
    "StorageOptions",
    "Store",
    "TokenLoader",
    "TokenPackConfig",
    "TokenPackReport",
    "TransferConfig",
    "TransferError",
    "TransferReport",
    "WindowConfig",
    "World",
    "download",
    "open_dataset",
    "open_store",
    "pack",
    "pack_tokens",
    "transforms",
    "upload",
]
