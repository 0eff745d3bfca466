"""The doctor's advice fits where it is read and agrees with what was measured: autotune's
choice, the stored image sizes; every line of it is in the picture; decode rows have one name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import ImageDraw

from stoker import DecodeConfig
from stoker.core.metrics import Stage, StageTotals, TraceEvent
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.profile.advice import advise, stored_shorter_side
from stoker.profile.diagnosis import Diagnosis
from stoker.profile.plots import advice_lines, render_doctor
from stoker.profile.trace import place_events
from stoker.testing.images import write_packed_images


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> str:
    """48 JPEGs of 64x48."""
    return write_packed_images(
        tmp_path_factory.mktemp("advice"),
        files=48,
        classes=3,
        width=64,
        height=48,
        samples_per_shard=16,
    )


def _decode_bound(**changes: Any) -> Diagnosis:
    """A diagnosis of a decode-bound run, as the doctor makes it (numbers made up)."""
    fields: dict[str, Any] = {
        "url": "file:///data",
        "verdict": "input-bound: decode",
        "bottleneck": "decode",
        "dominant_stage": "decode",
        "input_bound_share": 0.6,
        "wait_shares": {"store": 0.1, "decode": 0.8, "transform": 0.0, "collate": 0.0},
        "load": {
            "store": 0.2,
            "requests_in_flight": 0.3,
            "decode_busy": 0.9,
            "decode_threads": 0.9,
            "cpu": 0.4,
            "machine": 0.1,
        },
        "advice": [],
        "step_s": 0.01,
        "batch_size": 8,
        "num_threads": 1,
        "prefetch": 2,
        "batches": 10,
        "samples": 80,
        "seconds": 1.0,
        "first_batch_s": 0.1,
        "stages": {Stage.DECODE: StageTotals(0.9, 20, 80, 0)},
        "events": (),
    }
    fields.update(changes)
    return Diagnosis(**fields)


def test_settled_autotune_is_not_contradicted(small: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    tuned = DecodeConfig(threads="auto")  # thread tuning is opt-in
    with Loader(small, batch_size=8, transform=RandomResizedCrop(16), decode=tuned) as loader:
        # Autotune tried more threads and came back to 3: that is what the run chose.
        tuner = loader._tuner
        tuner.threads = loader.num_threads = 3
        tuner.phase = "settled"
        settled = advise(_decode_bound(), loader)
        tuner.phase = "more"
        tuning = advise(_decode_bound(), loader, advice_for="cli")
    with Loader(small, batch_size=8, decode=DecodeConfig(threads=3)) as fixed:
        chosen_by_hand = advise(_decode_bound(), fixed)
    assert not any("More decode threads" in line for line in settled), settled
    assert any("Autotune settled on 3 decode threads" in line for line in settled), settled
    assert not any("More decode threads" in line for line in tuning), tuning
    assert any("still choosing" in line and "doctor --seconds" in line for line in tuning), tuning
    # Threads the user fixed below the core count: more are worth trying.
    assert any(
        "More decode threads: Loader(decode=DecodeConfig(threads=8))" in line
        for line in chosen_by_hand
    ), chosen_by_hand


def test_pack_resize_only_when_stored_images_are_larger(small: str) -> None:
    with Loader(small, batch_size=8, transform=RandomResizedCrop(224)) as large_output:
        assert stored_shorter_side(large_output) == 48
        bigger = advise(_decode_bound(), large_output, advice_for="cli")
    with Loader(small, batch_size=8, transform=RandomResizedCrop(16)) as small_output:
        smaller = advise(_decode_bound(), small_output, advice_for="cli")
    assert not any("--resize" in line for line in bigger), bigger
    assert any("`stoker pack --resize 18`" in line for line in smaller), smaller
    assert any("shorter side of about 48 pixels" in line for line in smaller), smaller


def test_python_and_cli_advice_name_their_own_settings(small: str) -> None:
    with Loader(small, batch_size=8, decode=DecodeConfig(threads=1)) as loader:
        store_bound = _decode_bound(
            verdict="input-bound: store",
            bottleneck="store",
            dominant_stage="fetch",
            stages={Stage.FETCH: StageTotals(2.0, 10, 80, 80_000)},
        )
        python = advise(store_bound, loader)
        cli = advise(store_bound, loader, advice_for="cli")
    assert any("Loader(prefetch=" in line for line in python), python
    assert any("OrderConfig(block_size=" in line for line in python), python
    assert any("CacheConfig(dir=" in line for line in python), python
    assert any("--prefetch " in line for line in cli), cli
    assert any("--block-size " in line for line in cli), cli
    assert any("--cache-dir DIR" in line for line in cli), cli
    assert not any("Loader(prefetch" in line or "OrderConfig(" in line for line in cli), cli


def test_every_advice_line_is_in_the_png(monkeypatch: pytest.MonkeyPatch) -> None:
    words = " ".join(f"word{n}" for n in range(60))
    advice = [f"Item {n}: {words}" for n in range(5)]
    diagnosis = _decode_bound(advice=advice)
    drawn: list[str] = []
    draw_text = ImageDraw.ImageDraw.text

    def record(self: ImageDraw.ImageDraw, xy: Any, text: Any, *args: Any, **kwargs: Any) -> Any:
        drawn.append(str(text))
        return draw_text(self, xy, text, *args, **kwargs)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", record)
    image = render_doctor(diagnosis, width=1000)
    lines = advice_lines(diagnosis, width=1000)
    assert len(lines) > len(advice)  # each item wraps
    assert all(line in drawn for line in lines)
    # Rejoined, the drawn lines are the advice, every word of it, in order.
    text = " ".join(line.strip(" -") for line in lines if line)
    assert text == " ".join(advice)
    # The picture is tall enough to hold them: nothing is cropped off the bottom.
    pixels = np.asarray(image.convert("L"))
    assert pixels[-12:].min() == 255  # the bottom margin is blank
    assert image.height > 20 * len(lines)


def test_decode_rows_are_named_one_way() -> None:
    events = [
        TraceEvent(Stage.DECODE, 0.0, 1.0, "stoker-decode_0"),
        TraceEvent(Stage.DECODE, 0.0, 1.0, "stoker-decode_1"),
        # Autotune resized the pool: its new threads are named after the second pool.
        TraceEvent(Stage.DECODE, 2.0, 1.0, "stoker-decode-2_0"),
        TraceEvent(Stage.DECODE, 2.0, 1.0, "stoker-decode-2_1"),
        TraceEvent(Stage.DECODE, 2.0, 1.0, "stoker-decode-2_2"),
        TraceEvent(Stage.FETCH, 0.0, 0.5, "io"),
    ]
    _, tracks = place_events(events, origin_s=0.0)
    assert tracks == ["io 0", "decode 0", "decode 1", "decode 2"]
    # One thread alone is still "decode 0", as in the doctor's text and picture.
    _, alone = place_events([TraceEvent(Stage.DECODE, 0.0, 1.0, "stoker-decode_0")])
    assert alone == ["decode 0"]


def test_cli_doctor_writes_flags_and_its_png_holds_them(tmp_path: Path, small: str) -> None:
    from click.testing import CliRunner

    from stoker.cli.main import cli

    png = tmp_path / "doctor.png"
    args = ["doctor", small, "--step-ms", "0", "--batch-size", "8", "--batches", "4"]
    args += ["--threads", "1", "--prefetch", "2", "--block-size", "4", "--size", "16"]
    result = CliRunner().invoke(cli, [*args, "--out", str(png)])
    assert result.exit_code == 0, result.output
    advice = result.output.split("What to do:")[1]
    assert "Loader(" not in advice, advice
    assert "Config(" not in advice, advice
