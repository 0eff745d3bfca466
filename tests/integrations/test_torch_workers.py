"""TorchLoader's DataLoader workers: they persist across epochs and still follow set_epoch
and restored states; a script without a ``__main__`` guard is told what to add; the adapter
reads what the Loader reads (an unpacked class folder too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker.format.reader import open_dataset
from stoker.integrations.torch import StokerIterableDataset, TorchLoader
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_image_folder

ORDER = OrderConfig(block_size=4, group_blocks=2)
CLASSES = 3


class StampPid:
    """A transform whose output is the id of the process that ran it."""

    def __call__(self, image: Any) -> np.ndarray:
        return np.full((1,), os.getpid(), dtype=np.int64)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("workers") / "src"
    write_image_folder(root, files=48, classes=CLASSES, width=24, height=16)
    return root


@pytest.fixture(scope="module")
def packed(folder: Path) -> str:
    out = folder.parent / "ds"
    pack(folder, out, config=PackConfig(samples_per_shard=12))
    return str(out)


def _keys(loader: TorchLoader) -> list[list[str]]:
    return [list(batch["key"]) for batch in loader]


def test_workers_persist_across_epochs_and_follow_set_epoch(packed: str) -> None:
    options: dict[str, Any] = {"batch_size": 6, "order": ORDER, "transform": StampPid()}
    alone = TorchLoader(packed, **options)
    expected = []
    for epoch in (0, 1, 3):
        alone.set_epoch(epoch)
        expected.append(_keys(alone))
    with TorchLoader(packed, num_workers=2, **options) as loader:
        pids, got = [], []
        for epoch in (0, 1, 3):  # 1: the next epoch by itself; 3: set_epoch skips one
            loader.set_epoch(epoch)
            batches = list(loader)
            got.append([list(b["key"]) for b in batches])
            pids.append({int(p) for b in batches for p in b["image"].flatten()})
    assert got == expected
    assert len(pids[0]) == 2
    assert os.getpid() not in pids[0]
    assert pids[0] == pids[1] == pids[2]  # the same two worker processes every epoch


def test_persistent_workers_resume_a_restored_state_exactly(packed: str) -> None:
    options: dict[str, Any] = {
        "batch_size": 5,
        "order": ORDER,
        "transform": RandomResizedCrop(8),
        "num_workers": 2,
        "multiprocessing_context": "fork",  # starts at once; spawn is tested above
    }
    full = _keys(TorchLoader(packed, **{**options, "num_workers": 0}))
    with TorchLoader(packed, **options) as loader:
        stream = iter(loader)
        head = [list(next(stream)["key"]) for _ in range(3)]
        state = loader.state_dict()
        del stream
        assert _keys(loader) == full  # iterating again starts the epoch anew
        loader.load_state_dict(state)  # the same workers continue from batch 3
        assert head + _keys(loader) == full
        assert loader.state_dict()["epoch"] == 1


def test_adapters_stream_an_unpacked_folder(folder: Path, packed: str) -> None:
    loader = TorchLoader(
        folder,
        batch_size=8,
        transform=RandomResizedCrop(8),
        num_workers=2,
        multiprocessing_context="fork",
    )
    with loader:
        labels = [int(label) for batch in loader for label in batch["label"]]
    assert len(loader) == 6
    assert sorted(labels) == sorted(i % CLASSES for i in range(48))
    names = [f"class_{c:02d}" for c in range(CLASSES)]
    assert loader.dataset.class_names == names
    assert TorchLoader(packed, batch_size=8).dataset.class_names == names
    assert StokerIterableDataset(open_dataset(packed), batch_size=8).class_names == names


GUARDLESS = """
from stoker.format.reader import open_dataset
from stoker.integrations.torch import TorchLoader
from stoker.pipeline.transforms import RandomResizedCrop

loader = TorchLoader({url!r}, batch_size=8, num_workers=2, transform=RandomResizedCrop(8))
for batch in loader:
    pass
print("done")
"""


def test_a_script_without_a_main_guard_is_told_what_to_add(packed: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(GUARDLESS.format(url=packed))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=tmp_path,
    )  # multiprocessing_context="fork" runs it: see the tests above
    assert done.returncode != 0
    assert "TorchLoader(num_workers=2)" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
    assert 'multiprocessing_context="fork"' in done.stderr
    # The training process says it too, beside torch's "exited unexpectedly".
    assert "before its first batch" in done.stderr


def test_the_workers_timeline_has_each_event_once(packed: str) -> None:
    """Each worker sends its new events with each batch: a later epoch (and the first
    batch made ahead for it) sends only what came after, not the timeline again."""
    options: dict[str, Any] = {"batch_size": 6, "order": ORDER, "transform": RandomResizedCrop(8)}
    with TorchLoader(packed, num_workers=2, **options) as loader:
        loader.trace()
        batches = sum(1 for epoch in range(3) for _ in loader)
        events = loader.events()
    assert batches == 3 * 8
    collated = [e for e in events if e.stage == "collate"]
    assert len(events) == len(set(events))  # no event twice
    assert batches <= len(collated) <= batches + 2  # + the workers' first of an epoch 4
