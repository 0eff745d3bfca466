"""The doctor names the stage that bounds the run, not the one waited on longest: decoders
15% busy behind a store with requests in flight 92% of the time are not the bound, and an
unpacked folder whose reads bound the run is told to pack, with its own URL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stoker import DecodeConfig
from stoker.core.metrics import Stage, StageTotals, TraceEvent
from stoker.pipeline.loader import Loader
from stoker.profile.advice import format_diagnosis
from stoker.profile.diagnosis import Diagnosis
from stoker.profile.doctor import _conclude
from stoker.profile.measure import Measured as _Measured
from stoker.testing.images import write_image_folder

WINDOW_S = 4.0


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An unpacked folder of 32 JPEGs, on a quiet machine of 2 cores."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    write_image_folder(tmp_path / "images", files=32, classes=2, width=32, height=24)
    return str(tmp_path / "images")


def _measured(*, decode_s: float, wait_decode_s: float, wait_fetch_s: float) -> _Measured:
    """A run as the issue saw it: fetches in flight 92% of a 4 s window (one after another,
    as a group's GETs come in), the loop waiting on decoding longer than on the store."""
    fetches = tuple(
        TraceEvent(Stage.FETCH, start_s=0.5 * n, seconds=0.46, lane="io", items=64, bytes=64_000)
        for n in range(8)
    )
    return _Measured(
        step_s=0.025,
        step="sleep",
        wait_s=wait_decode_s + wait_fetch_s,
        step_total_s=1.0,
        window_s=WINDOW_S,
        cpu_s=0.15 * WINDOW_S,
        stages={
            Stage.FETCH: StageTotals(3.7, 8, 512, 512_000),
            Stage.DECODE: StageTotals(decode_s, 64, 512, 0),
            Stage.WAIT_DECODE: StageTotals(wait_decode_s, 8, 512, 0),
            Stage.WAIT_FETCH: StageTotals(wait_fetch_s, 4, 0, 0),
        },
        requests={"requests.get": 512, "bytes.read": 512_000},
        batches=8,
        samples=512,
        first_batch_s=0.3,
        wait_phases={"first_batch": 0.0, "epoch_start": 0.0, "steady": 2.0},
        epochs=1,
        origin_s=0.0,
        window_start_s=0.0,
        events=fetches,
    )


def _conclude_on(url: str, measured: _Measured) -> Diagnosis:
    with Loader(url, batch_size=64, decode=DecodeConfig(threads=2)) as loader:
        return _conclude(loader, "cli", measured)


def test_idle_decoders_behind_a_busy_store_are_not_the_bound(folder: str) -> None:
    # Decode threads 15% busy (1.2 thread-seconds of 2 threads x 4 s), waited on 1.1 s;
    # the store waited on 0.8 s with requests in flight 92% of the time.
    d = _conclude_on(folder, _measured(decode_s=1.2, wait_decode_s=1.1, wait_fetch_s=0.8))
    text = format_diagnosis(d)
    assert d.load["decode_threads"] == pytest.approx(0.15)
    assert d.load["store"] == pytest.approx(0.92)
    assert d.verdict == "input-bound: store", text
    assert d.bottleneck == "store"
    assert d.saturated is True
    # Reads bound an unpacked folder: the first advice says so and packs it beside itself.
    first = d.advice[0]
    assert first.startswith(f"Reads bound this run: {folder} is an unpacked folder"), text
    assert "one GET per image (512 GETs of 1.0 kB on average, 128 a second)" in first, text
    assert f"`stoker pack {folder} {folder}-packed`" in first, text
    assert sum("stoker pack" in line for line in d.advice) == 1, text


def test_a_loaded_machine_does_not_make_idle_decoders_the_bound(
    folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A local test server and proxy load the machine past its cores (load 3 per core): the
    # decoders' own measures are still idle, and the reads were in flight all along.
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 6.0, 6.0))
    d = _conclude_on(folder, _measured(decode_s=1.2, wait_decode_s=1.1, wait_fetch_s=0.8))
    assert d.verdict == "input-bound: store", format_diagnosis(d)


def test_busy_decoders_stay_the_bound(folder: str) -> None:
    # The same waits with decode threads 90% busy: decoding is the bound, and no pack advice.
    d = _conclude_on(folder, _measured(decode_s=7.2, wait_decode_s=1.1, wait_fetch_s=0.8))
    assert d.verdict == "input-bound: decode", format_diagnosis(d)
    assert not any("stoker pack" in line and "-packed" in line for line in d.advice)


def test_idle_decoders_with_little_store_wait_stay_named_unsaturated(folder: str) -> None:
    # The store barely waited on (5% of the waits): the decoders started too late.
    d = _conclude_on(folder, _measured(decode_s=1.2, wait_decode_s=1.9, wait_fetch_s=0.1))
    assert d.verdict == "input-bound: decode (decode threads 15% busy: not saturated)"
