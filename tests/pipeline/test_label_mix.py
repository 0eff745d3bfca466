"""Label mix: batches against a uniform permutation, and pack's default shuffle delivering it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from stoker import OrderConfig, World
from stoker.cli.main import cli
from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.plan import resolve_order
from stoker.pipeline.quality import label_mix, read_cost, uniform_distinct_labels
from stoker.testing.images import write_image_folder


def test_uniform_expectation_is_exact() -> None:
    # Two labels of two samples each, batches of two: P(both labels) = 4 of 6 pairs.
    assert math.isclose(uniform_distinct_labels([2, 2], 2), 1 + 4 / 6)
    assert uniform_distinct_labels([5], 3) == 1.0
    assert uniform_distinct_labels([1] * 10, 10) == 10.0  # every label in the only batch


def test_sorted_and_shuffled_streams_score_as_expected() -> None:
    labels = np.repeat(np.arange(100), 30)
    shuffled = label_mix(labels, [np.random.default_rng(1).permutation(3000)], batch_size=128)
    assert 0.95 < shuffled.distinct_ratio < 1.05
    assert abs(shuffled.mean_tv_distance - shuffled.uniform_tv_distance) < 0.03
    in_order = label_mix(labels, [np.arange(3000)], batch_size=128)
    assert in_order.distinct_ratio < 0.1
    assert in_order.mean_tv_distance > 0.9
    assert in_order.batches == 23  # full batches only


@pytest.fixture(scope="module")
def sorted_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("classes")
    write_image_folder(root, files=3000, classes=100, width=16, height=12)
    return root  # class folders, listed in sorted order


def _distinct_ratio(url: Path, labels: np.ndarray, order: OrderConfig | None = None) -> float:
    streams = []
    for epoch in (0, 1):
        for rank in range(2):
            world = World(rank=rank, world_size=2)
            with Loader(str(url), batch_size=128, world=world, order=order) as loader:
                loader.set_epoch(epoch)
                streams.append(np.concatenate([b["index"] for b in loader]))
    return label_mix(labels, streams, batch_size=128).distinct_ratio


def test_packs_shuffle_by_default_so_batches_mix_classes(
    sorted_classes: Path, tmp_path: Path
) -> None:
    pack(sorted_classes, tmp_path / "shuffled", config=PackConfig(samples_per_shard=1000))
    shuffled = open_dataset(tmp_path / "shuffled")
    assert shuffled.index.packed_with["shuffle_seed"] == 0  # recorded in the index
    assert _distinct_ratio(tmp_path / "shuffled", shuffled.index.label) >= 0.95
    # The input's order, kept on request, is what the shuffle fixes.
    kept = PackConfig(samples_per_shard=1000, shuffle_seed=None)
    pack(sorted_classes, tmp_path / "kept", config=kept)
    in_order = open_dataset(tmp_path / "kept")
    assert in_order.index.label.tolist() == sorted(in_order.index.label.tolist())
    # Read as a shuffled pack is (long blocks, mixed within read groups only), a
    # class-sorted pack gives batches of few classes ...
    as_if_shuffled = resolve_order(
        None,
        seed=0,
        units=len(in_order),
        unit_bytes=float(in_order.index.length.mean()),
        shuffled=True,
    )
    assert as_if_shuffled.windows == 1
    assert _distinct_ratio(tmp_path / "kept", in_order.index.label, as_if_shuffled) < 0.5
    # ... and the default order, which mixes through a window of groups, fixes it.
    assert _distinct_ratio(tmp_path / "kept", in_order.index.label) >= 0.9


def test_inspect_shows_the_default_orders_label_mix(sorted_classes: Path, tmp_path: Path) -> None:
    pack(sorted_classes, tmp_path / "ds", config=PackConfig(samples_per_shard=1000))
    runner = CliRunner()
    text = runner.invoke(cli, ["inspect", str(tmp_path / "ds")])
    assert text.exit_code == 0, text.output
    assert "Label mix of the default order" in text.output
    data = json.loads(runner.invoke(cli, ["inspect", str(tmp_path / "ds"), "--json"]).output)
    mix = data["label_mix"]
    assert mix["batches"] == 3000 // 256
    assert mix["distinct_ratio"] >= 0.95
    expected = uniform_distinct_labels([30] * 100, 256)
    assert math.isclose(mix["uniform_distinct_labels"], expected, abs_tol=1e-3)


def test_order_none_keeps_the_packed_order(sorted_classes: Path, tmp_path: Path) -> None:
    pack(sorted_classes, tmp_path / "ds", config=PackConfig(samples_per_shard=1000))
    order = OrderConfig(mode="none")
    with Loader(str(tmp_path / "ds"), batch_size=500, order=order) as loader:
        indices = np.concatenate([b["index"] for b in loader])
    assert indices.tolist() == list(range(3000))


def test_a_dataset_too_small_for_the_world_warns(
    sorted_classes: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pack(sorted_classes, tmp_path / "ds", config=PackConfig(samples_per_shard=1000))
    with caplog.at_level("WARNING", logger="stoker.pipeline.plan"):
        Loader(str(tmp_path / "ds"), batch_size=1000, world=World(rank=0, world_size=2)).close()
        assert not caplog.records  # 3,000 samples: a full batch for each of 2 ranks
        world = World(rank=1, world_size=4)
        Loader(str(tmp_path / "ds"), batch_size=1000, world=world).close()
    (record,) = caplog.records
    assert "3000 samples" in record.getMessage()
    assert "4 x 1 x 1000 = 4000" in record.getMessage()


def test_inspect_shows_a_class_sorted_pack_mixed_by_the_default_order(
    sorted_classes: Path, tmp_path: Path
) -> None:
    kept = PackConfig(samples_per_shard=1000, shuffle_seed=None)
    pack(sorted_classes, tmp_path / "kept", config=kept)
    out = CliRunner().invoke(cli, ["inspect", str(tmp_path / "kept"), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["label_mix"]["distinct_ratio"] >= 0.9


@pytest.mark.parametrize("kept", [False, True], ids=["shuffled", "class-sorted"])
def test_read_cost_counts_the_reads_an_epoch_makes(
    sorted_classes: Path, tmp_path: Path, kept: bool
) -> None:
    config = PackConfig(samples_per_shard=1000, shuffle_seed=None if kept else 0)
    pack(sorted_classes, tmp_path / "ds", config=config)
    with Loader(str(tmp_path / "ds"), batch_size=128) as loader:
        loader.read_ahead = False  # one epoch's reads, not the next one's start
        before = loader.stats().requests["requests.get"]  # the index
        delivered = sum(len(batch["label"]) for batch in loader)
        reads = loader.stats().requests["requests.get"] - before
        source, resolved = loader.source, loader.order_config
    assert delivered == 3000
    assert (resolved.windows > 1) == kept  # a window only for data not written shuffled
    dataset = open_dataset(tmp_path / "ds")
    order = source.epoch_order(resolved, 0)
    cost = read_cost(dataset.index.length, source.shard_sizes, order=order, config=resolved)
    assert cost.requests == reads
    assert cost.epoch_bytes == int(dataset.index.length.sum())
    # The window holds at most the epoch: a small dataset's window is all of it.
    assert cost.window_groups == min(resolved.windows, order.groups)
    assert cost.window_bytes <= cost.epoch_bytes
