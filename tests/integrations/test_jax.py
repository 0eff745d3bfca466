"""The JAX adapter: sharded jax.Arrays equal to the numpy loader's, process shares, resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from stoker.integrations.jax import JaxLoader, batch_sharding, detect_world, to_arrays
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import free_ports

# Two CPU devices in this process, so that batches really are split (before JAX starts).
jax.config.update("jax_num_cpu_devices", 2)

ORDER = OrderConfig(block_size=4, group_blocks=2)
OPTIONS = {"order": ORDER, "transform": RandomResizedCrop(12), "seed": 3}
SAMPLES = 90


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("jax")
    write_image_folder(root / "src", files=SAMPLES, classes=5, width=24, height=20)
    pack(root / "src", root / "ds", config=PackConfig(samples_per_shard=16))
    return str(root / "ds")


def test_batches_are_sharded_and_equal_the_numpy_loader(dataset_url: str) -> None:
    assert jax.device_count() == 2, "JAX started before this module could ask for 2 CPUs"
    loader = JaxLoader(dataset_url, batch_size=10, **OPTIONS)
    reference = Loader(dataset_url, batch_size=10, drop_last=True, **OPTIONS)
    assert loader.sharding == batch_sharding()
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        reference.set_epoch(epoch)
        got, expected = list(loader), list(reference)
        assert len(got) == len(loader) == len(expected) == SAMPLES // 10
        for batch, numpy_batch in zip(got, expected, strict=True):
            for name in ("image", "label", "index"):
                array = batch[name]
                assert isinstance(array, jax.Array)
                assert array.sharding == loader.sharding
                # Each device holds half of the rows.
                halves = sorted(s.index[0].start or 0 for s in array.addressable_shards)
                assert halves == [0, 5]
                assert np.array_equal(np.asarray(array), numpy_batch[name])
            assert batch["key"] == numpy_batch["key"]
        orders.append(np.concatenate([np.asarray(b["index"]) for b in got]))
    assert not np.array_equal(orders[0], orders[1])


def test_a_given_sharding_places_every_array(dataset_url: str) -> None:
    device = jax.devices()[1]
    sharding = jax.sharding.SingleDeviceSharding(device)
    with JaxLoader(dataset_url, batch_size=8, sharding=sharding, **OPTIONS) as loader:
        batch = next(iter(loader))
    assert {d for name in ("image", "label") for d in batch[name].devices()} == {device}
    assert batch["image"].shape == (8, 12, 12, 3)
    assert batch_sharding([device]) == sharding
    with pytest.raises(ValueError, match="fixed output size"):
        to_arrays({"image": [np.zeros((2, 2, 3))]}, sharding)


def test_process_share_maps_to_loader_ranks(
    dataset_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert detect_world() == (0, 1)
    with monkeypatch.context() as patched:
        patched.setattr(jax, "process_index", lambda: 1)
        patched.setattr(jax, "process_count", lambda: 3)
        assert detect_world() == (1, 3)
        assert JaxLoader(dataset_url, batch_size=4, **OPTIONS).loader.world.rank == 1
    seen: list[int] = []
    for rank in range(2):
        loader = JaxLoader(dataset_url, batch_size=4, rank=rank, world_size=2, **OPTIONS)
        share = Loader(
            dataset_url, batch_size=4, rank=rank, world_size=2, drop_last=True, **OPTIONS
        )
        got = [np.asarray(b["index"]) for b in loader]
        assert len(got) == len(share) > 0
        for index, batch in zip(got, share, strict=True):
            assert np.array_equal(index, batch["index"])
        seen += [int(i) for index in got for i in index]
    assert len(seen) == len(set(seen))


def test_state_dict_counts_delivered_batches_not_the_prefetched_one(dataset_url: str) -> None:
    full = [np.asarray(b["index"]) for b in JaxLoader(dataset_url, batch_size=6, **OPTIONS)]
    first = JaxLoader(dataset_url, batch_size=6, **OPTIONS)
    stream = iter(first)
    head = [np.asarray(next(stream)["index"]) for _ in range(3)]
    state = first.state_dict()
    assert state["batches"] == 3
    second = JaxLoader(dataset_url, batch_size=6, **OPTIONS)
    second.load_state_dict(state)
    tail = [np.asarray(b["index"]) for b in second]
    assert len(head) + len(tail) == len(full)
    for got, expected in zip(head + tail, full, strict=True):
        assert np.array_equal(got, expected)


# One JAX process of two (CPU, gloo collectives), two devices each: argv = port id url out.
PROCESS = """
import json, sys
import jax
from jax.experimental import multihost_utils
port, pid, url, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.config.update("jax_num_cpu_devices", 2)
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
from stoker.integrations.jax import JaxLoader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
loader = JaxLoader(url, batch_size=8, transform=RandomResizedCrop(12), seed=3,
                   order=OrderConfig(block_size=4, group_blocks=2))
steps = []
for batch in loader:
    total = jax.jit(lambda x: x.sum())(batch["label"])
    index = multihost_utils.process_allgather(batch["index"], tiled=True)
    steps.append({"shape": list(batch["image"].shape), "index": index.tolist(),
                  "label_sum": int(total)})
with open(out, "w") as f:
    json.dump({"world": [loader.loader.rank, loader.loader.world_size],
               "devices": [jax.device_count(), jax.local_device_count()], "steps": steps}, f)
jax.distributed.shutdown()
"""


def test_two_jax_processes_each_read_their_share(dataset_url: str, tmp_path: Path) -> None:
    (port,) = free_ports(1)
    outs = [tmp_path / f"process{p}.json" for p in range(2)]
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, str(port), str(p), dataset_url, str(outs[p])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(2)
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=120)
        assert run.returncode == 0, stderr[-3000:]
    results = [json.loads(out.read_text()) for out in outs]
    shares = [
        list(Loader(dataset_url, batch_size=8, rank=r, world_size=2, drop_last=True, **OPTIONS))
        for r in range(2)
    ]
    for process, result in enumerate(results):
        assert result["world"] == [process, 2]
        assert result["devices"] == [4, 2]
        assert len(result["steps"]) == len(shares[0]) > 0
        for step, first, second in zip(result["steps"], *shares, strict=True):
            # One global batch: process 0's rows, then process 1's.
            assert step["shape"] == [16, 12, 12, 3]
            assert step["index"] == [*first["index"].tolist(), *second["index"].tolist()]
            assert step["label_sum"] == int(first["label"].sum() + second["label"].sum())
