"""Where the benchmarks' reports go: ``benchmarks/out/NAME.json`` (every figure) and
``benchmarks/out/NAME.md`` (the table), the table printed too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"


def write_report(name: str, results: Mapping[str, Any], table: str) -> None:
    """Write ``out/{name}.json`` and ``out/{name}.md`` (``table``), and print ``table``."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (OUT / f"{name}.md").write_text(table + "\n")
    print(table)
