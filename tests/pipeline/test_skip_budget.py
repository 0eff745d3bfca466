"""The failure budget through the Loader: DecodeConfig(on_error="skip", max_skipped=...).

Samples with invalid JSON in WebDataset tars written by the webdataset library and indexed
in place (as in test_bad_members.py). Under the budget, the good samples are delivered and
the bad ones counted, listed in stats and written to the skipped file; past it, the loader
stops with SkipBudgetError listing them; a resumed run goes on counting where its state
stopped and skips what an uninterrupted run skips.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from stoker import DecodeConfig
from stoker.errors import SkipBudgetError
from stoker.pack.indexer import index_webdataset
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig

SAMPLES = 24
PER_SHARD = 12
#: In order, batches of 4: batch 0 holds one, batch 1 one, batch 3 one, batch 4 one.
BAD = {2: "rec0002", 7: "rec0007", 13: "rec0013", 19: "rec0019"}
IN_ORDER = OrderConfig(mode="none")


def write_bad_tars(root: Path) -> str:
    """Two WebDataset tars of 12 samples, four of them with invalid JSON, indexed."""
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    for shard in range(SAMPLES // PER_SHARD):
        with wds.TarWriter(str(root / f"records-{shard:04d}.tar"), encoder=False) as sink:
            for i in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
                meta = b'{"i": ' if i in BAD else json.dumps({"i": i}).encode()
                sink.write({"__key__": f"rec{i:04d}", "json": meta, "cls": b"0"})
    index_webdataset(root)
    return str(root)


@pytest.fixture(scope="module")
def bad_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_bad_tars(tmp_path_factory.mktemp("skips") / "ds")


def _loader(url: str, **decode: Any) -> Loader:
    return Loader(
        url,
        batch_size=4,
        order=decode.pop("order", IN_ORDER),
        decode=DecodeConfig(threads=2, on_error="skip", **decode),
    )


GOOD = [f"rec{i:04d}" for i in range(SAMPLES) if i not in BAD]


@pytest.mark.parametrize("budget", [4, 4 / 24 + 0.001])
def test_under_the_budget_skips_are_delivered_listed_and_written(
    bad_url: str, tmp_path: Path, budget: float
) -> None:
    path = tmp_path / "skipped.jsonl"
    with _loader(bad_url, max_skipped=budget, skipped_file=path) as loader:
        for _ in range(2):  # the count starts again with each epoch
            keys = [key for batch in loader for key in batch["key"]]
            assert keys == GOOD
        stats = loader.stats()
    assert [key for key, _ in stats.skipped] == [*BAD.values(), *BAD.values()]
    assert all("invalid JSON" in reason for _, reason in stats.skipped)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["key"], line["epoch"]) for line in lines] == [
        (key, epoch) for epoch in range(2) for key in BAD.values()
    ]
    assert [line["shard"] for line in lines[:4]] == [
        f"records-{i // PER_SHARD:04d}.tar" for i in BAD
    ]
    assert all("invalid JSON" in line["reason"] and line["url"] == bad_url for line in lines)


def test_past_the_budget_the_loader_stops_with_the_list(bad_url: str, tmp_path: Path) -> None:
    path = tmp_path / "skipped.jsonl"
    delivered: list[str] = []
    with _loader(bad_url, max_skipped=3, skipped_file=path) as loader:
        batches = iter(loader)
        for _ in range(4):
            delivered += next(batches)["key"]
        with pytest.raises(SkipBudgetError) as caught:
            next(batches)
    message = str(caught.value)
    assert "epoch 0: 4 samples skipped, more than max_skipped=3 allows" in message
    assert "'rec0002': " in message
    assert "invalid JSON" in message
    assert str(path) in message
    assert [key for key, _ in caught.value.skipped] == list(BAD.values())
    # Batches 0-3 were delivered; batch 4, whose skip is the fourth, was not.
    assert delivered == [key for key in GOOD if int(key[3:]) < 16]
    assert loader.state_dict()["batches"] == 4
    assert loader.state_dict()["skipped"] == 3  # the batch not delivered is not counted
    # The file lists every skip found, the last one too.
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == list(BAD.values())
    # The error survives pickling (a DataLoader worker's error travels so), list and all.
    copy = pickle.loads(pickle.dumps(caught.value))  # noqa: S301  # our own bytes
    assert copy.skipped == caught.value.skipped
    assert str(copy) == message


def test_a_share_of_the_epoch_is_a_count_of_its_samples(bad_url: str) -> None:
    # 0.1 of 24 samples: 2 may be skipped; the third stops the loader.
    with _loader(bad_url, max_skipped=0.1) as loader, pytest.raises(SkipBudgetError) as caught:
        list(loader)
    assert "3 samples skipped, more than max_skipped=0.1, 2 of the rank's 24 samples" in str(
        caught.value
    )
    assert [key for key, _ in caught.value.skipped] == list(BAD.values())[:3]


def test_no_budget_counts_and_lists_as_before(bad_url: str) -> None:
    with _loader(bad_url) as loader:
        keys = [key for batch in loader for key in batch["key"]]
        assert loader.state_dict()["skipped"] == 0  # the next epoch's, not begun
    assert keys == GOOD


def _rest_after(url: str, state: dict[str, Any], **decode: Any) -> tuple[list[str], Loader]:
    loader = _loader(url, **decode)
    loader.load_state_dict(state)
    return [key for batch in loader for key in batch["key"]], loader


@pytest.mark.parametrize("order", [IN_ORDER, OrderConfig(block_size=2, seed=5)])
def test_a_resumed_run_skips_what_an_uninterrupted_one_does(
    bad_url: str, order: OrderConfig
) -> None:
    with _loader(bad_url, order=order) as whole:
        whole.set_epoch(1)
        full = [key for batch in whole for key in batch["key"]]
        skipped_whole = [key for key, _ in whole.stats().skipped]
    for stop in range(1, 6):
        with _loader(bad_url, order=order) as first:
            first.set_epoch(1)
            batches = iter(first)
            got = [
                key for _, batch in zip(range(stop), batches, strict=False) for key in batch["key"]
            ]
            state = first.state_dict()
            before = [key for key, _ in first.stats().skipped]
            first.close()
        assert state["skipped"] == len(before)
        rest, resumed = _rest_after(bad_url, state, order=order)
        with resumed:
            assert got + rest == full
            assert before + [key for key, _ in resumed.stats().skipped] == skipped_whole


def test_a_resumed_run_goes_on_counting_toward_the_budget(bad_url: str) -> None:
    with _loader(bad_url) as first:
        batches = iter(first)
        for _ in range(2):  # batches 0 and 1: two skipped
            next(batches)
        state = first.state_dict()
    assert state["skipped"] == 2
    loader = _loader(bad_url, max_skipped=3)
    loader.load_state_dict(state)
    with loader, pytest.raises(SkipBudgetError) as caught:
        list(loader)  # batch 3 skips the third, batch 4 the fourth: past 3
    assert "4 samples skipped (2 of them before the resume point" in str(caught.value)
    assert [key for key, _ in caught.value.skipped] == ["rec0013", "rec0019"]
    # Without "skipped" (a state saved before the budget existed) the count starts at 0.
    old = {k: v for k, v in state.items() if k != "skipped"}
    rest, resumed = _rest_after(bad_url, old, max_skipped=3)
    with resumed:
        assert rest == [key for key in GOOD if int(key[3:]) >= 8]


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"max_skipped": True}, TypeError, "max_skipped must be an int count, a float share"),
        ({"max_skipped": "3"}, TypeError, "max_skipped must be an int count"),
        ({"max_skipped": -1}, ValueError, "max_skipped must be >= 0, got -1"),
        ({"max_skipped": 1.0}, ValueError, r"a share of the epoch in \(0, 1\), got 1.0"),
        ({"max_skipped": 0.0}, ValueError, r"a share of the epoch in \(0, 1\), got 0.0"),
        ({"max_skipped": float("nan")}, ValueError, "a share of the epoch"),
        ({"skipped_file": 3}, TypeError, "skipped_file must be a path"),
    ],
)
def test_a_budget_that_cannot_work_is_refused_by_name(
    settings: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        DecodeConfig(on_error="skip", **settings)


def test_a_budget_without_skipping_is_refused() -> None:
    with pytest.raises(ValueError, match="max_skipped=3 bounds the samples skipped, but none"):
        DecodeConfig(max_skipped=3)


def test_a_state_with_a_bad_skipped_count_is_refused(bad_url: str) -> None:
    with _loader(bad_url) as loader:
        state = {**loader.state_dict(), "skipped": -1}
        with pytest.raises(ValueError, match=r"state\['skipped'\] must be >= 0"):
            loader.load_state_dict(state)
