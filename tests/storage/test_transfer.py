"""Parallel download and upload: selection, resume, verification, failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.errors import TransferError
from stoker.storage import MemoryStore
from stoker.storage.transfer import (
    PARTIAL_SUFFIX,
    TransferConfig,
    download,
    safe_local_path,
    upload,
)
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import FaultConfig, LinkConfig, NetProxy

MiB = 1024 * 1024


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_upload_then_download_round_trip_on_s3(s3_bucket, tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_image_folder(source, files=120, classes=4)
    (source / "odd name ü").mkdir()
    (source / "odd name ü" / "file with space.bin").write_bytes(os.urandom(6 * MiB))
    store = s3_bucket.store("data", part_size_bytes=5 * MiB, multipart_threshold_bytes=5 * MiB)
    up = upload(source, store)
    assert up.files_transferred == 121
    down = download(store, tmp_path / "dst")
    assert down.files_transferred == 121
    assert down.bytes_transferred == sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    assert _tree(tmp_path / "dst") == _tree(source)


def test_rerun_skips_complete_files(s3_bucket, tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_image_folder(source, files=50)
    store = s3_bucket.store("data")
    upload(source, store)
    again = upload(source, store)
    assert (again.files_transferred, again.files_skipped) == (0, 50)
    download(store, tmp_path / "dst")
    # One file changed locally, one deleted: only those two move again.
    changed = next((tmp_path / "dst").rglob("*.jpg"))
    changed.write_bytes(b"corrupted")
    deleted = sorted((tmp_path / "dst").rglob("*.jpg"))[-1]
    deleted.unlink()
    rerun = download(store, tmp_path / "dst")
    assert (rerun.files_transferred, rerun.files_skipped) == (2, 48)
    assert _tree(tmp_path / "dst") == _tree(source)


def test_download_recognises_files_fetched_by_other_tools(tmp_path: Path) -> None:
    store = MemoryStore("other-tools")
    store.put("a.bin", b"alpha")
    (tmp_path / "a.bin").write_bytes(b"alpha")  # same bytes, different mtime: MD5 decides
    report = download(store, tmp_path)
    assert report.files_skipped == 1


def test_include_and_exclude(tmp_path: Path) -> None:
    store = MemoryStore("filters")
    for key in ["a/1.jpg", "a/2.png", "b/3.jpg", "b/skip/4.jpg"]:
        store.put(key, key.encode())
    config = TransferConfig(include=("*.jpg",), exclude=("b/skip/*",))
    report = download(store, tmp_path, config=config)
    assert sorted(_tree(tmp_path)) == ["a/1.jpg", "b/3.jpg"]
    assert report.files_total == 2


def test_failed_objects_are_listed_and_the_rest_complete(s3_bucket, proxy, tmp_path: Path) -> None:
    direct = s3_bucket.store("data")
    for i in range(30):
        direct.put(f"f{i:02d}", b"ok")
    proxy.set_faults(FaultConfig(fault_rate=1.0, kinds=("500",), fault_paths="f07"))
    store = s3_bucket.store(
        "data", endpoint=proxy.endpoint, retry={"max_attempts": 2, "base_delay_s": 0.001}
    )
    with pytest.raises(TransferError) as info:
        download(store, tmp_path)
    assert [key for key, _ in info.value.failures] == ["f07"]
    assert "f07" in str(info.value)
    assert "500" in info.value.failures[0][1] or "gave up" in info.value.failures[0][1]
    assert len(_tree(tmp_path)) == 29
    assert not list(tmp_path.glob(f"*{PARTIAL_SUFFIX}"))


def test_unsafe_keys_never_escape_the_destination(tmp_path: Path) -> None:
    store = MemoryStore("escape")
    store.put("../escaped.txt", b"evil")
    store.put("fine.txt", b"good")
    with pytest.raises(TransferError, match="unsafe path"):
        download(store, tmp_path / "dst")
    assert not (tmp_path / "escaped.txt").exists()
    assert (tmp_path / "dst" / "fine.txt").read_bytes() == b"good"


def test_an_object_named_like_a_partial_file_is_refused_not_lost(s3_bucket, tmp_path: Path) -> None:
    # '.a.bin.stoker-partial' is where 'a.bin' is written until complete: downloaded
    # together, one overwrote the other and the report said every object had arrived.
    store = s3_bucket.store("data")
    store.put("d/a.bin", b"alpha" * 1000)
    store.put(f"d/.a.bin{PARTIAL_SUFFIX}", b"an object of its own")
    store.put("d/b.bin", b"beta")
    with pytest.raises(
        TransferError, match=r"d/\.a\.bin\.stoker-partial.*rename the object"
    ) as info:
        download(store, tmp_path / "dst")
    assert [key for key, _ in info.value.failures] == [f"d/.a.bin{PARTIAL_SUFFIX}"]
    assert _tree(tmp_path / "dst") == {"d/a.bin": b"alpha" * 1000, "d/b.bin": b"beta"}


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a/../../b", "nul\x00byte"])
def test_safe_local_path_refuses(key: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsafe path"):
        safe_local_path(tmp_path, key)


def test_upload_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError):
        upload(tmp_path / "nope", MemoryStore("x"))


def test_resume_after_killed_download(s3_bucket, s3_server, tmp_path: Path) -> None:
    """SIGKILL a `stoker download` half-way, rerun it, and get every file intact."""
    source = tmp_path / "src"
    write_image_folder(source, files=400)
    upload(source, s3_bucket.store("data"))
    dst = tmp_path / "dst"
    with NetProxy("127.0.0.1", s3_server.port, link=LinkConfig(rtt_s=0.05)) as slow:
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": slow.endpoint,
            "AWS_ACCESS_KEY_ID": s3_bucket.options()["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": s3_bucket.options()["secret_access_key"],
            "AWS_REGION": "us-east-1",
        }
        command = [
            sys.executable,
            "-m",
            "stoker",
            "download",
            f"{s3_bucket.url}/data",
            str(dst),
            "--workers",
            "4",
            "--no-progress",
        ]
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(list(dst.rglob("*.jpg"))) < 40:
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
        done_before = len(list(dst.rglob("*.jpg")))
        assert 0 < done_before < 400, "the kill should land mid-download"
        rerun = subprocess.run(
            [*command[:-3], "--workers", "64", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    assert rerun.returncode == 0, rerun.stderr
    assert _tree(dst) == _tree(source)
    assert not list(dst.rglob(f"*{PARTIAL_SUFFIX}"))
    assert f'"files_skipped": {done_before}' in rerun.stdout


class _Recorder:
    def __init__(self) -> None:
        self.starts: list[tuple[int, int]] = []
        self.files = self.nbytes = 0

    def start(self, *, files: int, total_bytes: int) -> None:
        self.starts.append((files, total_bytes))

    def advance(self, *, files: int, nbytes: int) -> None:
        assert self.starts, "advance before start"
        self.files += files
        self.nbytes += nbytes


class _WatchedStore(MemoryStore):
    """Records how far the listing has run ahead of the downloads at each GET."""

    def __init__(self) -> None:
        super().__init__("watched")
        self.listed = self.started = 0
        self.ahead: list[int] = []

    async def list_async(self, prefix: str = ""):  # type: ignore[override]
        async for page in super().list_async(prefix):
            self.listed += len(page)
            yield page

    async def get_async(self, path: str) -> memoryview:
        self.started += 1
        self.ahead.append(self.listed - self.started)
        return await super().get_async(path)


@pytest.mark.parametrize("objects", [150, 6000])
def test_download_lists_a_bounded_window_ahead(objects: int, tmp_path: Path) -> None:
    """A long listing is streamed (downloads start before it ends, and it never runs more
    than about list_ahead objects ahead); a short one is known before the first GET."""
    store = _WatchedStore()
    for i in range(objects):
        store.put(f"d{i % 7}/o{i:05d}", b"%d" % i)
    sink = _Recorder()
    config = TransferConfig(workers=4, list_ahead=200)
    report = download(store, tmp_path, config=config, progress=sink)
    assert report.files_transferred == report.files_total == objects
    assert len(_tree(tmp_path)) == objects
    total = sum(len(b"%d" % i) for i in range(objects))
    assert sink.starts == [(objects, total)]  # once, with the exact totals
    assert (sink.files, sink.nbytes) == (objects, total)
    page = 1000  # MemoryStore's listing page
    assert max(store.ahead) <= config.list_ahead + page + config.workers + 1
    listed_at_first_get = store.ahead[0] + 1
    if objects > config.list_ahead:
        assert listed_at_first_get < objects  # files moved while the listing went on
    else:
        assert listed_at_first_get == objects


class _CorruptingStore(MemoryStore):
    def __init__(self, bad_key: str, *, fail: bool = False) -> None:
        super().__init__("corrupting")
        self.bad_key, self.fail = bad_key, fail

    async def get_range_async(self, path: str, *, start: int, end: int) -> memoryview:
        data = await super().get_range_async(path, start=start, end=end)
        if path != self.bad_key or start == 0:
            return data
        if self.fail:
            raise OSError("connection lost in the second part")
        spoiled = bytearray(data)
        spoiled[0] ^= 0xFF
        return memoryview(bytes(spoiled))


@pytest.mark.parametrize("fail", [False, True])
def test_a_bad_part_of_a_large_file_fails_that_file_only(fail: bool, tmp_path: Path) -> None:
    store = _CorruptingStore("big/bad.bin", fail=fail)
    big = os.urandom(33 * MiB)  # above the default 32 MiB threshold: downloaded in parts
    store.put("big/bad.bin", big)
    store.put("big/good.bin", big[::-1])
    store.put("small.txt", b"fine")
    with pytest.raises(TransferError) as info:
        download(store, tmp_path)
    [(key, reason)] = info.value.failures
    assert key == "big/bad.bin"
    assert ("second part" if fail else "checksum mismatch") in reason
    assert _tree(tmp_path) == {"big/good.bin": big[::-1], "small.txt": b"fine"}
    assert not list(tmp_path.rglob(f"*{PARTIAL_SUFFIX}"))  # the partial file is gone too
