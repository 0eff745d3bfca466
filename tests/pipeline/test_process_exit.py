"""A script whose Loader decodes in processes exits without calling ``close()`` (issue 32,
item 5): at exit, multiprocessing waited for the task queue's feeder thread, which was
writing tasks queued ahead into a pipe the ended workers no longer read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stoker.testing.images import write_packed_images

SCRIPT = """
import sys

import numpy as np

from stoker import DecodeConfig
from stoker.pipeline.loader import Loader


def thumbnail(image):
    return np.asarray(image.resize((8, 8)), dtype=np.uint8)


if __name__ == "__main__":
    url, stop_after = sys.argv[1], int(sys.argv[2])
    loader = Loader(
        url,
        batch_size=8,
        seed=0,
        transform=thumbnail,
        decode=DecodeConfig(method="process", threads=2),
    )
    samples = 0
    for number, batch in enumerate(loader):
        samples += len(batch["label"])
        if number + 1 == stop_after:
            break
    print("samples", samples, flush=True)
    # no loader.close(): the script just ends
"""


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("process-exit"),
        files=40,
        classes=2,
        width=320,  # tasks of 8 JPEGs are larger than a pipe's 64 kB buffer
        height=240,
        samples_per_shard=10,
    )


@pytest.mark.parametrize(("stop_after", "samples"), [(0, 40), (2, 16)], ids=["epoch", "break"])
def test_a_process_decoding_script_exits_without_close(
    dataset_url: str, tmp_path: Path, stop_after: int, samples: int
) -> None:
    script = tmp_path / "no_close.py"
    script.write_text(SCRIPT)
    try:
        done = subprocess.run(
            [sys.executable, str(script), dataset_url, str(stop_after)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            "a script using DecodeConfig(method='process') did not exit within 60 s of its "
            f"start without loader.close(); its output: {exc.stdout!r} {exc.stderr!r}"
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["samples", str(samples)], done.stderr[-2000:]
