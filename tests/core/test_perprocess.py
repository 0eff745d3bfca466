"""PerProcess: one value per process, made again in a forked child, dropped by pickling."""

from __future__ import annotations

import copy
import os
import threading

from stoker.core.perprocess import PerProcess
from stoker.testing.forks import in_forked_child


def test_made_once_per_process() -> None:
    made: list[int] = []

    def make() -> int:
        made.append(os.getpid())
        return os.getpid()

    value = PerProcess(make)
    assert value.peek() is None  # nothing made by looking
    assert value.get() == value.get() == os.getpid()
    assert made == [os.getpid()]

    def child() -> tuple[int | None, int, int]:
        return value.peek(), value.get(), len(made)

    # The child sees the parent's value as not its own and makes one of its own, once.
    child_pid = in_forked_child(lambda: os.getpid())
    looked, got, makes = in_forked_child(child)
    assert looked is None
    assert got not in (os.getpid(), child_pid)
    assert makes == 2
    assert value.get() == os.getpid()  # the parent's value stays


def test_an_initial_value_belongs_to_the_process_that_gave_it() -> None:
    value = PerProcess(lambda: "made", initial="given")
    assert value.get() == "given"
    assert in_forked_child(value.get) == "made"


def test_a_lock_held_at_the_fork_is_not_the_childs() -> None:
    lock = PerProcess(threading.Lock)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock.get():
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        assert in_forked_child(lambda: lock.get().acquire(timeout=5), timeout_s=30)
    finally:
        release.set()
        holder.join()


def test_a_copy_or_pickle_drops_the_value() -> None:
    value = PerProcess(os.getpid, initial=-1)
    duplicate = copy.deepcopy(value)  # through __getstate__, as pickle goes
    assert duplicate.peek() is None
    assert duplicate.get() == os.getpid()
    assert value.get() == -1
