"""Video clips (issue 36): videos packed as they are with a seek index, clips read on the
SeaweedFS server by ranged GETs of their groups of pictures and decoded from those bytes
alone, frame for frame what PyAV gives decoding the whole file."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker.pipeline.clips import VideoConfig
from stoker.pipeline.config import SourceConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.sources import open_source
from stoker.pipeline.video_source import VideoSource
from stoker.pipeline.world import World
from stoker.testing.videos import decode_all, make_video
from stoker.transforms import RandomResizedCrop

pytest.importorskip("av")

#: (file, codec, container, frames, keyframe interval, variable frame rate)
VIDEOS = (
    ("walk/a.mp4", "libx264", "mp4", 61, 12, False),
    ("walk/b.mkv", "libx264", "mkv", 47, 9, True),
    ("run/c.webm", "libvpx-vp9", "webm", 40, 15, False),
    ("run/d.mp4", "libx265", "mp4", 33, 7, False),
    ("run/e.mp4", "libsvtav1", "mp4", 30, 10, False),
)


def _write(
    folder: Path, videos: tuple[tuple[str, str, str, int, int, bool], ...]
) -> dict[str, list[np.ndarray]]:
    """Write ``videos`` under ``folder``; every frame of each, by sample key."""
    frames = {}
    for n, (name, codec, container, count, gop, variable) in enumerate(videos):
        data = make_video(
            frames=count, codec=codec, container=container, gop=gop, variable=variable, photo=n
        )
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        frames[name.rsplit(".", 1)[0]] = decode_all(data)
    return frames


@pytest.fixture(scope="module")
def videos(
    s3_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any], dict[str, list[np.ndarray]]]:
    """The five videos packed into a bucket once for the module (the tests only read
    them); every frame of each, by key."""
    root = tmp_path_factory.mktemp("videos")
    frames = _write(root / "in", VIDEOS)
    s3_server.create_bucket("video-clips")
    url, options = "s3://video-clips/clips", s3_server.storage_options()
    stoker.pack(root / "in", url, storage_options=options)
    return url, options, frames


def _clips(loader: Loader) -> list[dict[str, Any]]:
    out = []
    for batch in loader:
        for n, key in enumerate(batch["key"]):
            out.append({name: value[n] for name, value in batch.items()} | {"key": key})
    return out


def _config(url: str, **video: Any) -> SourceConfig:
    return SourceConfig(url, video=VideoConfig(**video))


@pytest.mark.parametrize(
    "video",
    [
        {"frames": 5, "stride": 2, "step": 4},  # windows across keyframes, overlapping
        {"frames": 8, "clips_per_video": 3},  # the first and the last clip of each video
    ],
)
def test_every_clip_equals_pyav_decoding_the_whole_file(videos: Any, video: dict[str, Any]) -> None:
    url, options, frames = videos
    config = VideoConfig(**video)
    with Loader(SourceConfig(url, video=config), batch_size=3, storage_options=options) as loader:
        clips = _clips(loader)
    expected = {
        (key, int(first)) for key, every in frames.items() for first in _starts(config, len(every))
    }
    assert sorted((c["key"], int(c["first_frame"])) for c in clips) == sorted(expected)
    for clip in clips:
        every = frames[clip["key"]]
        indices = [
            min(int(clip["first_frame"]) + t * config.stride, len(every) - 1)
            for t in range(config.frames)
        ]
        assert clip["image"].shape == (config.frames, 96, 160, 3)
        assert clip["image"].dtype == np.uint8
        for t, i in enumerate(indices):
            np.testing.assert_array_equal(
                clip["image"][t], every[i], err_msg=f"{clip['key']} frame {i}"
            )
        assert np.all(np.diff(clip["timestamps"]) > 0)
    last = {key: max(int(c["first_frame"]) for c in clips if c["key"] == key) for key in frames}
    if config.clips_per_video:
        assert last == {key: len(every) - config.span for key, every in frames.items()}
    labels = {c["key"]: int(c["label"]) for c in clips}
    assert labels["walk/a"] == labels["walk/b"] != labels["run/c"] == labels["run/d"]


def _starts(config: VideoConfig, count: int) -> list[int]:
    last = count - config.span
    if config.step:
        return list(range(0, last + 1, config.step))
    return [round(x) for x in np.linspace(0, last, config.clips_per_video or 1)]


def test_a_video_shorter_than_a_clip_is_dropped_padded_or_refused(
    s3_bucket: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    frames = _write(
        tmp_path / "in",
        (
            ("x/long.mp4", "libx264", "mp4", 30, 10, False),
            ("x/short.mp4", "libx264", "mp4", 6, 10, False),
        ),
    )
    url, options = f"{s3_bucket.url}/v", s3_bucket.options()
    stoker.pack(tmp_path / "in", url, storage_options=options)

    def keys(short: str) -> list[tuple[str, int]]:
        config = _config(url, frames=10, clips_per_video=2, short=short)
        with Loader(config, batch_size=2, storage_options=options) as loader:
            return sorted((c["key"], int(c["first_frame"])) for c in _clips(loader))

    with caplog.at_level(logging.WARNING):
        assert keys("drop") == [("x/long", 0), ("x/long", 20)]
    assert "1 video(s) shorter than a clip of 10 frames left out" in caplog.text
    assert "'x/short'" in caplog.text
    config = _config(url, frames=10, clips_per_video=2, short="pad")
    with Loader(config, batch_size=4, storage_options=options) as loader:
        padded = [c for c in _clips(loader) if c["key"] == "x/short"]
    assert len(padded) == 1
    for t in range(10):
        np.testing.assert_array_equal(padded[0]["image"][t], frames["x/short"][min(t, 5)])
    with pytest.raises(ValueError, match="video 'x/short' has 6 frames; a clip spans 10"):
        Loader(_config(url, frames=10, short="error"), batch_size=2, storage_options=options)


def test_every_clip_once_over_ranks_and_workers_with_equal_steps(videos: Any) -> None:
    url, options, frames = videos
    config = _config(url, frames=4, step=3)
    seen: list[tuple[str, int]] = []
    steps = [0, 0]
    for rank in range(2):
        for worker in range(2):
            world = World(rank=rank, world_size=2, worker=worker, num_workers=2)
            with Loader(
                config, batch_size=2, world=world, seed=7, storage_options=options
            ) as loader:
                clips = _clips(loader)
            seen += [(c["key"], int(c["first_frame"])) for c in clips]
            steps[rank] += len(clips)
    total = sum(len(range(0, len(f) - 4 + 1, 3)) for f in frames.values())
    # Equal epochs pad with repeats of at most world size - 1 (4 readers): nothing lost.
    assert set(seen) == {(k, s) for k, f in frames.items() for s in range(0, len(f) - 4 + 1, 3)}
    assert total <= len(seen) <= total + 3
    assert steps[0] == steps[1]  # each rank's workers together: DDP never waits on one


def test_a_resume_mid_epoch_equals_the_uninterrupted_rest(videos: Any) -> None:
    url, options, _ = videos
    settings: dict[str, Any] = {"batch_size": 3, "seed": 11, "storage_options": options}
    config = _config(url, frames=4, stride=3, step=5)
    with Loader(config, **settings) as loader:
        whole = [
            [(k, int(f)) for k, f in zip(b["key"], b["first_frame"], strict=True)] for b in loader
        ]
    with Loader(config, **settings) as loader:
        it = iter(loader)
        seen = [list(next(it)["key"]) for _ in range(3)]
        state = loader.state_dict()
        it.close()  # type: ignore[attr-defined]
    with Loader(config, **settings) as loader:
        loader.load_state_dict(state)
        rest = [
            [(k, int(f)) for k, f in zip(b["key"], b["first_frame"], strict=True)] for b in loader
        ]
    assert seen == [[k for k, _ in batch] for batch in whole[:3]]
    assert rest == whole[3:]
    assert len(whole) > 4


def test_sparse_clips_fetch_their_groups_of_pictures_and_little_else(
    s3_bucket: Any, tmp_path: Path
) -> None:
    _write(
        tmp_path / "in",
        tuple((f"c/{n}.mp4", "libx264", "mp4", 150, 15, False) for n in range(3)),
    )
    url, options = f"{s3_bucket.url}/sparse", s3_bucket.options()
    stoker.pack(tmp_path / "in", url, storage_options=options)
    source = open_source(
        _config(url, frames=4, clips_per_video=2),
        storage_options=options,
        cache=None,
        page_bytes=1 << 20,
    )
    assert isinstance(source, VideoSource)
    store = source.datasets[0].store
    # What each clip needs, from the seek index: the packets from its keyframe to its last.
    needed = 0
    for unit in range(source.units()):
        sample = int(source.clips.sample[unit])
        row = source.table.video_of(sample)
        assert row is not None
        index = source.table.index(row)
        frames = source.video.clip_frames(int(source.clips.first[unit]), index.frames)
        lo, hi = index.clip_packets(frames)
        needed += int(index.size[lo:hi].sum())
    videos_bytes = int(source.table.member_sizes.sum())
    before = store.counters.snapshot()
    with Loader(source, batch_size=2) as loader:
        loader.read_ahead = False  # one epoch's reads, not the next one's first
        assert len(_clips(loader)) == 6
    fetched = store.counters.snapshot().get("bytes.read", 0) - before.get("bytes.read", 0)
    assert 0 < fetched <= 1.2 * needed
    assert fetched < 0.5 * videos_bytes


def test_clips_through_a_transform_keep_one_crop_per_clip(videos: Any) -> None:
    url, options, _ = videos
    crop = RandomResizedCrop(32, scale=(0.2, 0.5), flip=True)
    runs = []
    for _ in range(2):
        with Loader(
            _config(url, frames=3, step=10),
            batch_size=4,
            transform=crop,
            seed=1,
            storage_options=options,
        ) as loader:
            runs.append(_clips(loader))
    assert runs[0][0]["image"].shape == (3, 32, 32, 3)
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])  # seeded per clip


def test_worker_processes_decode_clips_as_threads_do(videos: Any) -> None:
    url, options, _ = videos
    config = _config(url, frames=4, clips_per_video=2)
    results = []
    for method in ("thread", "process"):
        decode = stoker.DecodeConfig(method=method, threads=2)
        with Loader(
            config,
            batch_size=4,
            decode=decode,
            order=OrderConfig(mode="none"),
            storage_options=options,
        ) as loader:
            results.append(_clips(loader))
    assert [c["key"] for c in results[0]] == [c["key"] for c in results[1]]
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])


def test_torch_workers_deliver_every_clip_once(videos: Any) -> None:
    torch = pytest.importorskip("torch")
    from stoker.integrations.torch import TorchLoader

    url, options, frames = videos
    config = _config(url, frames=4, clips_per_video=2)
    loader = TorchLoader(
        config, batch_size=3, num_workers=2, order=OrderConfig(mode="none"), storage_options=options
    )
    seen = []
    for batch in loader:
        assert batch["image"].dtype == torch.uint8
        assert tuple(batch["image"].shape[1:]) == (4, 96, 160, 3)
        seen += list(zip(batch["key"], batch["first_frame"].tolist(), strict=True))
    assert sorted(seen) == sorted(
        (key, first) for key, every in frames.items() for first in (0, len(every) - 4)
    )


def test_inspect_lists_each_videos_seek_index(videos: Any) -> None:
    from click.testing import CliRunner

    from stoker.cli.main import cli

    url, options, frames = videos
    env = {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    result = CliRunner().invoke(cli, ["inspect", url, "--json"], env=env)
    assert result.exit_code == 0, result.output
    rows = {row["key"]: row for row in json.loads(result.output)["videos"]}
    assert {k: r["frames"] for k, r in rows.items()} == {k: len(f) for k, f in frames.items()}
    assert rows["run/c"]["codec"] == "vp9"
    assert rows["walk/a"]["keyframes"] == 6  # 61 frames, a keyframe every 12
    assert rows["walk/a"]["keyframe_s"][:2] == [0.0, 0.4]
    assert rows["walk/a"]["fps"] == pytest.approx(30.0)


def test_a_second_epoch_through_the_disk_cache_gets_nothing(videos: Any, tmp_path: Path) -> None:
    url, options, frames = videos
    config = _config(url, frames=4, clips_per_video=2)
    cache = stoker.CacheConfig(dir=tmp_path / "cache")
    with Loader(config, batch_size=4, cache=cache, seed=2, storage_options=options) as loader:
        loader.read_ahead = False
        first = sorted((c["key"], int(c["first_frame"])) for c in _clips(loader))
    # Another process of the node: the index, the seek indexes and the clips' bytes all
    # come from the node's cache.
    with Loader(config, batch_size=4, cache=cache, seed=2, storage_options=options) as loader:
        loader.read_ahead = False
        store = loader.dataset.store
        before = store.counters.snapshot()
        again = sorted((c["key"], int(c["first_frame"])) for c in _clips(loader))
        after = store.counters.snapshot()
    assert again == first == sorted((k, s) for k, f in frames.items() for s in (0, len(f) - 4))
    assert after.get("requests.get", 0) - before.get("requests.get", 0) == 0


def test_videos_in_webdataset_tars_pack_into_clips(s3_bucket: Any, tmp_path: Path) -> None:
    import io
    import tarfile

    videos = {f"clip{n}": make_video(frames=20, gop=6, photo=n) for n in range(3)}
    (tmp_path / "tars").mkdir()
    with tarfile.open(tmp_path / "tars" / "part-0000.tar", "w") as tar:
        for key, data in videos.items():
            for ext, value in (("mp4", data), ("cls", str(int(key[-1]) % 2).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value))
    url, options = f"{s3_bucket.url}/wds", s3_bucket.options()
    stoker.pack(tmp_path / "tars", url, storage_options=options)
    with Loader(_config(url, frames=5, step=7), batch_size=2, storage_options=options) as loader:
        clips = _clips(loader)
    assert sorted((c["key"], int(c["first_frame"])) for c in clips) == [
        (k, s) for k in sorted(videos) for s in (0, 7, 14)
    ]
    for clip in clips:
        every = decode_all(videos[clip["key"]])
        first = int(clip["first_frame"])
        np.testing.assert_array_equal(clip["image"], np.stack(every[first : first + 5]))
        assert int(clip["label"]) == int(clip["key"][-1]) % 2


def test_jax_loader_delivers_clips(videos: Any) -> None:
    pytest.importorskip("jax")
    url, options, frames = videos
    # JAX runs in a child process: once it has started in the test process, the tests
    # that fork would warn (JAX is multithreaded).
    result = subprocess.run(
        [sys.executable, "-c", _JAX_CHILD, url, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shapes, keys = json.loads(result.stdout.splitlines()[-1])
    assert {tuple(s) for s in shapes} == {(2, 3, 96, 160, 3)}  # 10 clips, 5 batches
    assert sorted(keys) == sorted(k for k in frames for _ in range(2))


_JAX_CHILD = """
import json, sys
from stoker import SourceConfig, VideoConfig
from stoker.integrations.jax import JaxLoader
source = SourceConfig(sys.argv[1], video=VideoConfig(frames=3, clips_per_video=2))
loader = JaxLoader(source, batch_size=2, storage_options=json.loads(sys.argv[2]))
shapes, keys = [], []
for batch in loader:
    shapes.append(list(batch["image"].shape))
    keys += list(batch["key"])
print(json.dumps([shapes, keys]))
"""


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _decoded_on(device: str, url: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    config = _config(url, frames=4, clips_per_video=2, device=device)
    with Loader(
        config, batch_size=4, order=OrderConfig(mode="none"), storage_options=options
    ) as loader:
        return _clips(loader)


def test_cuda_decode_without_a_gpu_says_so_once_and_decodes_on_the_cpu(
    videos: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _cuda():
        pytest.skip("a CUDA device is present: test_cuda_decode_equals_the_cpu_decode runs")
    from stoker.format import video_decode

    monkeypatch.setattr(video_decode, "_DEVICES", {})
    url, options, _ = videos
    with caplog.at_level(logging.WARNING, logger="stoker.format.video_decode"):
        gpu = _decoded_on("cuda", url, options)
    assert caplog.text.count("video decode on cuda unavailable") == 1
    cpu = _decoded_on("cpu", url, options)
    for a, b in zip(gpu, cpu, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device")
def test_cuda_decode_equals_the_cpu_decode(videos: Any, caplog: pytest.LogCaptureFixture) -> None:
    url, options, _ = videos
    with caplog.at_level(logging.WARNING, logger="stoker.format.video_decode"):
        gpu = _decoded_on("cuda", url, options)
    assert "unavailable" not in caplog.text
    cpu = _decoded_on("cpu", url, options)
    for a, b in zip(gpu, cpu, strict=True):
        # NVDEC decodes bit-exactly; only the colour conversion after it may round apart.
        assert np.abs(a["image"].astype(int) - b["image"].astype(int)).max() <= 2


def test_pack_re_encodes_videos_once_when_asked(tmp_path: Path) -> None:
    from stoker.pack.config import PackConfig
    from stoker.pack.video_reencode import VideoPolicy

    folder = tmp_path / "in" / "a"
    folder.mkdir(parents=True)
    (folder / "wide.mkv").write_bytes(make_video(frames=60, width=320, height=192, gop=40))
    policy = VideoPolicy(resize_shorter=48, fps=10)
    report = stoker.pack(tmp_path / "in", tmp_path / "out", config=PackConfig(videos=policy))
    assert report.samples == 1
    dataset = stoker.open_dataset(tmp_path / "out")
    assert dataset.index.fields == {"cls": 1, "mp4": 1}  # re-encoded as H.264 in MP4
    stored = bytes(dataset[0]["mp4"])
    every = decode_all(stored)
    assert len(every) == 20  # 2 s at 10 frames/s
    assert every[0].shape == (48, 80, 3)
    with Loader(
        SourceConfig(tmp_path / "out", video=VideoConfig(frames=4, stride=5)), batch_size=1
    ) as loader:
        (clip,) = _clips(loader)
    np.testing.assert_array_equal(clip["image"], np.stack(every[0:20:5]))
    np.testing.assert_allclose(clip["timestamps"], [0.0, 0.5, 1.0, 1.5])


def test_clips_a_list_names_by_frame_or_by_time(videos: Any) -> None:
    url, options, frames = videos

    def clips(**video: Any) -> list[tuple[str, int]]:
        with Loader(
            _config(url, frames=3, **video), batch_size=4, storage_options=options
        ) as loader:
            found = _clips(loader)
        for clip in found:
            every = frames[clip["key"]]
            first = int(clip["first_frame"])
            np.testing.assert_array_equal(clip["image"], np.stack(every[first : first + 3]))
        return sorted((c["key"], int(c["first_frame"])) for c in found)

    assert clips(starts={"walk/a": [3, 40], "run/d": [0]}) == [
        ("run/d", 0),
        ("walk/a", 3),
        ("walk/a", 40),
    ]
    # 30 frames/s: 1.0 s is frame 30; 0.51 s is shown from frame 16 (0.5333 s) on.
    assert clips(seconds={"walk/a": [0.0, 1.0], "run/c": [0.51]}) == [
        ("run/c", 16),
        ("walk/a", 0),
        ("walk/a", 30),
    ]
    with pytest.raises(ValueError, match="no video 'nope'"):
        Loader(
            _config(url, frames=3, seconds={"nope": [0.0]}), batch_size=1, storage_options=options
        )
    with pytest.raises(ValueError, match="a clip time past its"):
        Loader(
            _config(url, frames=3, seconds={"run/e": [5.0]}), batch_size=1, storage_options=options
        )


def test_clips_of_two_datasets_mix_in_their_proportions(s3_bucket: Any, tmp_path: Path) -> None:
    urls, options = [], s3_bucket.options()
    for part, count in (("x", 4), ("y", 2)):
        _write(
            tmp_path / part,
            tuple((f"{part}/v{n}.mp4", "libx264", "mp4", 16, 8, False) for n in range(count)),
        )
        urls.append(f"{s3_bucket.url}/{part}")
        stoker.pack(tmp_path / part, urls[-1], storage_options=options)
    config = SourceConfig(
        urls,
        mix=stoker.MixConfig(samples_per_epoch=(8, 8), replacement=True),
        video=VideoConfig(frames=4, clips_per_video=2),
    )
    with Loader(config, batch_size=4, seed=3, storage_options=options) as loader:
        clips = _clips(loader)
    by_source = {k: [c for c in clips if int(c["source"]) == k] for k in (0, 1)}
    assert len(by_source[0]) == len(by_source[1]) == 8
    # The second dataset's 4 clips twice over; the first's 8 once each.
    assert len({(c["key"], int(c["first_frame"])) for c in by_source[0]}) == 8
    assert len({(c["key"], int(c["first_frame"])) for c in by_source[1]}) == 4
    assert clips[0]["image"].shape == (4, 96, 160, 3)
    with pytest.raises(ValueError, match="take no window"):
        SourceConfig(urls[0], video=VideoConfig(frames=2), window=stoker.WindowConfig(size=2))
