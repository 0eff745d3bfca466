"""The doctor's verdict follows the evidence: where the waits fell and whether the stage
waited on was saturated."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from stoker.core.metrics import Stage, StageTotals
from stoker.pack.packer import pack
from stoker.pipeline.loader import Loader
from stoker.profile import doctor, measure
from stoker.profile.advice import format_diagnosis
from stoker.testing.images import write_image_folder


@pytest.fixture(scope="module")
def loader(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("phases")
    write_image_folder(root / "src", files=16, classes=2, width=16, height=12)
    pack(root / "src", root / "ds")
    with Loader(str(root / "ds"), batch_size=4) as opened:
        yield opened


def _measured(phases: dict[str, float], *, decode_s: float, epochs: int) -> Any:
    """A 1 s window in which the loop waited 0.2 s on decoding, spread as ``phases`` says."""
    stages = {
        Stage.DECODE: StageTotals(decode_s, 10, 640),
        Stage.WAIT_DECODE: StageTotals(0.2, 10, 640),
    }
    return measure.Measured(
        step_s=0.025,
        step="sleep",
        wait_s=0.2,
        step_total_s=0.8,
        window_s=1.0,
        cpu_s=0.0,
        stages=stages,
        requests={},
        batches=32,
        samples=2048,
        first_batch_s=0.1,
        wait_phases=phases,
        epochs=epochs,
        origin_s=0.0,
        window_start_s=0.0,
        events=(),
    )


def test_waits_at_epoch_starts_on_idle_decoders_are_named_so(
    loader: Loader, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor.os, "getloadavg", lambda: (0.2, 0.2, 0.2))  # a quiet machine
    threads = loader.num_threads
    # Decode threads busy 30% of the time; 90% of the waiting in the epochs' first batches.
    at_starts = _measured(
        {"first_batch": 0.0, "epoch_start": 0.18, "steady": 0.02},
        decode_s=0.3 * threads,
        epochs=4,
    )
    found = doctor._conclude(loader, "python", at_starts)
    text = format_diagnosis(found)
    assert (
        found.verdict
        == "input-bound: decode (at epoch starts; decode threads 30% busy: not saturated)"
    )
    assert found.saturated is False
    assert "epoch starts 180 ms (90%)" in text
    assert "drained between epochs" in found.advice[0]
    assert "not saturated" in found.advice[1]
    assert found.to_dict()["wait_phases"]["epoch_start"] == 0.18
    # Saturated decoders waited on all along: the plain verdict.
    steady = _measured(
        {"first_batch": 0.0, "epoch_start": 0.02, "steady": 0.18}, decode_s=0.9 * threads, epochs=4
    )
    found = doctor._conclude(loader, "python", steady)
    assert found.verdict == "input-bound: decode"
    assert found.saturated is True
    assert not any("drained" in line for line in found.advice)


def test_phases_of_batches() -> None:
    assert measure.phase(1, 1, 1, 5) == "first_batch"
    assert measure.phase(2, 1, 2, 5) == "steady"  # the first epoch fills: not an epoch start
    assert measure.phase(40, 2, 1, 5) == "epoch_start"
    assert measure.phase(45, 2, 6, 5) == "steady"
    assert measure.phase(45, 2, 1, 0) == "steady"  # epochs of fewer than 4 batches


def test_the_summary_says_what_the_verdict_rests_on(
    loader: Loader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's doctor line: a compute-bound verdict with the share waited, where the
    waits fell and how busy the decode threads and the store were."""
    monkeypatch.setattr(doctor.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    measured = _measured(
        {"first_batch": 0.0, "epoch_start": 0.01, "steady": 0.03},
        decode_s=0.3 * loader.num_threads,
        epochs=4,
    )
    quiet = replace(measured, wait_s=0.04, step_total_s=0.96)
    found = doctor._conclude(loader, "python", quiet)
    assert found.verdict == "compute-bound"
    assert found.summary() == (
        "compute-bound: waited for data 4% of the time (epoch starts 25%, steady state 75%); "
        "decode threads 30% busy, requests in flight 0% of the time"
    )
