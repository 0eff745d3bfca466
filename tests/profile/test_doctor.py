"""stoker doctor names the bottleneck: planted slow store, slow decode, slow transform and
slow consumer; its trace is valid Chrome-trace JSON and its picture a PNG."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from stoker import DecodeConfig
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.profile.advice import format_diagnosis
from stoker.profile.doctor import Diagnosis, diagnose
from stoker.profile.plots import render_doctor
from stoker.profile.trace import chrome_trace, write_chrome_trace
from stoker.testing.images import make_jpeg, with_comment, write_image_folder
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """96 tiny JPEGs (64x48, ~2 kB): nothing to decode."""
    root = tmp_path_factory.mktemp("small")
    write_image_folder(root / "src", files=96, classes=4, width=64, height=48)
    pack(root / "src", root / "ds", config=PackConfig(samples_per_shard=32))
    return root


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> str:
    """24 photos of 1500x1000: decoding them in full keeps a thread busy."""
    root = tmp_path_factory.mktemp("large")
    rng = np.random.default_rng(1)
    pool = [make_jpeg(rng, width=1500, height=1000, quality=90) for _ in range(3)]
    for i in range(24):
        folder = root / "src" / f"class_{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{i:03d}.jpg").write_bytes(with_comment(pool[i % 3], str(i).encode()))
    pack(root / "src", root / "ds")
    return str(root / "ds")


def _check(diagnosis: Diagnosis, expected: str) -> None:
    assert diagnosis.verdict == expected, format_diagnosis(diagnosis)


def test_slow_store(small: Path, s3_server: SeaweedServer, s3_bucket: Any) -> None:
    url = f"{s3_bucket.url}/ds"
    pack(small / "src", url, storage_options=s3_bucket.options(), config=PackConfig())
    link = LinkConfig(rtt_s=0.12, bandwidth_bytes_s=400_000)
    with (
        NetProxy("127.0.0.1", s3_server.port, link=link) as slow,
        Loader(
            url,
            batch_size=8,
            transform=RandomResizedCrop(16),
            storage_options=s3_bucket.options(slow.endpoint),
            order=OrderConfig(block_size=4, group_blocks=1),
        ) as loader,
    ):
        diagnosis = diagnose(loader, step_s=0.002, max_batches=8)
    print(format_diagnosis(diagnosis))
    _check(diagnosis, "input-bound: store")
    assert diagnosis.dominant_stage == "fetch"
    assert diagnosis.wait_shares["store"] > 0.5
    assert any("prefetch=" in line for line in diagnosis.advice)
    assert any("CacheConfig(dir=" in line for line in diagnosis.advice)


def test_slow_decode(large: str) -> None:
    with Loader(large, batch_size=4, decode=DecodeConfig(threads=1)) as loader:  # full-size decode
        diagnosis = diagnose(loader, step_s=0.002)
    print(format_diagnosis(diagnosis))
    _check(diagnosis, "input-bound: decode")
    assert diagnosis.dominant_stage == "decode"
    assert diagnosis.wait_shares["decode"] > 0.5
    assert any("decode=DecodeConfig(threads=" in line for line in diagnosis.advice)
    assert any("RandomResizedCrop" in line for line in diagnosis.advice)


def test_slow_python_transform(small: Path) -> None:
    def heavy(image: Any) -> Any:
        end = time.perf_counter() + 0.004  # holds the GIL, as Python augmentation does
        while time.perf_counter() < end:
            pass
        return np.asarray(image.resize((16, 16)))

    with Loader(
        str(small / "ds"), batch_size=8, transform=heavy, decode=DecodeConfig(threads=2)
    ) as loader:
        diagnosis = diagnose(loader, step_s=0.002)
    print(format_diagnosis(diagnosis))
    _check(diagnosis, "input-bound: transform")
    assert any("processes" in line for line in diagnosis.advice)


def test_slow_consumer(small: Path) -> None:
    with Loader(str(small / "ds"), batch_size=8, transform=RandomResizedCrop(16)) as loader:
        diagnosis = diagnose(loader, step_s=0.06, max_batches=8)
    print(format_diagnosis(diagnosis))
    _check(diagnosis, "compute-bound")
    assert diagnosis.bottleneck == "consumer"
    assert diagnosis.input_bound_share < 0.1
    assert diagnosis.advice[0].startswith("Nothing to change")


def test_bad_arguments_and_empty_windows_are_refused(small: Path) -> None:
    with Loader(str(small / "ds"), batch_size=32) as loader:
        with pytest.raises(ValueError, match="step_s"):
            diagnose(loader, step_s=-1)
        with pytest.raises(ValueError, match="no batches after the 5 warm-up batches"):
            diagnose(loader, step_s=0, warmup_batches=5)  # one epoch: 3 batches


@pytest.fixture(scope="module")
def traced(small: Path) -> Diagnosis:
    with Loader(
        str(small / "ds"),
        batch_size=8,
        transform=RandomResizedCrop(16),
        order=OrderConfig(block_size=4, group_blocks=1),
        decode=DecodeConfig(threads=2),
    ) as loader:
        return diagnose(loader, step_s=0.005)


def test_trace_is_valid_chrome_trace_json(traced: Diagnosis, tmp_path: Path) -> None:
    path = write_chrome_trace(traced.events, tmp_path / "trace.json", origin_s=traced.origin_s)
    trace = json.loads(path.read_text(encoding="utf-8"))
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(traced.events)
    for event in spans:
        assert {"ph", "ts", "dur", "pid", "tid", "name"} <= set(event)
        assert isinstance(event["ts"], float | int)
        assert event["ts"] >= 0
        assert event["dur"] >= 0
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {e["tid"] for e in spans} <= set(names)
    assert {"consumer", "pipeline", "io 0"} <= set(names.values())
    assert any(name.startswith("decode") for name in names.values())
    # Microseconds: the consumer's spans add up to the run's length in seconds x 1e6.
    consumer = [e for e in spans if names[e["tid"]] == "consumer"]
    covered = max(e["ts"] + e["dur"] for e in consumer) - min(e["ts"] for e in consumer)
    run_s = max(e.start_s + e.seconds for e in traced.events) - traced.origin_s
    assert covered / 1e6 == pytest.approx(run_s, abs=0.05)
    by_tid: dict[int, list[tuple[float, float]]] = {}
    for event in spans:
        by_tid.setdefault(event["tid"], []).append((event["ts"], event["ts"] + event["dur"]))
    for tid, intervals in by_tid.items():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert end <= start + 1e-6, f"overlap on {names[tid]}"  # 1e-6 us: float sums
    # Reads overlap in time, so they need more than one io track.
    assert len([n for n in names.values() if n.startswith("io ")]) > 1


def test_chrome_trace_of_nothing_is_empty() -> None:
    trace = chrome_trace([])
    assert [e["ph"] for e in trace["traceEvents"]] == ["M"]


def test_doctor_png(traced: Diagnosis, tmp_path: Path) -> None:
    image = render_doctor(traced, width=1400)
    image.save(tmp_path / "doctor.png")
    with Image.open(tmp_path / "doctor.png") as loaded:
        assert loaded.format == "PNG"
        assert loaded.width == 1400
        assert 500 < loaded.height < 1200
        pixels = np.asarray(loaded.convert("RGB"))
    # The title is drawn in the verdict's colour, the timeline in the stages' colours.
    colours = {tuple(c) for c in pixels.reshape(-1, 3)[::7].tolist()}
    assert (228, 87, 86) in colours or (84, 162, 75) in colours
