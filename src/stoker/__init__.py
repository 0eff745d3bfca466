"""stoker: keep accelerators fed with training data that lives in object storage.

Every public name below is importable from here (``from stoker import Loader``,
``stoker.pack``), but each is imported only when first used: ``import stoker`` alone loads
nothing else, and a training process that makes a Loader never imports the packer, the
command line or the transfer tools.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what mypy and IDEs see; at run time __getattr__ imports on first use
    from stoker import transforms
    from stoker.core.metrics import Stage
    from stoker.errors import (
        CorruptShardError,
        CredentialsError,
        EndpointError,
        ListingStalledError,
        ObjectNotFoundError,
        RetriesExhaustedError,
        ShardFormatError,
        SkipBudgetError,
        SourceError,
        StokerError,
        StorageError,
        TransferError,
    )
    from stoker.format.audio import AudioDecoder
    from stoker.format.reader import ShardDataset, open_dataset
    from stoker.pack.packer import PackConfig, PackReport, pack
    from stoker.pack.reencode import ImagePolicy
    from stoker.pack.tokens import TokenPackConfig, TokenPackReport, pack_tokens
    from stoker.pipeline.autotune import AutotuneConfig
    from stoker.pipeline.clips import VideoConfig
    from stoker.pipeline.config import CacheConfig, DecodeConfig, LoaderOptions, SourceConfig
    from stoker.pipeline.fields import FieldsConfig
    from stoker.pipeline.loader import Loader
    from stoker.pipeline.mixing import MixConfig
    from stoker.pipeline.order import OrderConfig
    from stoker.pipeline.stats import LoaderStats
    from stoker.pipeline.token_batcher import TokenConfig
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

#: Where each public name lives: the module imported when the name is first used.
_EXPORTS: dict[str, str] = {
    "AudioDecoder": "stoker.format.audio",
    "AutotuneConfig": "stoker.pipeline.autotune",
    "CacheConfig": "stoker.pipeline.config",
    "CorruptShardError": "stoker.errors",
    "CredentialsError": "stoker.errors",
    "DecodeConfig": "stoker.pipeline.config",
    "EndpointError": "stoker.errors",
    "FieldsConfig": "stoker.pipeline.fields",
    "ImagePolicy": "stoker.pack.reencode",
    "ListingStalledError": "stoker.errors",
    "Loader": "stoker.pipeline.loader",
    "LoaderOptions": "stoker.pipeline.config",
    "LoaderStats": "stoker.pipeline.stats",
    "MemoryStore": "stoker.storage",
    "MixConfig": "stoker.pipeline.mixing",
    "ObjectMeta": "stoker.storage",
    "ObjectNotFoundError": "stoker.errors",
    "OrderConfig": "stoker.pipeline.order",
    "PackConfig": "stoker.pack.packer",
    "PackReport": "stoker.pack.packer",
    "RetriesExhaustedError": "stoker.errors",
    "RetryPolicy": "stoker.storage",
    "ShardDataset": "stoker.format.reader",
    "ShardFormatError": "stoker.errors",
    "SkipBudgetError": "stoker.errors",
    "SourceConfig": "stoker.pipeline.config",
    "SourceError": "stoker.errors",
    "Stage": "stoker.core.metrics",
    "StokerError": "stoker.errors",
    "StorageError": "stoker.errors",
    "StorageOptions": "stoker.storage",
    "Store": "stoker.storage",
    "TokenConfig": "stoker.pipeline.token_batcher",
    "TokenLoader": "stoker.pipeline.token_loader",
    "TokenPackConfig": "stoker.pack.tokens",
    "TokenPackReport": "stoker.pack.tokens",
    "TransferConfig": "stoker.storage.transfer",
    "TransferError": "stoker.errors",
    "TransferReport": "stoker.storage.transfer",
    "VideoConfig": "stoker.pipeline.clips",
    "WindowConfig": "stoker.pipeline.windows",
    "World": "stoker.pipeline.world",
    "download": "stoker.storage.transfer",
    "open_dataset": "stoker.format.reader",
    "open_store": "stoker.storage",
    "pack": "stoker.pack",  # the package, callable as pack() (see stoker/pack/__init__.py)
    "pack_tokens": "stoker.pack.tokens",
    "transforms": "stoker.transforms",  # a module: the name is the module itself
    "upload": "stoker.storage.transfer",
}

__all__ = [
    "AudioDecoder",
    "AutotuneConfig",
    "CacheConfig",
    "CorruptShardError",
    "CredentialsError",
    "DecodeConfig",
    "EndpointError",
    "FieldsConfig",
    "ImagePolicy",
    "ListingStalledError",
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
    "SkipBudgetError",
    "SourceConfig",
    "SourceError",
    "Stage",
    "StokerError",
    "StorageError",
    "StorageOptions",
    "Store",
    "TokenConfig",
    "TokenLoader",
    "TokenPackConfig",
    "TokenPackReport",
    "TransferConfig",
    "TransferError",
    "TransferReport",
    "VideoConfig",
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


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562) and keep the name here."""
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'stoker' has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if where == f"stoker.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
