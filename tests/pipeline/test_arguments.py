"""Loader arguments are checked where they are given, each error naming its parameter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stoker import CacheConfig, DecodeConfig, Loader
from stoker.pipeline.config import check_loader_arguments
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.world import World
from stoker.testing.images import write_packed_images


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, "world_size must be >= 1, got 0"),
        ({"world_size": -2}, "world_size must be >= 1, got -2"),
        ({"rank": 2, "world_size": 2}, r"rank must be in 0\.\.1 \(world_size=2\), got 2"),
        ({"rank": -1, "world_size": 2}, r"rank must be in 0\.\.1 \(world_size=2\), got -1"),
        ({"num_workers": 0}, "num_workers must be >= 1, got 0"),
        ({"worker": 3, "num_workers": 3}, r"worker must be in 0\.\.2 \(num_workers=3\), got 3"),
    ],
)
def test_world_names_the_bad_parameter(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        World(**kwargs)


@pytest.mark.parametrize("value", [1.5, "2", True, None])
def test_world_refuses_what_is_not_an_integer(value: object) -> None:
    with pytest.raises(TypeError, match=f"world_size must be an int, got {value!r}"):
        World(world_size=value)  # type: ignore[arg-type]


def test_world_takes_numpy_integers() -> None:
    world = World(rank=np.int64(1), world_size=np.int32(2))  # type: ignore[arg-type]
    assert (world.rank, world.world_size) == (1, 2)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 0, "prefetch": "auto"}, ValueError, "batch_size must be >= 1, got 0"),
        ({"batch_size": 8, "prefetch": -1}, ValueError, "prefetch must be >= 1, got -1"),
        ({"batch_size": 8, "prefetch": 0}, ValueError, "prefetch must be >= 1, got 0"),
        ({"batch_size": 2.5, "prefetch": 2}, TypeError, "batch_size must be an int, got 2.5"),
        ({"batch_size": True, "prefetch": 2}, TypeError, "batch_size must be an int, got True"),
        ({"batch_size": 8, "prefetch": "fast"}, TypeError, "prefetch must be an int or 'auto'"),
    ],
)
def test_loader_arguments_name_the_bad_parameter(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        check_loader_arguments(**kwargs)


def test_good_loader_arguments_pass() -> None:
    check_loader_arguments(batch_size=1, prefetch="auto")
    check_loader_arguments(batch_size=np.int64(256), prefetch=4)


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_packed_images(
        tmp_path_factory.mktemp("arguments"),
        files=21,
        classes=3,
        width=16,
        height=16,
        samples_per_shard=7,
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"order": "random"},
            TypeError,
            r"order must be OrderConfig\(...\) or None, got "
            r"'random': e.g. order=OrderConfig\(mode='random'\)",
        ),
        ({"world": (0, 2)}, TypeError, r"world must be World\(...\) or None, got \(0, 2\)"),
        ({"decode": "process"}, TypeError, r"decode=DecodeConfig\(method='process'\)"),
        ({"cache": "/x"}, TypeError, r"cache must be CacheConfig\(...\) or None, got '/x'"),
        ({"autotune": 3}, TypeError, r"autotune must be AutotuneConfig\(...\) or None"),
        ({"seed": "abc"}, TypeError, "seed must be an int, got 'abc'"),
        ({"seed": 1.0}, TypeError, "seed must be an int, got 1.0"),
        ({"seed": -1}, ValueError, "seed must be >= 0, got -1"),
        ({"drop_last": "no"}, TypeError, "drop_last must be True or False, got 'no'"),
        ({"drop_last": 0}, TypeError, "drop_last must be True or False, got 0"),
        ({"transform": 5}, TypeError, "transform must be a built-in transform"),
        ({"storage_options": "x"}, TypeError, "storage_options must be a mapping"),
        ({"prefetch": 1.5}, TypeError, "prefetch must be an int or 'auto', got 1.5"),
    ],
)
def test_loader_names_a_wrong_argument_and_what_it_takes(
    dataset_url: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Loader(dataset_url, batch_size=4, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"mode": "shuffled"}, ValueError, "mode must be 'blocks', 'random' or 'none'"),
        ({"seed": "abc"}, TypeError, "OrderConfig seed must be an int, got 'abc'"),
        ({"seed": -1}, ValueError, "OrderConfig seed must be >= 0, got -1"),
        ({"block_size": 2.5}, TypeError, "OrderConfig block_size must be an int, got 2.5"),
        ({"window": 0}, ValueError, "OrderConfig window must be >= 1, got 0"),
    ],
)
def test_order_config_names_the_bad_field(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        OrderConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"threads": True}, TypeError, "threads must be an int, 'cpus' or 'auto', got True"),
        ({"threads": 0}, ValueError, "threads must be >= 1, got 0"),
        ({"method": "processes"}, ValueError, "method must be 'thread' or 'process'"),
        ({"on_error": "ignore"}, ValueError, "on_error must be 'raise' or 'skip'"),
        ({"max_pixels": "1M"}, TypeError, "max_pixels must be an int, got '1M'"),
    ],
)
def test_decode_config_names_the_bad_field(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        DecodeConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"dir": "/c", "max_bytes": "1GB"}, TypeError, "max_bytes must be an int number of bytes"),
        ({"memory_bytes": 1.5}, TypeError, "memory_bytes must be an int number of bytes"),
        ({"dir": "/c", "page_bytes": True}, TypeError, "page_bytes must be an int number"),
        ({"memory_bytes": 0}, ValueError, "memory_bytes must be >= 1, got 0"),
        ({"dir": 5}, TypeError, r"dir must be a path \(str or os.PathLike\), got 5"),
        ({"max_bytes": 10}, ValueError, "max_bytes and page_bytes are the disk cache's"),
    ],
)
def test_cache_config_names_the_bad_field(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        CacheConfig(**kwargs)


def test_a_cache_dir_without_free_space_is_named(dataset_url: str) -> None:
    # /proc has no free space: the cache cannot hold anything there, and says why (it
    # said "max_bytes must be >= 1, got 0" though no max_bytes was given).
    with pytest.raises(ValueError, match="disk cache /proc/self: no free space") as caught:
        Loader(dataset_url, batch_size=4, cache=CacheConfig(dir="/proc/self"))
    assert "max_bytes must be" not in str(caught.value)


# -- load_state_dict ----------------------------------------------------------------------


def _state(**changes: object) -> dict[str, object]:
    state: dict[str, object] = {
        "epoch": 0,
        "batches": 1,
        "batch_size": 4,
        "seed": 0,
        "world_size": 1,
        "segments": [],
        "skipped": 0,
    }
    state.update(changes)
    return state


@pytest.mark.parametrize(
    ("state", "error", "message"),
    [
        # Past the end of the epoch: it used to be taken as "epoch done" and skipped.
        (
            _state(batches=10**9),
            ValueError,
            r"state\['batches'\] is 1000000000, but epoch 0 has 21 samples: 6 batches of 4",
        ),
        (
            _state(segments=[[5, 10**6]]),
            ValueError,
            r"state\['segments'\]\[0\]\[1\] says each of 5 ranks consumed 1000000 samples, but "
            r"epoch 0 has 21 samples and 21 were left: at most 8",
        ),
        (
            _state(world_size=2, batches=7),
            ValueError,
            r"state\['batches'\] \(7 of 4\) says each of 2 ranks consumed 28 samples",
        ),
        (
            _state(world_size=22),
            ValueError,
            r"state\['world_size'\] is 22: more ranks than epoch 0 has 21 samples",
        ),
        # Negative numbers: "internal error: batch samples were never fetched", or accepted.
        (_state(batches=-3), ValueError, r"state\['batches'\] must be >= 0, got -3"),
        (_state(world_size=-4), ValueError, r"state\['world_size'\] must be >= 1, got -4"),
        (_state(epoch=-1), ValueError, r"state\['epoch'\] must be >= 0, got -1"),
        (_state(segments=[[0, 4]]), ValueError, r"state\['segments'\]\[0\]\[0\] must be >= 1"),
        # Types: a float, a string, a bool or None where an int belongs.
        (_state(batches=1.0), TypeError, r"state\['batches'\] must be an int, got 1.0"),
        (_state(epoch="1"), TypeError, r"state\['epoch'\] must be an int, got '1'"),
        (_state(batches=True), TypeError, r"state\['batches'\] must be an int, got True"),
        (_state(seed=None), TypeError, r"state\['seed'\] must be an int, got None"),
        (_state(segments={"a": 1}), TypeError, r"state\['segments'\] must be a list of pairs"),
        (
            _state(segments=[[1, 2, 3]]),
            TypeError,
            r"state\['segments'\]\[0\] must be a \[world_size, samples\] pair, got \[1, 2, 3\]",
        ),
        (_state(segments=[[1, 2.5]]), TypeError, r"state\['segments'\]\[0\]\[1\] must be an int"),
        # Keys missing or unknown, and what is not a state at all.
        (
            {"epoch": 0},
            ValueError,
            r"state has no \['batches', 'batch_size', 'seed', 'world_size'\]",
        ),
        (_state(position=3), ValueError, r"state has unknown keys \['position'\]"),
        ([0, 1], TypeError, r"state must be a mapping from Loader.state_dict\(\), got \[0, 1\]"),
        # Another run's state.
        (_state(seed=3), ValueError, r"state\['seed'\] is 3, but this loader's is 0"),
        (_state(batch_size=8), ValueError, r"state\['batch_size'\] is 8, but this loader's is 4"),
    ],
)
def test_load_state_dict_names_the_field_it_refuses(
    dataset_url: str, state: object, error: type[Exception], message: str
) -> None:
    with Loader(dataset_url, batch_size=4) as loader:
        with pytest.raises(error, match=message):
            loader.load_state_dict(state)  # type: ignore[arg-type]
        assert loader.state_dict() == _state(batches=0)  # nothing was half-loaded


def test_load_state_dict_takes_the_last_state_of_an_epoch_and_numpy_integers(
    dataset_url: str,
) -> None:
    with Loader(dataset_url, batch_size=4) as loader:
        loader.load_state_dict(_state(batches=6))  # every batch delivered: the rest is empty
        assert list(loader) == []
        assert loader.state_dict() == _state(epoch=1, batches=0)
        loader.load_state_dict(_state(epoch=np.int64(2), batches=np.int32(5)))
        assert [len(b["key"]) for b in loader] == [1]
