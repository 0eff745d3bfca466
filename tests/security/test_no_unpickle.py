"""Nothing on the read path unpickles, whatever the shards hold.

A WebDataset tar holds, beside each image, a ``.pkl`` member (a pickle whose loading would
run code) and a ``.npy`` member (an object array, which numpy can only load by unpickling).
It is packed, opened, read sample by sample and in runs, verified, and iterated by the Loader
(threads, and the full-size path that hands PIL images to a transform) while every way to
unpickle explodes. The members must come back as the exact bytes that were written.
"""

from __future__ import annotations

import _pickle
import io
import pickle
import tarfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import stoker
from stoker import World
from stoker.format.reader import open_dataset
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import CenterCrop
from stoker.testing.images import make_jpeg

FIRED: list[str] = []


def fire(tag: str) -> None:
    FIRED.append(tag)


class Tripwire:
    """Unpickling this calls :func:`fire`; nothing in the test should ever do so."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (fire, ("unpickled",))


def _explode(*args: object, **kwargs: object) -> None:
    raise AssertionError("something on the read path tried to unpickle")


@pytest.fixture
def unpickling_explodes() -> Iterator[None]:
    targets = [
        (pickle, "load"),
        (pickle, "loads"),
        (pickle, "Unpickler"),
        (_pickle, "load"),
        (_pickle, "loads"),
        (_pickle, "Unpickler"),
        (np, "load"),
        (np.lib.format, "read_array"),
    ]
    with mock.patch.multiple("builtins", __import__=_guarded_import(__import__)):
        patches = [mock.patch.object(owner, name, _explode) for owner, name in targets]
        for patch in patches:
            patch.start()
        try:
            yield
        finally:
            for patch in reversed(patches):
                patch.stop()


def _guarded_import(real: object) -> object:
    """Imports still work; importing a module whose only job is unpickling fails loudly."""

    def guarded(name: str, *args: object, **kwargs: object) -> object:
        if name in ("dill", "cloudpickle", "joblib", "shelve"):
            raise AssertionError(f"the read path imported {name}")
        return real(name, *args, **kwargs)  # type: ignore[operator]

    return guarded


def _tar(path: Path, count: int) -> dict[str, dict[str, bytes]]:
    rng = np.random.default_rng(3)
    written: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path, "w") as tar:
        for i in range(count):
            npy = io.BytesIO()
            np.save(npy, np.array([{"a": i}, None], dtype=object), allow_pickle=True)
            fields = {
                "jpg": make_jpeg(rng, width=48, height=40),
                "pkl": pickle.dumps(Tripwire()),
                "npy": npy.getvalue(),
                "cls": str(i % 3).encode(),
            }
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            written[f"s{i:03d}"] = fields
    return written


def test_the_tripwire_works() -> None:
    FIRED.clear()
    pickle.loads(pickle.dumps(Tripwire()))  # noqa: S301 - proves the payload is live
    assert FIRED == ["unpickled"]
    FIRED.clear()


@pytest.mark.usefixtures("unpickling_explodes")
def test_pack_open_read_verify_and_load_never_unpickle(tmp_path: Path) -> None:
    FIRED.clear()
    (tmp_path / "wds").mkdir()
    written = _tar(tmp_path / "wds" / "train-0000.tar", 12)
    url = str(tmp_path / "packed")
    stoker.pack(str(tmp_path / "wds"), url, source_format="webdataset")

    dataset = open_dataset(url)
    assert len(dataset) == 12
    for i in range(len(dataset)):
        sample = dataset[i]
        for ext in ("jpg", "pkl", "npy"):
            assert sample[ext] == written[sample["key"]][ext]
    many = dataset.read_many(list(range(12))[::-1])
    assert [s["pkl"] for s in many] == [written[s["key"]]["pkl"] for s in many]
    assert dataset.verify().ok

    with Loader(url, batch_size=5, transform=CenterCrop(24), world=World(num_workers=1)) as loader:
        keys = [k for batch in loader for k in batch["key"]]
    assert sorted(keys) == sorted(written)
    with Loader(url, batch_size=4, transform=lambda image: np.asarray(image).shape) as loader:
        shapes = [s for batch in loader for s in batch["image"]]
    assert len(shapes) == 12
    assert FIRED == []


@pytest.mark.usefixtures("unpickling_explodes")
def test_the_guard_catches_every_way_in() -> None:
    payload = pickle.dumps(Tripwire())
    npy = io.BytesIO()
    np.save(npy, np.array([None], dtype=object), allow_pickle=True)
    attempts = [
        lambda: pickle.loads(payload),  # noqa: S301 - must be stopped by the guard
        lambda: pickle.Unpickler(io.BytesIO(payload)).load(),  # noqa: S301
        lambda: _pickle.loads(payload),
        lambda: np.load(io.BytesIO(npy.getvalue()), allow_pickle=True),
        lambda: __import__("shelve"),
    ]
    for attempt in attempts:
        with pytest.raises(AssertionError, match=r"unpickle|imported shelve"):
            attempt()
    assert FIRED == []
