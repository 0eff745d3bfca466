"""A quiet machine and compiled bytecode for the processes a benchmark times.

A first batch counted from a process's start should count what a user's process does: its
imports from an installed package's bytecode, on a machine no other job is using. Two
things get in the way on a development machine: ``PYTHONDONTWRITEBYTECODE`` (set here), with
which every child compiles the sources edited since their ``.pyc`` again (0.85 s of
stoker's imports with no bytecode against 0.20 s), and the last run's work (data being
flushed, the server compacting). :func:`compiled_interpreters` gives every interpreter
started afterwards one bytecode folder, filled by untimed imports; :func:`settle` waits
for the cores and the server to go quiet before each timed run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness import cpu_seconds

#: The machine counts as settled when its cores are this busy at most (share of all).
SETTLED_BUSY = 0.10


def _busy_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def settle(server_pid: int | None, timeout_s: float) -> dict[str, float]:
    """Wait until the machine is quiet: its cores at most SETTLED_BUSY busy and the server
    idle over 0.25 s, twice in a row (or ``timeout_s`` passed). Returns the wait and the
    last busy share seen."""
    started = time.perf_counter()
    quiet, busy = 0, 1.0
    while quiet < 2 and time.perf_counter() - started < timeout_s:
        before, server_before = _busy_ticks(), cpu_seconds(server_pid) if server_pid else 0.0
        time.sleep(0.25)
        after, server_after = _busy_ticks(), cpu_seconds(server_pid) if server_pid else 0.0
        busy = (after[0] - before[0]) / max(1, after[1] - before[1])
        server_quiet = server_after - server_before < 0.02
        quiet = quiet + 1 if busy <= SETTLED_BUSY and server_quiet else 0
    return {"settle_s": time.perf_counter() - started, "busy_before": busy}


def settled_text(rows: Sequence[object]) -> str:
    """What :func:`settle` found before the runs whose results are ``rows`` (dicts that
    carry its ``settle_s`` and ``busy_before``; others are passed over), for a report."""
    found = [r for r in rows if isinstance(r, dict) and "settle_s" in r]
    if not found:
        return "not recorded"
    waits = [r["settle_s"] for r in found]
    busy = [r["busy_before"] for r in found]
    return (
        f"waits of {min(waits):.1f}-{max(waits):.1f} s; the cores were "
        f"{min(busy):.0%}-{max(busy):.0%} busy as the runs started"
    )


def compiled_interpreters(
    pycache: Path, warm: Sequence[Sequence[str] | tuple[Sequence[str], Mapping[str, str]]]
) -> None:
    """Every interpreter started from now on reads (and writes) its bytecode in
    ``pycache``; one untimed run of each ``warm`` command (a script and its arguments that
    import a method's modules and exit; or a pair of such a command and the extra
    environment it needs, a library's PYTHONPATH say) compiles it there."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(pycache)
    for item in warm:
        command, extra = item if isinstance(item, tuple) else (item, {})
        done = subprocess.run(
            [sys.executable, *command], capture_output=True, text=True, env={**os.environ, **extra}
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
