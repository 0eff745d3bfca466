"""The source stays in small modules (STYLE: one concept per module, under ~400 lines)."""

from __future__ import annotations

from pathlib import Path

import stoker

SRC = Path(stoker.__file__).resolve().parent
MAX_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    sizes = {
        str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
        for path in SRC.rglob("*.py")
    }
    assert len(sizes) > 50  # the whole package was read
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_the_loader_module_reads_as_its_pipeline_in_400_lines() -> None:
    # Its stages live in plan, prefetch and batching; the Loader only joins them.
    lines = (SRC / "pipeline" / "loader.py").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 400
