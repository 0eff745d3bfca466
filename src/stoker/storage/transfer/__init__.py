"""Parallel download and upload between a store and a local directory, with resume.

Both directions keep ``workers`` files in flight on the store's I/O engine; large files move
as concurrent parts. A file is written under a temporary name beside its destination and
renamed only once complete and verified, so an interrupted run never leaves a partial file
under a final name, and a rerun skips what is already there:

* download skips a local file whose size matches and whose modification time equals the
  object's (stoker sets it after each download) or whose MD5 matches the object's ETag;
* upload skips an object whose size matches and whose ETag matches the local file's MD5.

Failed objects do not stop the others; the run ends with :class:`~stoker.errors.TransferError`
listing each of them. A full disk does stop a download: no new file is started, the partial
files are removed, and the error says so; so does a store that has throttled every request
for ``TransferConfig.max_throttled_s`` (:mod:`~stoker.storage.transfer.throttle`).

Downloads start while the bucket is still being listed, and the listing runs at most
``list_ahead`` objects ahead of them, so memory stays bounded however many objects there are.

Modules: :mod:`~stoker.storage.transfer.config` (what a run is asked to do and what it
reports), :mod:`~stoker.storage.transfer.local` (the local side: safe paths, partial files,
checks), :mod:`~stoker.storage.transfer.downloader` and
:mod:`~stoker.storage.transfer.uploader` (the runs).
"""

from stoker.storage.transfer.config import (
    BASE_OPEN_FILES,
    DEFAULT_LIST_AHEAD,
    DEFAULT_MAX_THROTTLED_S,
    DEFAULT_WORKERS,
    FILES_PER_WORKER,
    ProgressSink,
    TransferConfig,
    TransferReport,
    bound_workers,
)
from stoker.storage.transfer.downloader import download
from stoker.storage.transfer.local import PARTIAL_SUFFIX, safe_local_path
from stoker.storage.transfer.uploader import upload

__all__ = [
    "BASE_OPEN_FILES",
    "DEFAULT_LIST_AHEAD",
    "DEFAULT_MAX_THROTTLED_S",
    "DEFAULT_WORKERS",
    "FILES_PER_WORKER",
    "PARTIAL_SUFFIX",
    "ProgressSink",
    "TransferConfig",
    "TransferReport",
    "bound_workers",
    "download",
    "safe_local_path",
    "upload",
]
