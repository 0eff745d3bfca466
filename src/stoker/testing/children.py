"""Loader processes a scenario starts: ``python CHILD SPEC_JSON``, one per spec.

The throttling scenarios (:mod:`stoker.testing.throttled`) and the start-up storm
(:mod:`stoker.testing.storm`) each start several processes of a child script, hand each
its spec as one JSON argument, and keep the end of each one's stderr to say why it failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["failures", "start_children", "stderr_tails"]

#: Characters of a child's stderr kept to say why it failed.
TAIL_CHARS = 3000


def start_children(child: Path, specs: Sequence[Mapping[str, Any]]) -> list[subprocess.Popen[str]]:
    """Start ``python CHILD SPEC_JSON`` for each spec (stdout discarded, stderr kept)."""
    return [
        subprocess.Popen(
            [sys.executable, str(child), json.dumps(spec)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for spec in specs
    ]


def stderr_tails(
    children: Sequence[subprocess.Popen[str]], *, deadline: float | None = None
) -> list[str]:
    """Wait for every child and give the end of each one's stderr; one still running at
    ``deadline`` (a :func:`time.monotonic` time; None: no deadline) is killed, and its
    tail says so."""
    tails = []
    for process in children:
        left = None if deadline is None else max(0.1, deadline - time.monotonic())
        try:
            _, err = process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
            err += "\nkilled at its deadline"
        tails.append(err[-TAIL_CHARS:])
    return tails


def failures(children: Sequence[subprocess.Popen[str]], tails: Sequence[str]) -> list[str]:
    """The stderr tails of the children that ended with a non-zero status."""
    return [tail for process, tail in zip(children, tails, strict=True) if process.returncode]
