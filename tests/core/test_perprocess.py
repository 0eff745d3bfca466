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


def test_a_lock_held_by_another_thread_at_a_fork_is_free_in_the_child() -> None:
    """A read running ahead on the I/O thread may be counting a request when a DataLoader
    forks its workers: the child's first count must not wait for a thread it lacks."""
    import os
    import threading

    from stoker.core.metrics import Counters, Stages

    counters, stages = Counters(), Stages()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with counters._lock, stages._lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: count, then leave at once
            alarm = threading.Timer(5, os._exit, (3,))  # a deadlock exits 3
            alarm.start()
            counters.add("requests.get")
            stages.record("fetch", 0.1)
            os._exit(0 if counters.get("requests.get") == 1 else 4)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0
