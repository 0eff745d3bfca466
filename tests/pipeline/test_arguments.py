"""Loader arguments are checked where they are given, each error naming its parameter."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.pipeline.config import check_loader_arguments
from stoker.pipeline.world import World


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
