"""benchmarks/harness.py: the order of rounds, medians, the clock from a child's launch."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import harness  # noqa: E402


def test_each_method_takes_each_place_over_as_many_rounds() -> None:
    methods = ["a", "b", "c"]
    orders = [harness.rotated(methods, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for place in range(3):
        assert sorted(order[place] for order in orders) == methods


def test_median_of_takes_each_numbers_median_and_keeps_the_rest() -> None:
    runs = [{"rate": 1.0, "name": "x"}, {"rate": 5.0, "name": "y"}, {"rate": 3.0, "name": "z"}]
    merged = harness.median_of(runs)
    assert merged["rate"] == 3.0
    assert merged["name"] == "x"
    assert merged["runs"] == 3


def test_strongest_is_the_fastest_baseline_that_ran() -> None:
    rows = {"ours": {"r": 9.0}, "b1": {"r": 2.0}, "b2": {"r": 4.0}}
    assert harness.strongest(rows, ["b1", "b2", "missing"], "r") == ("b2", 4.0)
    assert harness.strongest(rows, ["missing"], "r") is None


def test_a_smoke_run_says_its_ratios_are_not_quotable() -> None:
    assert "not to be quoted" in "\n".join(harness.method_lines(1, "c", "s"))
    assert "not to be quoted" not in "\n".join(harness.method_lines(3, "c", "s"))


def test_run_child_counts_from_the_launch_and_passes_events(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(BENCHMARKS)!r})
            from harness import emit, event
            first = time.time()
            event("epoch", epoch=1)
            emit({{"units": 10, "first_batch_at": first, "ended_at": time.time(),
                  "things_per_s": 123.0}})
            """
        )
    )
    events: list[dict[str, object]] = []
    result = harness.run_child(
        script, [], env={"PATH": ""}, rate_key="things_per_s", on_event=events.append
    )
    assert [e["event"] for e in events] == ["epoch"]
    assert result["units"] == 10
    assert result["loop_things_per_s"] == 123.0
    assert 0 < result["first_batch_s"] <= result["total_s"] <= result["wall_s"]
    assert result["things_per_s"] == 10 / result["total_s"]
    assert result["clock"] == "launch"
