"""The JAX adapter: sharded jax.Arrays equal to the numpy loader's, process shares, resume.

JAX runs in child processes (this file, run as a script) that save what they saw; the
tests compare it with the numpy loader here. Once JAX has started its runtime in a process
it warns on every later ``os.fork()``, which the test process does (Ray, DataLoader
workers) with warnings turned into errors.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import World
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_packed_images
from stoker.testing.seaweed import free_ports

ORDER = OrderConfig(block_size=4, group_blocks=2)
OPTIONS = {"order": ORDER, "transform": RandomResizedCrop(12), "seed": 3}
SAMPLES = 90


# -- the children: everything that needs JAX ----------------------------------------------


def child_one_process(url: str, out: Path) -> None:
    """One process with two CPU devices."""
    import jax

    jax.config.update("jax_num_cpu_devices", 2)  # before JAX starts
    from stoker.integrations.jax import JaxLoader, batch_sharding, detect_world, to_arrays

    facts: dict[str, Any] = {"devices": jax.device_count()}
    saved: dict[str, Any] = {}

    loader = JaxLoader(url, batch_size=10, **OPTIONS)
    facts["default_is_batch_sharding"] = loader.sharding == batch_sharding()
    facts["default_spec"] = list(getattr(loader.sharding, "spec", []))
    facts["epochs"] = []
    loader.trace()
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = list(loader)
        facts["epochs"].append(
            {
                "length": len(loader),
                "keys": [b["key"] for b in batches],
                "placement": [
                    {
                        name: {
                            "jax_array": isinstance(b[name], jax.Array),
                            "sharding_is_loaders": b[name].sharding == loader.sharding,
                            "row_starts": sorted(
                                s.index[0].start or 0 for s in b[name].addressable_shards
                            ),
                        }
                        for name in ("image", "label", "index")
                    }
                    for b in batches
                ],
            }
        )
        for name in ("image", "label", "index"):
            saved[f"epoch{epoch}_{name}"] = np.stack([np.asarray(b[name]) for b in batches])

    stats = loader.stats()
    facts["stats"] = [stats.samples, stats.batches, sorted({e.stage for e in loader.events()})]

    device = jax.devices()[1]
    sharding = jax.sharding.SingleDeviceSharding(device)
    with JaxLoader(url, batch_size=8, sharding=sharding, **OPTIONS) as given:
        batch = next(iter(given))
    facts["given"] = {
        "devices": sorted({str(d) for n in ("image", "label") for d in batch[n].devices()}),
        "device": str(device),
        "shape": list(batch["image"].shape),
        "one_device_default": batch_sharding([device]) == sharding,
    }
    try:
        to_arrays({"image": [np.zeros((2, 2, 3))]}, sharding)
    except ValueError as exc:
        facts["list_of_images"] = str(exc)

    facts["detected"] = detect_world()
    real = jax.process_index, jax.process_count
    jax.process_index, jax.process_count = (lambda: 1), (lambda: 3)  # a simulated process
    try:
        facts["simulated"] = detect_world()
        simulated = JaxLoader(url, batch_size=4, **OPTIONS).loader
        facts["simulated_world"] = [simulated.rank, simulated.world_size]
    finally:
        jax.process_index, jax.process_count = real
    for rank in range(2):
        share = JaxLoader(url, batch_size=4, **OPTIONS, world=World(rank=rank, world_size=2))
        saved[f"share{rank}"] = np.stack([np.asarray(b["index"]) for b in share])

    full = JaxLoader(url, batch_size=6, **OPTIONS)
    saved["full"] = np.stack([np.asarray(b["index"]) for b in full])
    first = JaxLoader(url, batch_size=6, **OPTIONS)
    stream = iter(first)
    head = [np.asarray(next(stream)["index"]) for _ in range(3)]
    facts["state"] = first.state_dict()
    second = JaxLoader(url, batch_size=6, **OPTIONS)
    second.load_state_dict(facts["state"])
    saved["resumed"] = np.stack(head + [np.asarray(b["index"]) for b in second])

    np.savez(out / "one.npz", **saved)
    (out / "one.json").write_text(json.dumps(facts))


def child_of_two(url: str, out: Path, port: int, process: int) -> None:
    """Process ``process`` of two (CPU, gloo collectives), two devices each."""
    import jax
    from jax.experimental import multihost_utils

    jax.config.update("jax_num_cpu_devices", 2)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    from stoker.integrations.jax import JaxLoader

    loader = JaxLoader(url, batch_size=8, **OPTIONS)
    steps = []
    for batch in loader:
        total = jax.jit(lambda x: x.sum())(batch["label"])
        index = multihost_utils.process_allgather(batch["index"], tiled=True)
        steps.append(
            {
                "shape": list(batch["image"].shape),
                "index": index.tolist(),
                "label_sum": int(total),
            }
        )
    facts = {
        "world": [loader.loader.rank, loader.loader.world_size],
        "devices": [jax.device_count(), jax.local_device_count()],
        "steps": steps,
    }
    (out / f"process{process}.json").write_text(json.dumps(facts))
    jax.distributed.shutdown()


# -- the tests -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    if importlib.util.find_spec("jax") is None:  # not imported: see the module's doc
        pytest.skip("jax is not installed (pip install -e '.[test]')")
    return write_packed_images(
        tmp_path_factory.mktemp("jax"),
        files=SAMPLES,
        classes=5,
        width=24,
        height=20,
        samples_per_shard=16,
    )


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(*runs: subprocess.Popen[str]) -> None:
    for run in runs:
        _, stderr = run.communicate(timeout=120)
        assert run.returncode == 0, stderr[-4000:]


@pytest.fixture(scope="module")
def one(dataset_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the one-process child saw."""
    out = tmp_path_factory.mktemp("jax-one")
    _wait(_spawn("one", dataset_url, str(out)))
    with np.load(out / "one.npz") as saved:
        arrays = dict(saved)
    return {"facts": json.loads((out / "one.json").read_text()), **arrays}


def test_batches_are_sharded_and_equal_the_numpy_loader(
    dataset_url: str, one: dict[str, Any]
) -> None:
    facts = one["facts"]
    assert facts["devices"] == 2
    assert facts["default_is_batch_sharding"]
    assert facts["default_spec"] == ["batch"]
    reference = Loader(dataset_url, batch_size=10, drop_last=True, **OPTIONS)
    for epoch, seen in enumerate(facts["epochs"]):
        reference.set_epoch(epoch)
        expected = list(reference)
        assert seen["length"] == len(expected) == SAMPLES // 10
        assert seen["keys"] == [b["key"] for b in expected]
        for placement in seen["placement"]:
            for where in placement.values():
                assert where["jax_array"]
                assert where["sharding_is_loaders"]
                assert where["row_starts"] == [0, 5]  # each device holds half of the rows
        for name in ("image", "label", "index"):
            assert np.array_equal(one[f"epoch{epoch}_{name}"], [b[name] for b in expected])
    assert not np.array_equal(one["epoch0_index"], one["epoch1_index"])


def test_stats_and_trace_say_what_the_loader_says(one: dict[str, Any]) -> None:
    samples, batches, stages = one["facts"]["stats"]
    assert (samples, batches) == (2 * SAMPLES // 10 * 10, 2 * (SAMPLES // 10))
    assert {"fetch", "decode", "consumer.wait"} <= set(stages)


def test_a_given_sharding_places_every_array(one: dict[str, Any]) -> None:
    given = one["facts"]["given"]
    assert given["devices"] == [given["device"]]
    assert given["shape"] == [8, 12, 12, 3]
    assert given["one_device_default"]
    assert "fixed output size" in one["facts"]["list_of_images"]


def test_process_share_maps_to_loader_ranks(dataset_url: str, one: dict[str, Any]) -> None:
    facts = one["facts"]
    assert facts["detected"] == [0, 1]
    assert facts["simulated"] == facts["simulated_world"] == [1, 3]
    seen: list[int] = []
    for rank in range(2):
        share = Loader(
            dataset_url,
            batch_size=4,
            drop_last=True,
            **OPTIONS,
            world=World(rank=rank, world_size=2),
        )
        got = one[f"share{rank}"]
        assert len(got) == len(share) > 0
        assert np.array_equal(got, [b["index"] for b in share])
        seen += got.ravel().tolist()
    assert len(seen) == len(set(seen))


def test_state_dict_counts_delivered_batches_not_the_prefetched_one(one: dict[str, Any]) -> None:
    assert one["facts"]["state"]["batches"] == 3
    assert len(one["full"]) > 3
    assert np.array_equal(one["resumed"], one["full"])


def test_two_jax_processes_each_read_their_share(dataset_url: str, tmp_path: Path) -> None:
    (port,) = free_ports(1)
    _wait(*[_spawn("two", dataset_url, str(tmp_path), str(port), str(p)) for p in range(2)])
    shares = [
        list(
            Loader(
                dataset_url,
                batch_size=8,
                drop_last=True,
                **OPTIONS,
                world=World(rank=r, world_size=2),
            )
        )
        for r in range(2)
    ]
    for process in range(2):
        result = json.loads((tmp_path / f"process{process}.json").read_text())
        assert result["world"] == [process, 2]
        assert result["devices"] == [4, 2]
        assert len(result["steps"]) == len(shares[0]) > 0
        for step, first, second in zip(result["steps"], *shares, strict=True):
            # One global batch: process 0's rows, then process 1's.
            assert step["shape"] == [16, 12, 12, 3]
            assert step["index"] == [*first["index"].tolist(), *second["index"].tolist()]
            assert step["label_sum"] == int(first["label"].sum() + second["label"].sum())


def child_records(url: str, out: Path) -> None:
    """Records of a caption, an embedding and a ragged array: arrays sharded, the rest on
    the host."""
    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    from stoker.integrations.jax import JaxLoader

    seen: dict[str, Any] = {"txt": [], "emb": [], "types": set(), "ragged": []}
    with JaxLoader(url, batch_size=4, order=OrderConfig(mode="none")) as loader:
        for batch in loader:
            seen["types"].add((type(batch["emb.npy"]).__name__, type(batch["txt"]).__name__))
            seen["sharded"] = len(batch["emb.npy"].sharding.device_set)
            seen["txt"] += batch["txt"]
            seen["emb"] += np.asarray(batch["emb.npy"]).tolist()
            seen["ragged"] += [np.asarray(a).tolist() for a in batch["seq.npy"]]
    seen["types"] = sorted(seen["types"])
    (out / "records.json").write_text(json.dumps(seen))


RECORDS = 12


def record(i: int) -> dict[str, Any]:
    return {
        "__key__": f"{i:04d}",
        "txt": f"text {i}",
        "emb.npy": np.full(3, i, dtype=np.float32),
        "seq.npy": np.arange(i % 3 + 1, dtype=np.int16),
    }


def test_records_shard_arrays_and_keep_the_rest_on_the_host(tmp_path: Path) -> None:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed (pip install -e '.[test]')")
    import webdataset as wds

    from stoker.pack.indexer import index_webdataset

    with wds.TarWriter(str(tmp_path / "records-0000.tar")) as sink:
        for i in range(RECORDS):
            sink.write(record(i))
    index_webdataset(tmp_path)
    _wait(_spawn("records", str(tmp_path), str(tmp_path)))
    seen = json.loads((tmp_path / "records.json").read_text())
    assert seen["types"] == [["ArrayImpl", "list"]]
    assert seen["sharded"] == 2
    assert seen["txt"] == [f"text {i}" for i in range(RECORDS)]
    assert seen["emb"] == [[float(i)] * 3 for i in range(RECORDS)]
    assert seen["ragged"] == [list(range(i % 3 + 1)) for i in range(RECORDS)]


if __name__ == "__main__":
    if sys.argv[1] == "one":
        child_one_process(sys.argv[2], Path(sys.argv[3]))
    elif sys.argv[1] == "records":
        child_records(sys.argv[2], Path(sys.argv[3]))
    else:
        child_of_two(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
