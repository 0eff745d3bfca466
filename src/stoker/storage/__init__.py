"""Object storage: the Store protocol, its backends, retries and parallel transfer."""

from stoker.storage.base import Listing, ObjectMeta, Store
from stoker.storage.cache import DiskCache
from stoker.storage.cached import CachedStore
from stoker.storage.engine import IOEngine, default_engine
from stoker.storage.memory import MemoryStore
from stoker.storage.open import open_store
from stoker.storage.options import StorageOptions
from stoker.storage.remote import ObstoreStore
from stoker.storage.retry import RetryPolicy
from stoker.storage.url import StorageUrl, parse_url

__all__ = [
    "CachedStore",
    "DiskCache",
    "IOEngine",
    "Listing",
    "MemoryStore",
    "ObjectMeta",
    "ObstoreStore",
    "RetryPolicy",
    "StorageOptions",
    "StorageUrl",
    "Store",
    "default_engine",
    "open_store",
    "parse_url",
]
