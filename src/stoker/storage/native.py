"""obstore's native library, one working instance per process.

obstore sends every request from a tokio runtime that lives in its extension module and
starts with the first call. The runtime's threads do not survive ``fork()``: in a child
forked after its parent used obstore, every obstore call waits forever, on any store, old
or new (obstore is not fork-safe; its maintainers say so). A forked child whose parent used
obstore therefore loads a private instance of the extension, a copy in an anonymous memory
file that the dynamic loader takes for another library, with its own statics and runtime,
and builds its stores with it (:func:`rebuild`). The process that imported obstore, and a
child whose parents never used it, keep the imported one.

stoker makes every obstore call through :func:`native`, which is how it knows whether a
parent used obstore. obstore used directly by other code in a parent is seen at the fork,
on Linux, by its runtime's threads (``tokio-*``): the child then loads its own copy too
(before, it waited forever on its first request).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import obstore
import obstore.store

from stoker.core.perprocess import PerProcess
from stoker.errors import StorageError


@dataclass(frozen=True, slots=True)
class Obstore:
    """obstore as one process uses it."""

    functions: Any  # get_async, list, put_async, ...: the obstore package, or a private copy
    stores: Any  # S3Store, GCSStore, AzureStore, LocalStore


@dataclass(slots=True)
class _Instance:
    pid: int  # the process this instance works in
    obstore: Obstore
    used: bool = False  # its runtime may have started


# The runtime is process-global, so which instance works is too: one record per process.
_current = _Instance(os.getpid(), Obstore(functions=obstore, stores=obstore.store))
_lock = PerProcess(threading.Lock)  # one held at a fork would stay held in the child


def native() -> Obstore:
    """obstore for this process: a forked child gets a working one (module docstring)."""
    global _current
    current = _current
    pid = os.getpid()
    if current.pid != pid:
        with _lock.get():
            current = _current
            if current.pid != pid:
                current = _Instance(pid, _private_copy() if current.used else current.obstore)
                _current = current
    current.used = True
    return current.obstore


def _note_direct_use() -> None:
    """Before a fork: count a runtime that stoker did not start (obstore called directly by
    other code) as used, so that the child loads its own copy."""
    current = _current
    if not current.used and current.pid == os.getpid() and _runtime_threads():
        current.used = True


def _runtime_threads() -> bool:
    """Whether this process runs a tokio runtime's threads (Linux: their names; elsewhere
    they are not seen)."""
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            if (task / "comm").read_text(encoding="utf-8").startswith("tokio-"):
                return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


os.register_at_fork(before=_note_direct_use)


def rebuild(store: Any) -> Any:
    """The obstore store ``store`` (made in another process) made again with this process's
    obstore, with the same configuration and credentials (obstore's pickle arguments)."""
    args, kwargs = store.__getnewargs_ex__()
    made: Any = getattr(native().stores, type(store).__name__)(*args, **kwargs)
    return made


def _private_copy() -> Obstore:
    source = Path(str(obstore._obstore.__file__))
    problems = []
    for where in ("memory", "temporary file"):
        if where == "memory" and sys.platform != "linux":
            continue
        try:
            module = _load_copy(source, in_memory=where == "memory")
        except (OSError, ImportError) as exc:
            problems.append(f"in a {where}: {exc}")
            continue
        return Obstore(functions=module, stores=module._store)
    raise StorageError(
        f"this process was forked after its parent used obstore, whose threads do not survive "
        f"a fork, and a private copy of {source.name} could not be loaded "
        f"({'; '.join(problems)}); start worker processes with 'spawn' or 'forkserver' "
        f"(torch: DataLoader(..., multiprocessing_context='spawn'))"
    )


def _load_copy(source: Path, *, in_memory: bool) -> Any:
    with contextlib.ExitStack() as stack:
        if in_memory:
            fd = os.memfd_create("stoker-obstore")
            stack.callback(os.close, fd)  # the loaded library keeps its mapping
            path = f"/proc/self/fd/{fd}"
        else:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="stoker-obstore-"))
            path = str(Path(folder) / source.name)
        with source.open("rb") as original, open(path, "wb") as copy:
            shutil.copyfileobj(original, copy)
        name = obstore._obstore.__name__
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        if spec is None:
            raise ImportError(f"no module spec for {path}")
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
