"""Bad videos and lying seek indexes (issue 36): each named, or skipped and listed; none
hangs, none allocates what a lying number asks."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker.errors import ShardFormatError, SourceError
from stoker.format.dataset_index import CHECKSUMS_KEY, section_checksums
from stoker.pack.config import PackConfig
from stoker.pipeline.clips import VideoConfig
from stoker.pipeline.config import DecodeConfig, SourceConfig
from stoker.pipeline.loader import Loader
from stoker.storage import open_store
from stoker.testing.videos import make_video

pytest.importorskip("av")


def _folder(root: Path, *, broken: bytes | None = None) -> Path:
    (root / "a").mkdir(parents=True)
    for n in range(2):
        (root / "a" / f"good{n}.mp4").write_bytes(make_video(frames=24, gop=8, photo=n))
    if broken is not None:
        (root / "a" / "broken.mp4").write_bytes(broken)
    return root


@pytest.mark.parametrize(
    ("broken", "why"),
    [
        (make_video(frames=24, gop=8)[:3000], "truncated"),
        (b"\x00\x00\x00\x18ftypisom" + bytes(500), "not a video"),
    ],
)
def test_a_video_that_does_not_read_is_named_or_skipped_and_listed(
    tmp_path: Path, broken: bytes, why: str
) -> None:
    source = _folder(tmp_path / "in", broken=broken)
    with pytest.raises(SourceError, match=r"broken\.mp4"):
        stoker.pack(source, tmp_path / "refused")
    report = stoker.pack(source, tmp_path / "out", config=PackConfig(on_error="skip"))
    assert report.samples == 2
    assert [s["key"] for s in report.skipped] == ["a/broken"], why
    with Loader(
        SourceConfig(tmp_path / "out", video=VideoConfig(frames=4)), batch_size=2
    ) as loader:
        assert sorted(k for b in loader for k in b["key"]) == ["a/good0", "a/good1"]


def _edit_videos(dataset: Path, edit: Any) -> None:
    """Rewrite ``videos.npz`` through ``edit(arrays)`` and name it again in the manifest,
    as a writer that lies would."""
    store = open_store(str(dataset))
    with np.load(io.BytesIO(bytes(store.get("videos.npz"))), allow_pickle=False) as found:
        arrays = {name: found[name] for name in found.files}
    edit(arrays)
    out = io.BytesIO()
    np.savez(out, **arrays)
    data = out.getvalue()
    store.put("videos.npz", data)
    manifest = json.loads(bytes(store.get("index.json")))
    manifest["videos"] = stoker.format.video_table.videos_manifest(data)
    manifest[CHECKSUMS_KEY] = section_checksums(manifest)
    store.put("index.json", json.dumps(manifest).encode())


def _loader(dataset: Path, **decode: Any) -> Loader:
    config = SourceConfig(dataset, video=VideoConfig(frames=4, clips_per_video=2))
    return Loader(config, batch_size=2, decode=DecodeConfig(**decode))


def test_a_seek_index_that_points_past_its_video_is_named(tmp_path: Path) -> None:
    stoker.pack(_folder(tmp_path / "in"), tmp_path / "out")

    def lie(arrays: dict[str, np.ndarray]) -> None:
        arrays["packet_offset"][3] = 10**12  # the first video's fourth packet

    _edit_videos(tmp_path / "out", lie)
    with _loader(tmp_path / "out") as loader, pytest.raises(ValueError, match="past the video's"):
        list(loader)
    with _loader(tmp_path / "out", on_error="skip") as loader:
        keys = [k for b in loader for k in b["key"]]
        skipped = loader.skips
    assert keys == ["a/good1", "a/good1"]
    assert skipped.count_in(0) == 2
    assert {r["key"] for r in skipped.records} == {"a/good0"}
    assert all("past the video's" in r["reason"] for r in skipped.records)


def test_a_seek_index_whose_counts_disagree_is_refused_at_open(tmp_path: Path) -> None:
    stoker.pack(_folder(tmp_path / "in"), tmp_path / "out")

    def lie(arrays: dict[str, np.ndarray]) -> None:
        arrays["packet_start"][-1] = 10**15  # a claim of 10^15 packets, and none there

    _edit_videos(tmp_path / "out", lie)
    with pytest.raises(ShardFormatError, match="packet offsets are not in order"):
        _loader(tmp_path / "out")


def test_a_codec_this_ffmpeg_does_not_decode_is_named(tmp_path: Path) -> None:
    stoker.pack(_folder(tmp_path / "in"), tmp_path / "out")

    def unknown(arrays: dict[str, np.ndarray]) -> None:
        arrays["codec_names"] = np.asarray(["nosuchcodec"], dtype="U32")

    _edit_videos(tmp_path / "out", unknown)
    with (
        _loader(tmp_path / "out") as loader,
        pytest.raises(
            ValueError, match=r"sample .a/good0..*codec .nosuchcodec. does not decode here"
        ),
    ):
        list(loader)


def test_clips_of_a_dataset_without_videos_are_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "in" / "cat").mkdir(parents=True)
    from stoker.testing.images import make_jpeg

    for n in range(2):
        (tmp_path / "in" / "cat" / f"{n}.jpg").write_bytes(
            make_jpeg(np.random.default_rng(n), width=16, height=16)
        )
    stoker.pack(tmp_path / "in", tmp_path / "out")
    with pytest.raises(ValueError, match="holds no videos"):
        _loader(tmp_path / "out")
