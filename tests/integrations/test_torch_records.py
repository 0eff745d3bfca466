"""Every field of a record through the PyTorch adapter: image-caption-JSON-array tars
written by the webdataset library, indexed in place, read by TorchLoader and by
StokerIterableDataset in a DataLoader, both with worker processes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from stoker import DecodeConfig, FieldsConfig
from stoker.integrations.torch import StokerIterableDataset, TorchLoader, to_tensors
from stoker.pack.indexer import index_webdataset
from stoker.pipeline.transforms import CenterCrop
from stoker.testing.images import make_jpeg

SAMPLES = 20


def _record(i: int) -> dict[str, Any]:
    return {
        "__key__": f"{i:04d}",
        "jpg": make_jpeg(np.random.default_rng(i), width=30 + i, height=24),
        "txt": f"caption {i}: ünïcode, \N{SNOWMAN} and a comma",
        "json": {"width": 30 + i, "tags": ["x"] * (i % 3), "nested": {"ok": i % 2 == 0}},
        "npy": np.linspace(0, 1, i % 5 + 1, dtype=np.float32) + i,  # 1 to 5 long
        "cls": i % 4,
        # Strings in an npy array: torch has no tensor for them.
        "words.npy": np.array([f"w{i}", "ß" * (i % 3)], dtype="<U4"),
    }


@pytest.fixture(scope="module")
def records_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    import webdataset as wds

    root = tmp_path_factory.mktemp("torch-records")
    for shard in range(2):
        with wds.TarWriter(str(root / f"records-{shard:04d}.tar")) as sink:
            for i in range(shard * SAMPLES // 2, (shard + 1) * SAMPLES // 2):
                sink.write(_record(i))
    index_webdataset(root)
    return str(root)


def _check_epoch(batches: Iterable[dict[str, Any]]) -> None:
    """Every sample once, each field what was written, of the type the adapter promises."""
    seen: list[str] = []
    for batch in batches:
        images = batch["image"]
        assert isinstance(images, torch.Tensor)
        assert images.dtype == torch.uint8
        assert images.shape[1:] == (16, 16, 3)
        assert batch["label"].dtype == torch.int64
        assert isinstance(batch["txt"], list)
        assert isinstance(batch["json"], list)
        assert isinstance(batch["npy"], list)  # ragged: a list of tensors
        assert len(batch["npy"]) == len(batch["key"]) == images.shape[0]
        for key, text, meta, vector, cls in zip(
            batch["key"], batch["txt"], batch["json"], batch["npy"], batch["label"], strict=True
        ):
            expected = _record(int(key))
            assert text == expected["txt"]
            assert meta == expected["json"]
            assert isinstance(vector, torch.Tensor)
            assert vector.dtype == torch.float32
            np.testing.assert_array_equal(vector.numpy(), expected["npy"])
            assert int(cls) == expected["cls"]
            seen.append(key)
        words = batch["words.npy"]
        assert isinstance(words, np.ndarray)
        assert words.dtype.kind == "U"
        for key, row in zip(batch["key"], words, strict=True):
            np.testing.assert_array_equal(row, _record(int(key))["words.npy"])
    assert sorted(seen) == [f"{i:04d}" for i in range(SAMPLES)]


def test_torch_loader_with_workers_carries_every_field(records_url: str) -> None:
    loader = TorchLoader(records_url, batch_size=6, num_workers=2, transform=CenterCrop(16))
    for epoch in range(2):
        loader.set_epoch(epoch)
        _check_epoch(loader)


def test_iterable_dataset_in_a_dataloader_carries_every_field(records_url: str) -> None:
    dataset = StokerIterableDataset(records_url, batch_size=6, transform=CenterCrop(16))
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    _check_epoch(loader)


def test_padded_arrays_are_tensors_with_their_lengths(records_url: str) -> None:
    decode = DecodeConfig(fields=FieldsConfig(select={"npy": "npy"}, pad={"npy": -1.0}))
    loader = TorchLoader(records_url, batch_size=SAMPLES, decode=decode)
    (batch,) = list(loader)
    assert "image" not in batch
    assert batch["npy"].dtype == torch.float32
    assert batch["npy"].shape == (SAMPLES, 5)
    assert batch["npy_lengths"].dtype == torch.int64
    for row, (key, length) in enumerate(zip(batch["key"], batch["npy_lengths"], strict=True)):
        expected = _record(int(key))["npy"]
        assert int(length) == len(expected)
        np.testing.assert_array_equal(batch["npy"][row, : int(length)].numpy(), expected)
        assert (batch["npy"][row, int(length) :] == -1).all()


def test_images_of_different_sizes_come_as_a_list_of_tensors(records_url: str) -> None:
    decode = DecodeConfig(fields=FieldsConfig(select={"image": "jpg", "txt": "txt"}))
    (batch,) = list(TorchLoader(records_url, batch_size=SAMPLES, decode=decode))
    assert isinstance(batch["image"], list)
    for key, image in zip(batch["key"], batch["image"], strict=True):
        assert isinstance(image, torch.Tensor)
        assert image.dtype == torch.uint8
        assert image.shape == (24, 30 + int(key), 3)


def test_to_tensors_makes_tensors_of_numbers_only() -> None:
    strings = np.array(["a", "bc"])
    dates = np.array(["2024-01-01", "2024-01-02"], dtype="datetime64[D]")
    records = np.zeros(2, dtype=[("a", "i4"), ("b", "f4")])
    wide = np.zeros(2, dtype=np.longdouble)
    batch = to_tensors(
        {
            "u16": np.arange(3, dtype=np.uint16),
            "flag": np.array([True, False]),
            "complex": np.ones(2, dtype=np.complex64),
            "big_endian": np.arange(4, dtype=">f4"),
            "read_only": np.frombuffer(b"\x01\x02", dtype=np.uint8),
            "strings": strings,
            "dates": dates,
            "records": records,
            "wide": wide,
            "txt": ["a", None],
            "bytes": [b"\x00", b"\x01"],
            "json": [{"a": [1, 2]}, {"b": (3, 4)}],
            "ragged": [np.arange(2), None, np.arange(3, dtype=np.float32), strings],
        }
    )
    assert batch["u16"].dtype == torch.uint16
    assert batch["flag"].dtype == torch.bool
    assert batch["complex"].dtype == torch.complex64
    assert batch["big_endian"].dtype == torch.float32
    assert batch["big_endian"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert batch["read_only"].tolist() == [1, 2]
    for name, array in (("strings", strings), ("dates", dates), ("records", records)):
        assert batch[name] is array
    assert batch["wide"] is wide
    assert batch["txt"] == ["a", None]
    assert batch["bytes"] == [b"\x00", b"\x01"]
    assert batch["json"] == [{"a": [1, 2]}, {"b": (3, 4)}]
    first, gap, second, kept = batch["ragged"]
    assert isinstance(first, torch.Tensor)
    assert isinstance(second, torch.Tensor)
    assert gap is None
    assert kept is strings


def test_pin_memory_and_device_apply_to_tensors_only(
    records_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned: list[tuple[int, ...]] = []

    def pin(tensor: torch.Tensor) -> torch.Tensor:  # a CPU-only machine cannot pin
        pinned.append(tuple(tensor.shape))
        return tensor.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    loader = TorchLoader(
        records_url, batch_size=SAMPLES, pin_memory=True, device="cpu", transform=CenterCrop(16)
    )
    (batch,) = list(loader)
    # image, label (the cls members), index, and each of the 20 arrays of the ragged npy
    # field; not the strings of words.npy
    assert len(pinned) == 3 + SAMPLES
    assert (SAMPLES, 16, 16, 3) in pinned
    assert all(isinstance(v, torch.Tensor) for v in batch["npy"])
    assert all(t == _record(int(k))["txt"] for k, t in zip(batch["key"], batch["txt"], strict=True))
    assert all(isinstance(k, str) for k in batch["key"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pinned_batches_on_cuda_keep_text_on_the_host(records_url: str) -> None:
    loader = TorchLoader(
        records_url, batch_size=6, pin_memory=True, device="cuda", transform=CenterCrop(16)
    )
    for batch in loader:
        assert batch["image"].is_cuda
        assert all(v.is_cuda for v in batch["npy"])
        assert all(isinstance(t, str) for t in batch["txt"])
        assert all(isinstance(m, dict) for m in batch["json"])
