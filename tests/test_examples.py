"""Every example runs, as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stoker.testing.seaweed import free_ports

# Examples another test runs as a user would, and checks further.
RUN_ELSEWHERE = {"lm_pretrain.py": "tests/test_lm_example.py (torchrun, 2 ranks, resumed)"}
EXAMPLES = sorted(
    p
    for p in (Path(__file__).resolve().parents[1] / "examples").glob("*.py")
    if p.name not in RUN_ELSEWHERE
)

# Examples started by a launcher rather than by plain python, as their docstrings say.
LAUNCHERS = {
    "torch_ddp.py": ["-m", "torch.distributed.run", "--nproc_per_node=2"],
}


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(example: Path) -> None:
    launcher = LAUNCHERS.get(example.name, [])
    if launcher:
        (port,) = free_ports(1)  # torchrun's --master_port=0 hangs its rendezvous
        launcher = [*launcher, f"--master_port={port}"]
    done = subprocess.run(
        [sys.executable, *launcher, str(example)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()


def test_the_examples_run_elsewhere_have_their_tests() -> None:
    root = Path(__file__).resolve().parents[1]
    for name, where in RUN_ELSEWHERE.items():
        test = root / where.split(" ")[0]
        assert (root / "examples" / name).is_file(), name
        assert name in test.read_text(), f"{test} does not run {name}"
