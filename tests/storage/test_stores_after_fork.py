"""Stores in a child made by fork() after the parent used them (a DataLoader worker).

obstore's runtime and the engine's loop thread do not survive a fork: the child must make
its own, whatever the parent did first, even with a request of the parent's in flight.
Each child runs under a timeout (stoker.testing.forks), so a regression fails, not hangs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import obstore

from stoker.storage import MemoryStore, open_store
from stoker.storage.engine import IOEngine, default_engine
from stoker.storage.native import native
from stoker.testing.forks import in_forked_child
from stoker.testing.netproxy import FaultConfig


def test_a_store_the_parent_read_from_reads_in_the_child(s3_bucket: Any) -> None:
    store = s3_bucket.store()
    store.put("k", b"parent data")
    assert bytes(store.get("k")) == b"parent data"

    def child() -> tuple[bytes, int, bool]:
        data = bytes(store.get("k"))
        store.put("from-child", b"child data")
        # The child's own obstore, and its own counters: one GET and one PUT, not the
        # parent's requests besides.
        counters = store.counters.snapshot()
        return (
            data,
            counters["requests.get"] + counters["requests.put"],
            store.engine is (default_engine()),
        )

    data, requests, shared_engine = in_forked_child(child)
    assert (data, requests, shared_engine) == (b"parent data", 2, True)
    assert bytes(store.get("from-child")) == b"child data"  # the parent's store goes on


def test_a_local_folder_store_reads_in_the_child(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    store.put("a/b", b"local")
    assert bytes(store.get("a/b")) == b"local"
    assert in_forked_child(lambda: bytes(store.get("a/b"))) == b"local"


def test_a_grandchild_reads_too(s3_bucket: Any) -> None:
    store = s3_bucket.store()
    store.put("k", b"x" * 100)
    assert len(store.get("k")) == 100

    def child() -> tuple[int, int]:
        mine = len(store.get("k"))
        return mine, in_forked_child(lambda: len(store.get("k")))

    assert in_forked_child(child) == (100, 100)


def test_a_fork_during_a_request_leaves_the_child_every_slot(s3_bucket: Any, proxy: Any) -> None:
    """The parent's only request slot is held by a request the server stalls; a child forked
    then reads at once: its engine starts clean (no slot taken, nothing pending) and its
    client is its own (no connection shared with the parent's request)."""
    writer = s3_bucket.store()
    writer.put("stalled", b"s" * 10_000)
    writer.put("k", b"k" * 1000)
    proxy.set_faults(FaultConfig(fault_rate=1.0, kinds=("stall",), fault_paths="stalled"))
    engine = IOEngine(max_in_flight=1)
    store = open_store(
        s3_bucket.url, storage_options=s3_bucket.options(proxy.endpoint), engine=engine
    )
    try:
        assert bytes(store.get("k")) == b"k" * 1000
        held = engine.submit(store.get_async("stalled"))
        while proxy.stats().faults.get("stall", 0) == 0:  # an event: the request is held
            time.sleep(0.01)
        assert in_forked_child(lambda: bytes(store.get("k")), timeout_s=30) == b"k" * 1000
        assert not held.done()
    finally:
        engine.abort()
        engine.close(timeout_s=10)


def test_the_child_of_a_parent_that_used_obstore_loads_its_own(s3_bucket: Any) -> None:
    s3_bucket.store().put("k", b"x")  # this process's obstore runtime runs

    def child() -> tuple[bool, bool, str]:
        mine = native()
        return mine.functions is obstore, native() is mine, mine.functions.__name__

    assert native().functions is obstore
    assert in_forked_child(child) == (False, True, "obstore._obstore")


def _in_fresh_interpreter(script: str) -> str:
    # A fresh interpreter: this one has used obstore already. What the script printed.
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_the_child_of_a_parent_that_never_used_obstore_keeps_it(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import obstore
        from stoker.storage import open_store
        from stoker.storage.native import native
        from stoker.testing.forks import in_forked_child

        def child():
            store = open_store({str(tmp_path)!r})
            store.put("k", b"child")
            return native().functions is obstore, bytes(store.get("k"))

        print(in_forked_child(child, timeout_s=30))
        """
    )
    assert _in_fresh_interpreter(script) == "(True, b'child')"


def test_the_child_of_a_parent_that_used_obstore_directly_reads(tmp_path: Path) -> None:
    # The parent's own obstore call (not through stoker) started the runtime whose threads
    # the child lacks: the child's first stoker request waited forever, without a word.
    script = textwrap.dedent(
        f"""
        import obstore
        import obstore.store
        from stoker.storage import open_store
        from stoker.storage.native import native
        from stoker.testing.forks import in_forked_child

        obstore.put(obstore.store.LocalStore({str(tmp_path)!r}), "k", b"parent")

        def child():
            store = open_store({str(tmp_path)!r})
            return native().functions is obstore, bytes(store.get("k"))

        print(in_forked_child(child, timeout_s=30))
        """
    )
    assert _in_fresh_interpreter(script) == "(False, b'parent')"


def test_a_memory_store_locked_at_the_fork_works_in_the_child() -> None:
    store = MemoryStore("forked")
    store.put("k", b"memory")
    locked, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:  # another thread inside the store as the fork happens
        with store._lock.get():
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        assert locked.wait(10)
        assert in_forked_child(lambda: bytes(store.get("k")), timeout_s=30) == b"memory"
    finally:
        release.set()
        holder.join()
    assert bytes(store.get("k")) == b"memory"
