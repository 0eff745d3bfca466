"""One conformance suite for every kind of unit (issue 33): packed images, an unpacked
folder, records (captions, JSON, npy), windows, a mix, Parquet read in place, tokens,
tokens with documents, and video clips.

Each property is one test body parametrized over ``KINDS``: the order is seeded and
repeats; two ranks cover every unit once with equal batches; a resume mid-epoch equals the
uninterrupted rest, also onto another world size; ``TorchLoader`` with two persistent
workers gives the Loader's batches and resumes as it does; ``make_dataset`` and
``JaxLoader`` give the Loader's batches. A new kind joins by adding one entry to ``KINDS``.

JAX and TensorFlow run in child processes (this file, run as a script), each reading every
kind once, as in tests/integrations/test_jax.py: once JAX has started it warns on every
later ``os.fork()`` of the test process.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import MixConfig, SourceConfig, TokenConfig, VideoConfig
from stoker.format.token_writer import write_token_dataset
from stoker.pack.indexer import index_webdataset
from stoker.pack.packer import PackConfig, pack
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import CenterCrop
from stoker.pipeline.windows import WindowConfig
from stoker.pipeline.world import World
from stoker.storage.open import open_store
from stoker.testing.images import make_jpeg, write_image_folder, write_packed_images

BATCH = 4
Unit = tuple[int, ...]


@dataclass(frozen=True)
class Kind:
    """What a Loader takes for one kind of unit, and how a batch names its units."""

    source: Any
    options: dict[str, Any] = field(default_factory=dict)
    ids: tuple[str, ...] = ("index",)  # the fields that together name a unit


def _packed(root: Path) -> Kind:
    url = write_packed_images(root, files=41, classes=4, width=24, height=20, samples_per_shard=10)
    return Kind(url, {"transform": CenterCrop(16)})


def _folder(root: Path) -> Kind:
    write_image_folder(root / "folder", files=40, classes=4, width=24, height=20)
    return Kind(str(root / "folder"), {"transform": CenterCrop(16)})


def _record(i: int) -> dict[str, object]:
    return {
        "__key__": f"{i:04d}",
        "jpg": make_jpeg(np.random.default_rng(i), width=20 + i % 5, height=18),
        "txt": f"caption {i}",
        "json": {"n": i, "tags": ["a"] * (i % 3)},
        "npy": np.arange(3, dtype=np.float32) * i,
        "cls": i % 3,
    }


def _records(root: Path) -> Kind:
    import webdataset as wds

    for shard in range(2):
        with wds.TarWriter(str(root / f"pairs-{shard:04d}.tar")) as sink:
            for i in range(shard * 20, (shard + 1) * 20):
                sink.write(_record(i))
    index_webdataset(root)
    return Kind(str(root), {"transform": CenterCrop(16)})


def _windows(root: Path) -> Kind:
    write_image_folder(root / "src", files=40, classes=2, width=24, height=20)
    pack(root / "src", root / "ds", config=PackConfig(shuffle_seed=None, samples_per_shard=15))
    source = SourceConfig(str(root / "ds"), window=WindowConfig(size=4, shift=2))
    return Kind(source, {"transform": CenterCrop(16)})


def _mix(root: Path) -> Kind:
    a = write_packed_images(root / "a", files=24, classes=3, width=24, height=20)
    b = write_packed_images(root / "b", files=16, classes=2, width=24, height=20)
    source = SourceConfig([a, b], mix=MixConfig(samples_per_epoch=(24, 16)))
    return Kind(source, {"transform": CenterCrop(16)}, ids=("source", "index"))


def _parquet(root: Path) -> Kind:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "data").mkdir()
    for file in range(2):
        rng = np.random.default_rng(file)
        rows = range(file * 20, file * 20 + 20 + file)  # 20 and 21 rows
        table = pa.table(
            {
                "image": [
                    {"bytes": make_jpeg(rng, width=24, height=20), "path": None} for _ in rows
                ],
                "caption": [f"caption {i}" for i in rows],
                "label": [i % 3 for i in rows],
            }
        )
        pq.write_table(
            table, root / "data" / f"train-{file:05d}-of-00002.parquet", row_group_size=6
        )
    return Kind(str(root / "data"), {"transform": CenterCrop(16)})


def _token_dataset(root: Path) -> str:
    rng = np.random.default_rng(7)
    docs = [(f"doc{i:04d}", rng.integers(2, 900, int(rng.integers(3, 40)))) for i in range(50)]
    store = open_store(str(root))
    write_token_dataset(store, docs, dtype=np.dtype("uint16"), eos_id=1, shard_tokens=300)
    return str(root)


def _tokens(root: Path) -> Kind:
    return Kind(SourceConfig(_token_dataset(root), tokens=TokenConfig(seq_len=15)))


def _documents(root: Path) -> Kind:
    tokens = TokenConfig(seq_len=15, documents=True)
    return Kind(SourceConfig(_token_dataset(root), tokens=tokens))


def _clips(root: Path) -> Kind:
    from stoker.testing.videos import make_video

    for n in range(5):
        path = root / "videos" / f"c{n % 2}" / f"v{n}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(make_video(frames=16 + 3 * n, width=32, height=24, gop=6, photo=n))
    pack(root / "videos", root / "ds", config=PackConfig(samples_per_shard=2))
    source = SourceConfig(str(root / "ds"), video=VideoConfig(frames=3, step=4))
    return Kind(source, {"transform": CenterCrop(16)})


KINDS: dict[str, Callable[[Path], Kind]] = {
    "packed": _packed,
    "folder": _folder,
    "records": _records,
    "windows": _windows,
    "mix": _mix,
    "parquet": _parquet,
    "tokens": _tokens,
    "documents": _documents,
    "clips": _clips,
}


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Kind]:
    return {name: make(tmp_path_factory.mktemp(name)) for name, make in KINDS.items()}


def units(batch: Any, names: tuple[str, ...]) -> list[Unit]:
    """The units of a batch (a dict of arrays or tensors, or a tuple of ``names``' fields)."""
    columns = batch if isinstance(batch, tuple | list) else [batch[n] for n in names]
    flat = [np.asarray(c).reshape(-1).tolist() for c in columns]
    return [tuple(int(v) for v in unit) for unit in zip(*flat, strict=True)]


def epoch(loader: Iterable[Any], names: tuple[str, ...]) -> list[list[Unit]]:
    return [units(batch, names) for batch in loader]


def run(kind: Kind, *, epoch_number: int = 0, **options: Any) -> list[list[Unit]]:
    settings = {"batch_size": BATCH, "seed": 1, "drop_last": False, **kind.options, **options}
    with Loader(kind.source, **settings) as loader:
        loader.read_ahead = False
        loader.set_epoch(epoch_number)
        return epoch(loader, kind.ids)


def flat(batches: Iterable[list[Unit]]) -> list[Unit]:
    return [unit for batch in batches for unit in batch]


@pytest.mark.parametrize("name", KINDS)
def test_the_order_is_seeded_and_repeats(kinds: dict[str, Kind], name: str) -> None:
    kind = kinds[name]
    first = run(kind, seed=1)
    assert len(first) > 3
    assert run(kind, seed=1) == first
    other = run(kind, seed=2)
    assert other != first
    assert sorted(flat(other)) == sorted(flat(first))  # the same units, in another order
    assert run(kind, seed=1, epoch_number=1) != first  # and another each epoch


@pytest.mark.parametrize("drop_last", [False, True], ids=["pad", "drop"])
@pytest.mark.parametrize("name", KINDS)
def test_two_ranks_cover_every_unit_once_with_equal_batches(
    kinds: dict[str, Kind], name: str, drop_last: bool
) -> None:
    kind = kinds[name]
    everything = Counter(flat(run(kind)))
    shares, padded = [], 0
    for rank in range(2):
        settings = {"batch_size": BATCH, "seed": 1, "drop_last": drop_last, **kind.options}
        with Loader(kind.source, world=World(rank=rank, world_size=2), **settings) as loader:
            loader.read_ahead = False
            batches = epoch(loader, kind.ids)
            assert len(batches) == len(loader)
            padded += loader.stats().padded
        shares.append(batches)
    assert len(shares[0]) == len(shares[1]) > 0
    got = Counter(flat(shares[0]) + flat(shares[1]))
    if drop_last:  # whole batches, nothing repeated; fewer than a batch a rank left out
        assert padded == 0
        assert all(len(b) == BATCH for share in shares for b in share)
        assert got <= everything
        assert everything.total() - got.total() < 2 * BATCH
    else:  # every unit, and under one repeat a rank to even them out
        assert everything <= got
        assert got.total() == everything.total() + padded
        assert padded < 2


def _resumed(kind: Kind, state: dict[str, Any], world_size: int) -> tuple[list[Unit], int]:
    rest, padded = [], 0
    for rank in range(world_size):
        settings = {"batch_size": BATCH, "seed": 1, "drop_last": False, **kind.options}
        world = World(rank=rank, world_size=world_size)
        with Loader(kind.source, world=world, **settings) as loader:
            loader.read_ahead = False
            loader.load_state_dict(state)
            share = epoch(loader, kind.ids)
            padded += loader.stats().padded
        if world_size == 1:
            return flat(share), 0
        rest += flat(share)
    return rest, padded


@pytest.mark.parametrize("name", KINDS)
def test_a_resume_mid_epoch_equals_the_uninterrupted_rest(
    kinds: dict[str, Kind], name: str
) -> None:
    kind = kinds[name]
    whole = run(kind)
    stop = 3
    settings = {"batch_size": BATCH, "seed": 1, "drop_last": False, **kind.options}
    with Loader(kind.source, **settings) as loader:
        loader.read_ahead = False
        it = iter(loader)
        seen = [units(next(it), kind.ids) for _ in range(stop)]
        state = loader.state_dict()
        it.close()  # type: ignore[attr-defined]
    assert seen == whole[:stop]
    rest, _ = _resumed(kind, state, 1)
    assert rest == flat(whole[stop:])
    # Onto two ranks: exactly the remainder between them (and under one repeat a rank).
    rest, padded = _resumed(kind, state, 2)
    assert Counter(flat(whole[stop:])) <= Counter(rest)
    assert len(rest) == len(flat(whole[stop:])) + padded
    assert padded < 2


@pytest.mark.parametrize("name", KINDS)
def test_torch_workers_give_the_loaders_batches_every_epoch(
    kinds: dict[str, Kind], name: str
) -> None:
    from stoker.integrations.torch import TorchLoader

    kind = kinds[name]
    settings = {"batch_size": BATCH, "seed": 1, "drop_last": False, **kind.options}
    with TorchLoader(kind.source, num_workers=2, persistent_workers=True, **settings) as loader:
        for number in range(2):
            loader.set_epoch(number)
            expected = run(kind, epoch_number=number)
            assert epoch(loader, kind.ids) == expected
            assert sorted(flat(expected)) == sorted(flat(run(kind)))


@pytest.mark.parametrize("name", KINDS)
def test_torch_workers_resume_mid_epoch_as_the_loader_does(
    kinds: dict[str, Kind], name: str
) -> None:
    from stoker.integrations.torch import TorchLoader

    kind = kinds[name]
    whole, stop = run(kind), 3
    settings = {"batch_size": BATCH, "seed": 1, "drop_last": False, **kind.options}
    with TorchLoader(kind.source, num_workers=2, **settings) as loader:
        it = iter(loader)
        seen = [units(next(it), kind.ids) for _ in range(stop)]
        state = loader.state_dict()
        it.close()  # type: ignore[attr-defined]
    assert seen == whole[:stop]
    assert state["batches"] == stop
    with TorchLoader(kind.source, num_workers=2, **settings) as resumed:
        resumed.load_state_dict(state)
        assert epoch(resumed, kind.ids) == whole[stop:]


def child(framework: str, spec: Path, out: Path) -> None:
    """Read one epoch of every kind in ``spec`` through ``framework``'s adapter and write
    each kind's batches (or the error) to ``out``."""
    results: dict[str, Any] = {}
    for name, (source, options, ids) in pickle.loads(spec.read_bytes()).items():  # noqa: S301  # our own file
        kind = Kind(source, options, ids)
        settings = {"batch_size": BATCH, "seed": 1, "drop_last": False, **kind.options}
        try:
            results[name] = epoch(_adapter(framework, kind, settings), kind.ids)
        except Exception as error:  # reported by the test of that kind
            results[name] = f"{type(error).__name__}: {error}"
    out.write_bytes(pickle.dumps(results))


def _adapter(framework: str, kind: Kind, settings: dict[str, Any]) -> Iterator[Any]:
    if framework == "jax":
        from stoker.integrations.jax import JaxLoader

        loader = JaxLoader(kind.source, **settings)
        yield from loader
        loader.close()
    else:
        from stoker.integrations.tensorflow import make_dataset

        for element in make_dataset(kind.source, fields=kind.ids, **settings):
            yield tuple(t.numpy() for t in element)


@pytest.fixture(scope="module", params=["jax", "tensorflow"])
def adapted(
    request: pytest.FixtureRequest,
    kinds: dict[str, Kind],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, dict[str, Any]]:
    framework = request.param
    root = tmp_path_factory.mktemp(framework)
    spec, out = root / "spec.pickle", root / "out.pickle"
    spec.write_bytes(pickle.dumps({n: (k.source, k.options, k.ids) for n, k in kinds.items()}))
    done = subprocess.run(
        [sys.executable, __file__, framework, str(spec), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return framework, pickle.loads(out.read_bytes())  # noqa: S301  # the child's


@pytest.mark.parametrize("name", KINDS)
def test_make_dataset_and_jax_give_the_loaders_batches(
    kinds: dict[str, Kind], adapted: tuple[str, dict[str, Any]], name: str
) -> None:
    framework, results = adapted
    got = results[name]
    assert not isinstance(got, str), f"{framework}: {got}"
    assert got == run(kinds[name])


if __name__ == "__main__":
    if sys.argv[1] == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
    child(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
