"""Process mode's shared memory follows the real batches: their length and output size."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import DecodeConfig
from stoker.pipeline import workers
from stoker.pipeline.loader import Loader
from stoker.testing.images import write_packed_images

SAMPLES = 10


def thumbnail(image: Any) -> np.ndarray:
    """A transform written in Python, of an output size stoker cannot know beforehand."""
    return np.asarray(image.resize((8, 8)), dtype=np.uint8)  # 192 bytes


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("process-shm"),
        files=SAMPLES,
        classes=2,
        width=64,
        height=48,
        samples_per_shard=5,
    )


def test_the_arena_is_sized_by_the_real_batch(
    dataset_url: str,
    small_tmpfs: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # batch_size 256 of 1 MiB guesses would want hundreds of MB; the real batches are 10
    # samples of 192 bytes, which fit a 1 MiB /dev/shm many times over.
    monkeypatch.setattr(workers, "SHM_DIR", small_tmpfs("1m"))
    caplog.set_level(logging.WARNING, logger="stoker.pipeline.workers")
    options: dict[str, Any] = {"batch_size": 256, "seed": 1, "transform": thumbnail}
    with Loader(dataset_url, **options) as loader:
        expected = list(loader)
    process = DecodeConfig(method="process", threads=2)
    with Loader(dataset_url, **options, decode=process) as loader:
        got = list(loader)
        decoder = loader._batches._processes
        assert decoder is not None
        assert decoder.uses_shared_memory
        assert decoder.slot_bytes == SAMPLES * 8 * 8 * 3
    assert "shared memory" not in caplog.text
    for a, b in zip(expected, got, strict=True):
        assert a["key"] == b["key"]
        np.testing.assert_array_equal(a["image"], b["image"])
