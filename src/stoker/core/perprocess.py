"""Values that belong to one process: made again, lazily, in a process forked from it.

``fork()`` copies a parent's objects into the child but none of its threads. What those
threads served stays behind in a state the child cannot use: an event loop whose thread is
gone, a native runtime's task queue, a lock another thread held at the fork, a count of
requests in flight that will never complete. So every such resource is keyed by the id of
the process that made it and made anew on its first use in another process (torch
DataLoader workers are forked by default). What the parent made stays referenced in the
child, never finalized there: it may share descriptors with the parent (an event loop's
epoll set), and closing them from the child would break the parent. Pickling drops it: an
unpickled copy makes its own in the process that uses it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """A value made by ``make()`` on first use in each process.

    Args:
        make: Builds the value; called once per process, on first :meth:`get` there.
        initial: Already made, for the current process.
    """

    __slots__ = ("_inherited", "_locks", "_make", "_value")

    def __init__(self, make: Callable[[], T], *, initial: T | None = None) -> None:
        self._make = make
        self._value: tuple[int, T] | None = None if initial is None else (os.getpid(), initial)
        # One lock per process: one held by another thread at a fork stays held in the child.
        self._locks: dict[int, threading.Lock] = {}
        self._inherited: list[T] = []  # the values of the processes this one was forked from

    def get(self) -> T:
        """The value of this process, made now if it has none yet."""
        pid = os.getpid()
        value = self._value
        if value is not None and value[0] == pid:
            return value[1]
        with self._locks.setdefault(pid, threading.Lock()):  # setdefault is atomic
            value = self._value
            if value is None or value[0] != pid:
                if value is not None:
                    self._inherited.append(value[1])
                value = (pid, self._make())
                self._value = value
            return value[1]

    def peek(self) -> T | None:
        """The value of this process if it was made, else None (nothing is made)."""
        value = self._value
        return value[1] if value is not None and value[0] == os.getpid() else None

    def __getstate__(self) -> dict[str, Any]:
        return {"make": self._make}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._make = state["make"]
        self._value = None
        self._locks = {}
        self._inherited = []


class ForkSafeLock:
    """A lock that a forked child finds released, whoever held it at the fork.

    A ``threading.Lock`` held by another thread when the process forks (an I/O thread
    counting a request of a read running ahead, say) stays held in the child, where that
    thread does not exist: the child's first ``with lock`` waits forever. Every
    ForkSafeLock is made anew in the child right after a fork. What the lock guarded may be
    half-updated there (a counter, a total); the objects guarded this way tolerate that.
    """

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _FORK_SAFE_LOCKS.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """As ``threading.Lock.acquire``."""
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        """As ``threading.Lock.release``."""
        self._lock.release()

    def _remake(self) -> None:
        self._lock = threading.Lock()


_FORK_SAFE_LOCKS: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _remake_locks() -> None:
    for lock in list(_FORK_SAFE_LOCKS):
        lock._remake()


os.register_at_fork(after_in_child=_remake_locks)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts: it cannot be signalled,
    but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
