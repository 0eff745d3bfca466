"""The failure budget through TorchLoader with DataLoader workers: it holds over every
worker of the rank (each of two workers alone stays under it), the error is raised in
the training process with the list, the skipped list and file are complete across
workers, and a state saved mid-epoch carries the workers' summed count.

Four samples of 24 have invalid JSON; in order, batches of 4 put them in batches 0 and 4
(worker 0) and 1 and 3 (worker 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stoker import DecodeConfig
from stoker.errors import SkipBudgetError
from stoker.integrations.torch import TorchLoader
from stoker.pack.indexer import index_webdataset
from stoker.pipeline.order import OrderConfig

SAMPLES = 24
PER_SHARD = 12
BAD = {2: "rec0002", 7: "rec0007", 13: "rec0013", 19: "rec0019"}
GOOD = [f"rec{i:04d}" for i in range(SAMPLES) if i not in BAD]


@pytest.fixture(scope="module")
def bad_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    import webdataset as wds

    root = tmp_path_factory.mktemp("torch-skips") / "ds"
    root.mkdir()
    for shard in range(SAMPLES // PER_SHARD):
        with wds.TarWriter(str(root / f"records-{shard:04d}.tar"), encoder=False) as sink:
            for i in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
                meta = b'{"i": ' if i in BAD else json.dumps({"i": i}).encode()
                sink.write({"__key__": f"rec{i:04d}", "json": meta, "cls": b"0"})
    index_webdataset(root)
    return str(root)


def _loader(url: str, context: str = "fork", **decode: Any) -> TorchLoader:
    return TorchLoader(
        url,
        batch_size=4,
        num_workers=2,
        multiprocessing_context=context,
        order=OrderConfig(mode="none"),
        decode=DecodeConfig(on_error="skip", **decode),
    )


def test_under_the_budget_every_workers_skips_are_listed_and_written(
    bad_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "skipped.jsonl"
    with _loader(bad_url, max_skipped=4, skipped_file=path) as loader:
        keys = [key for batch in loader for key in batch["key"]]
        stats = loader.stats()
    assert keys == GOOD
    assert sorted(key for key, _ in stats.skipped) == sorted(BAD.values())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(line["key"] for line in lines) == sorted(BAD.values())
    shards = {line["key"]: line["shard"] for line in lines}
    assert shards == {key: f"records-{i // PER_SHARD:04d}.tar" for i, key in BAD.items()}


def test_past_the_budget_over_all_workers_the_training_process_raises(bad_url: str) -> None:
    # Each worker skips two samples: under 3 alone, past it together. Spawned workers, as
    # by default.
    delivered: list[str] = []
    with _loader(bad_url, context="spawn", max_skipped=3) as loader:
        batches = iter(loader)
        for _ in range(4):
            delivered += next(batches)["key"]
        assert loader.state_dict()["skipped"] == 3  # summed over both workers
        with pytest.raises(SkipBudgetError) as caught:
            next(batches)
    assert "epoch 0: 4 samples skipped, more than max_skipped=3 allows" in str(caught.value)
    assert [key for key, _ in caught.value.skipped] == list(BAD.values())
    assert all("invalid JSON" in reason for _, reason in caught.value.skipped)
    assert delivered == [key for key in GOOD if int(key[3:]) < 16]


def test_a_restored_state_goes_on_counting_over_the_workers(bad_url: str) -> None:
    with _loader(bad_url) as first:
        batches = iter(first)
        head = [key for _ in range(3) for key in next(batches)["key"]]
        state = first.state_dict()
    assert state["skipped"] == 2  # batches 0 (worker 0) and 1 (worker 1)
    with _loader(bad_url, max_skipped=3) as resumed:
        resumed.load_state_dict(state)
        assert resumed.state_dict()["skipped"] == 2
        batches = iter(resumed)
        head += next(batches)["key"]  # batch 3: the third skip
        with pytest.raises(SkipBudgetError) as caught:
            next(batches)  # batch 4: the fourth
    assert "4 samples skipped (2 of them before the resume point" in str(caught.value)
    assert [key for key, _ in caught.value.skipped] == ["rec0013", "rec0019"]
    assert head == [key for key in GOOD if int(key[3:]) < 16]
    # Under a budget that holds, the rest of the epoch skips what an uninterrupted run does.
    with _loader(bad_url, max_skipped=4) as resumed:
        resumed.load_state_dict(state)
        rest = [key for batch in resumed for key in batch["key"]]
        assert sorted(key for key, _ in resumed.stats().skipped) == ["rec0013", "rec0019"]
    assert rest == [key for key in GOOD if int(key[3:]) >= 12]
