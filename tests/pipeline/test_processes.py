"""Loader(method="process"): same results as threads, errors with tracebacks, no shm left."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import DecodeConfig
from stoker.pipeline import workers
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.pipeline.workers import WorkerError
from stoker.testing.images import write_image_folder, write_packed_images


def python_transform(image: Any) -> np.ndarray:
    """A transform written in Python (holds the GIL): a small grey thumbnail."""
    array = np.asarray(image.resize((12, 10)), dtype=np.float32)
    return (array.mean(axis=2) / 255.0).astype(np.float32)


def failing_transform(image: Any) -> np.ndarray:
    raise RuntimeError("transform exploded on purpose")


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("processes"),
        files=40,
        classes=4,
        width=64,
        height=48,
        samples_per_shard=10,
    )


def _stoker_shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("stoker-*")}


def _run(url: str, **options: Any) -> list[dict[str, Any]]:
    with Loader(url, batch_size=8, seed=3, **options) as loader:
        return list(loader)


@pytest.mark.parametrize(
    "transform", [RandomResizedCrop(16, flip=True), python_transform], ids=["planned", "python"]
)
def test_processes_give_what_threads_give(dataset_url: str, transform: Any) -> None:
    before = _stoker_shm()
    threads = _run(dataset_url, transform=transform)
    processes = _run(
        dataset_url, transform=transform, decode=DecodeConfig(method="process", threads=2)
    )
    assert len(threads) == len(processes) == 5
    for a, b in zip(threads, processes, strict=True):
        assert a["key"] == b["key"]
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
    assert _stoker_shm() == before  # the arena's name is gone as soon as workers map it


def test_a_worker_exception_reaches_the_consumer_with_its_traceback(dataset_url: str) -> None:
    with pytest.raises(WorkerError) as caught:
        _run(
            dataset_url,
            transform=failing_transform,
            decode=DecodeConfig(method="process", threads=1),
        )
    message = str(caught.value)
    assert "transform exploded on purpose" in message
    assert "failing_transform" in message  # the worker's traceback


KILLED = """
import sys
from stoker import DecodeConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop

if __name__ == "__main__":
    loader = Loader(sys.argv[1], batch_size=4, transform=RandomResizedCrop(16),
                    decode=DecodeConfig(method="process", threads=2))
    for epoch in range(10_000):
        loader.set_epoch(epoch)
        for batch in loader:
            print(len(batch["key"]), flush=True)
"""


def _children(pid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        if f"\nPPid:\t{pid}\n" in text:
            found.append(int(status.parent.name))
    return found


def test_killing_the_parent_leaves_no_shared_memory_and_no_workers(
    dataset_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "run.py"
    script.write_text(KILLED)
    before = _stoker_shm()
    with subprocess.Popen(
        [sys.executable, str(script), dataset_url], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        for _ in range(6):
            assert proc.stdout.readline()
        workers_pids = [pid for pid in _children(proc.pid) if "spawn_main" in _cmdline(pid)]
        assert len(workers_pids) == 2
        proc.kill()
    assert _stoker_shm() == before
    for pid in workers_pids:  # orphaned workers notice and exit within their poll interval
        _wait_gone(pid)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _wait_gone(pid: int) -> None:
    import time

    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if "spawn_main" not in _cmdline(pid):  # a zombie or a reused pid
            return
        time.sleep(0.1)
    pytest.fail(f"worker {pid} outlived its parent by 10 s")


@pytest.fixture
def tiny_shm(small_tmpfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A 1 MiB tmpfs standing in for a small /dev/shm (as Docker's 64 MB default is)."""
    mount_point = small_tmpfs("1m")
    monkeypatch.setattr(workers, "SHM_DIR", mount_point)
    return mount_point


def test_a_small_shm_falls_back_to_pipes_with_a_message(
    dataset_url: str, tiny_shm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stoker.pipeline.workers")
    transform = RandomResizedCrop(128)  # 8 x 128 x 128 x 3 x 4 slots: more than 1 MiB
    expected = _run(dataset_url, transform=transform)
    got = _run(dataset_url, transform=transform, decode=DecodeConfig(method="process", threads=2))
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
    assert "needs" in caplog.text
    assert "--shm-size" in caplog.text
    assert list(tiny_shm.iterdir()) == []


def test_skipping_works_in_process_mode(tmp_path: Path) -> None:
    from stoker.format.foreign.base import Sample
    from stoker.format.index import DatasetIndex, write_index
    from stoker.format.writer import ShardWriter
    from stoker.storage import open_store

    store = open_store(tmp_path / "bad")
    writer = ShardWriter(store, "shard-000000.tar")
    write_image_folder(tmp_path / "src", files=4, classes=1, width=40, height=30)
    for n, path in enumerate(sorted((tmp_path / "src").rglob("*.jpg"))):
        writer.add(Sample(key=f"ok{n}", fields={"jpg": path.read_bytes()}, label=0))
    writer.add(Sample(key="broken", fields={"jpg": b"\xff\xd8\xff garbage"}, label=0))
    write_index(store, DatasetIndex.from_shards([writer.close()], class_names=[], fields={}))
    with Loader(
        str(tmp_path / "bad"),
        batch_size=5,
        transform=RandomResizedCrop(8),
        decode=DecodeConfig(threads=2, method="process", on_error="skip"),
    ) as loader:
        (batch,) = list(loader)
        stats = loader.stats()
    assert batch["image"].shape == (4, 8, 8, 3)
    assert [k for k, _ in stats.skipped] == ["broken"]


UNGUARDED = """
import sys
from stoker import DecodeConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
loader = Loader(sys.argv[1], batch_size=4, transform=RandomResizedCrop(16),
                decode=DecodeConfig(method="process"))
list(loader)
"""


def test_an_unguarded_main_script_gets_told_what_to_do(dataset_url: str, tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    done = subprocess.run(
        [sys.executable, str(script), dataset_url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "if __name__ == '__main__':" in done.stderr
    assert "WorkerError" in done.stderr
