"""HDF5 images: pixel arrays and encoded bytes, labels, class names, errors, S3."""

from __future__ import annotations

import gc
import io
import pickle
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from PIL import Image

from stoker.errors import SourceError
from stoker.format.foreign.hdf5 import HDF5Reader
from stoker.testing.images import make_jpeg


def reloaded(reader: HDF5Reader) -> HDF5Reader:
    """The reader after a pickle round trip, as a worker process would get it."""
    clone: HDF5Reader = pickle.loads(pickle.dumps(reader))  # noqa: S301 - our own bytes
    return clone


def pixels(count: int, *shape: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(count, *shape), dtype=np.uint8)


def decode(data: bytes) -> np.ndarray[Any, Any]:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


def write(path: Path, **datasets: Any) -> Path:
    attrs = datasets.pop("attrs", {})
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            f[name] = value
        f.attrs.update(attrs)
    return path


@pytest.mark.parametrize("shape", [(6, 5), (6, 5, 1), (6, 5, 2), (6, 5, 3), (6, 5, 4)])
def test_pixel_arrays_encode_losslessly_to_png(tmp_path: Path, shape: tuple[int, ...]) -> None:
    array = pixels(3, *shape)
    path = write(tmp_path / "train.v1.h5", images=array, labels=np.array([2, 0, 1]))
    with HDF5Reader(str(path), class_names=["a", "b", "c"]) as reader:
        refs = reader.refs()
        assert [r.key for r in refs] == [f"train_v1_{i:08d}" for i in range(3)]
        assert [r.label for r in refs] == [2, 0, 1]
        assert refs[0].size == array[0].nbytes
        assert "3 images" in reader.description
        for i, ref in enumerate(refs):
            sample = reloaded(reader).read(ref)
            assert list(sample.fields) == ["png", "cls"]
            assert sample.fields["cls"] == str(ref.label).encode()
            np.testing.assert_array_equal(decode(sample.fields["png"]).reshape(shape), array[i])


def test_jpeg_output_and_no_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "x.hdf5", images=pixels(2, 16, 16, 3))
    reader = HDF5Reader(str(path), image_format="jpg")
    refs = reader.refs()
    assert [r.label for r in refs] == [-1, -1]
    sample = reader.read(refs[1])
    assert list(sample.fields) == ["jpg"]
    assert decode(sample.fields["jpg"]).shape == (16, 16, 3)
    reader.close()
    with pytest.raises(ValueError, match="image_format must be"):
        HDF5Reader(str(path), image_format="gif")  # type: ignore[arg-type]


def test_encoded_bytes_kept_byte_for_byte(tmp_path: Path) -> None:
    jpeg = make_jpeg(np.random.default_rng(1), width=8, height=8)
    png_out = io.BytesIO()
    Image.fromarray(pixels(1, 4, 4, 3)[0]).save(png_out, format="PNG")
    blobs = [jpeg, png_out.getvalue(), b"RIFF\x04\x01\x01\x01WEBPVP8 ", b"\x00odd\x00"]
    path = tmp_path / "enc.h5"
    with h5py.File(path, "w") as f:
        vlen = f.create_dataset("vlen", (len(blobs),), dtype=h5py.vlen_dtype(np.uint8))
        for i, blob in enumerate(blobs):
            vlen[i] = np.frombuffer(blob, dtype=np.uint8)
        f.create_dataset(
            "bytes", data=np.array(blobs[2:3], dtype=object), dtype=h5py.vlen_dtype(bytes)
        )
        f["void"] = np.array([np.void(b"\x89PNG\r\n\x1a\nab"), np.void(b"\xff\xd8\xff\xe0abcdef")])
        f["labels"] = np.array([[1], [0], [1], [0]], dtype=np.int64)
        f.attrs["class_names"] = ["cat", "dog"]
    reader = HDF5Reader(str(path), images="vlen")
    assert list(reader.class_names) == ["cat", "dog"]
    refs = reader.refs()
    assert [r.size for r in refs] == [len(b) for b in blobs]
    samples = [reader.read(r) for r in refs]
    assert [s.fields for s in samples] == [
        {"jpg": blobs[0], "cls": b"1"},
        {"png": blobs[1], "cls": b"0"},
        {"webp": blobs[2], "cls": b"1"},
        {"bin": blobs[3], "cls": b"0"},
    ]
    reader = HDF5Reader(str(path), images="bytes", labels=None)
    assert reader.read(reader.refs()[0]).fields == {"webp": blobs[2]}
    reader = HDF5Reader(str(path), images="void", labels=None)
    refs = reader.refs()
    assert [r.size for r in refs] == [10, 10]
    assert [list(reader.read(r).fields) for r in refs] == [["png"], ["jpg"]]


def test_missing_and_bad_datasets(tmp_path: Path) -> None:
    path = write(tmp_path / "d.h5", pictures=pixels(2, 4, 4), group_labels=np.arange(2))
    with pytest.raises(SourceError, match=r"dataset 'images' does not exist; .*\['group_labels'"):
        HDF5Reader(str(path)).refs()
    with pytest.raises(SourceError, match="dataset 'lbl' does not exist"):
        HDF5Reader(str(path), images="pictures", labels="lbl").refs()
    assert [r.label for r in HDF5Reader(str(path), images="pictures").refs()] == [-1, -1]

    path = write(tmp_path / "m.h5", images=pixels(3, 4, 4), labels=np.arange(2))
    with pytest.raises(SourceError, match="2 labels in /labels for 3 images"):
        HDF5Reader(str(path)).refs()
    path = write(tmp_path / "f.h5", images=pixels(2, 4, 4), labels=np.array([0.5, 1.0]))
    with pytest.raises(SourceError, match="must hold N integers"):
        HDF5Reader(str(path)).refs()


@pytest.mark.parametrize(
    "array",
    [
        np.zeros((2, 4, 4), dtype=np.float32),
        np.zeros((2, 4, 4, 5), dtype=np.uint8),
        np.zeros((2, 16), dtype=np.uint8),
        np.zeros((2,), dtype=np.int64),
    ],
)
def test_unsupported_images_dataset(tmp_path: Path, array: np.ndarray[Any, Any]) -> None:
    path = write(tmp_path / "u.h5", images=array)
    with pytest.raises(SourceError, match="unsupported images dataset /images"):
        HDF5Reader(str(path)).refs()


def test_jpeg_with_alpha_and_empty_and_not_hdf5(tmp_path: Path) -> None:
    path = write(tmp_path / "a.h5", images=pixels(1, 4, 4, 4))
    with pytest.raises(SourceError, match="4 channels, which JPEG cannot hold"):
        HDF5Reader(str(path), image_format="jpg").refs()
    path = write(tmp_path / "e.h5", images=np.zeros((0, 4, 4), dtype=np.uint8))
    with pytest.raises(SourceError, match="is empty"):
        HDF5Reader(str(path)).refs()
    (tmp_path / "n.h5").write_bytes(b"not hdf5")
    with pytest.raises(SourceError, match="cannot open as HDF5"):
        HDF5Reader(str(tmp_path / "n.h5")).refs()


def test_s3_file_is_downloaded_once_and_removed(s3_bucket: Any, tmp_path: Path) -> None:
    array = pixels(2, 4, 4, 3)
    local = write(tmp_path / "r.h5", images=array, labels=np.array([1, 0]))
    s3_bucket.store().put("data/r.h5", local.read_bytes())
    reader = HDF5Reader(f"{s3_bucket.url}/data/r.h5", storage_options=s3_bucket.options())
    refs = reader.refs()
    assert [(r.key, r.label) for r in refs] == [("r_00000000", 1), ("r_00000001", 0)]
    handle = reader._handle
    assert handle is not None
    assert handle.temp is not None
    temp = Path(handle.temp)
    assert temp.exists()
    np.testing.assert_array_equal(decode(reader.read(refs[1]).fields["png"]), array[1])
    clone = reloaded(reader)
    assert clone.read(refs[0]).label == 1
    reader.close()
    assert not temp.exists()
    clone_handle = clone._handle
    assert clone_handle is not None
    assert clone_handle.temp is not None
    clone_temp = Path(clone_handle.temp)
    del clone, clone_handle
    gc.collect()
    assert not clone_temp.exists()
    with pytest.raises(SourceError, match=r"missing\.h5"):
        HDF5Reader(f"{s3_bucket.url}/missing.h5", storage_options=s3_bucket.options()).refs()


def test_missing_h5py_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "x.h5", images=pixels(1, 4, 4))
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match=r"pip install 'stoker\[hdf5\]'"):
        HDF5Reader(str(path)).refs()


def test_class_names_attribute_as_json_and_fixed_strings(tmp_path: Path) -> None:
    path = write(
        tmp_path / "j.h5",
        images=np.array([b"\xff\xd8\xff-a", b"b"], dtype="S5"),
        attrs={"class_names": '["x", "y"]'},
    )
    reader = HDF5Reader(str(path))
    assert list(reader.class_names) == ["x", "y"]
    refs = reader.refs()
    assert [r.size for r in refs] == [5, 5]
    assert [reader.read(r).fields for r in refs] == [{"jpg": b"\xff\xd8\xff-a"}, {"bin": b"b"}]
    assert HDF5Reader(str(path), class_names=["q"]).class_names == ("q",)
