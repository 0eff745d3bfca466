"""Issue 23's acceptance test: image-caption-JSON tars written by the webdataset library's
own ``TarWriter``, in a bucket, both indexed in place and packed by stoker. Every caption,
JSON object and image (whole, no transform) equals what webdataset's own pipeline decodes
from the same tars, matched by key, through the Loader, ``TorchLoader`` with 2 workers,
``make_dataset`` (a Keras ``fit`` runs on images and strings) and ``JaxLoader``.

TensorFlow and JAX run in one child process (this file, run as a script) that saves what
each saw; it starts as soon as the data is in the bucket and runs beside the in-process
tests. They cannot run in the test process: see tests/integrations/test_tensorflow.py and
test_jax.py (TensorFlow's protobuf names clash with the ``tfrecord`` package's; JAX warns
on every later ``os.fork()``).
"""

from __future__ import annotations

import gc
import importlib.util
import io
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from stoker import DecodeConfig
from stoker.cli.main import cli
from stoker.pipeline.loader import Loader
from stoker.testing.images import make_jpeg

SAMPLES, SHARDS = 40, 3
WIDTH, HEIGHT = 37, 29  # odd sizes, not multiples of a JPEG block
BATCH = 8  # divides SAMPLES: JaxLoader drops an incomplete last batch
BUCKET = "records-vs-wds"
KINDS = ("indexed", "packed")
CAPTIONS = (
    "a cat on a mat",
    "Straße in München, ünïcode",
    "東京の夜景 \N{SNOWMAN} and an emoji \N{GRINNING FACE}",
    "שלום עולם, right to left",
    "e\u0301 combining accent, tab\tand\nnewline",
)


def _image(i: int) -> bytes:
    """A JPEG of WIDTH x HEIGHT: mostly baseline RGB, some grey and some progressive."""
    rng = np.random.default_rng(i)
    if i % 10 == 7:
        grey = Image.open(io.BytesIO(make_jpeg(rng, width=WIDTH, height=HEIGHT))).convert("L")
        out = io.BytesIO()
        grey.save(out, format="JPEG", quality=90)
        return out.getvalue()
    if i % 10 == 4:
        rgb = Image.open(io.BytesIO(make_jpeg(rng, width=WIDTH, height=HEIGHT)))
        out = io.BytesIO()
        rgb.save(out, format="JPEG", quality=75, progressive=True, subsampling=0)
        return out.getvalue()
    return make_jpeg(rng, width=WIDTH, height=HEIGHT)


def _record(i: int) -> dict[str, Any]:
    """One sample of the LAION / CC3M layout, with a class for Keras to fit."""
    return {
        "__key__": f"{i:04d}",
        "jpg": _image(i),
        "txt": f"{i}: {CAPTIONS[i % len(CAPTIONS)]}",
        "json": {
            "id": i,
            "url": f"https://example.com/{i}.jpg",
            "similarity": 0.25 + i / 64,
            "nsfw": None if i % 3 else False,
            "meta": {"size": [WIDTH, HEIGHT], "tags": ["t"] * (i % 3), "ü": {"deep": [i, [i]]}},
        },
        "cls": i % 3,
    }


@dataclass(frozen=True)
class Data:
    """The bucket's two datasets and the reference webdataset decoded from the same tars."""

    urls: dict[str, str]  # kind -> dataset URL
    options: dict[str, Any]  # storage options for the bucket
    reference: dict[str, dict[str, Any]]  # key -> {"jpg": array, "txt": str, "json": obj}
    child: subprocess.Popen[bytes] | None  # the TensorFlow and JAX child, if they are here
    out: Path  # where the child saves what it saw


def _reference(tars: list[Path]) -> dict[str, dict[str, Any]]:
    """webdataset's own pipeline over the tars: rgb8 images, captions, parsed JSON."""
    import webdataset as wds

    urls = [str(tar) for tar in tars]
    with warnings.catch_warnings():
        # webdataset 1.0 leaves each tar it read open for the garbage collector.
        warnings.simplefilter("ignore", ResourceWarning)
        pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8")
        samples = {sample["__key__"]: sample for sample in pipeline}
        del pipeline
        gc.collect()
    return samples


@pytest.fixture(scope="module")
def data(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    import webdataset as wds

    root = tmp_path_factory.mktemp("wds-records")
    tars = [root / f"pairs-{n:04d}.tar" for n in range(SHARDS)]
    for n, tar in enumerate(tars):
        with wds.TarWriter(str(tar)) as sink:
            for i in range(n, SAMPLES, SHARDS):  # keys interleave over the shards
                sink.write(_record(i))
    s3_server.create_bucket(BUCKET)
    options = s3_server.storage_options()
    urls = {"indexed": f"s3://{BUCKET}/tars", "packed": f"s3://{BUCKET}/packed"}
    # As a user would: upload the tars, index them in place, pack them.
    env = {
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
        "AWS_REGION": options["region"],
    }
    for command in (
        ["upload", str(root), urls["indexed"]],
        ["index", urls["indexed"], "--json"],
        ["pack", urls["indexed"], urls["packed"], "--samples-per-shard", "16", "--json"],
    ):
        result = CliRunner(env=env).invoke(cli, command)
        assert result.exit_code == 0, result.output
        if command[0] != "upload":
            assert json.loads(result.output)["samples"] == SAMPLES
    assert json.loads(result.output)["skipped"] == []
    assert json.loads(result.output)["source_format"] == "webdataset"
    child = None
    if all(importlib.util.find_spec(name) for name in ("tensorflow", "jax")):
        command = [sys.executable, __file__, json.dumps(urls), json.dumps(options), str(root)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        with (root / "child.log").open("w") as log:  # a file: a full pipe would stall it
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield Data(urls, options, _reference(tars), child, root)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()


def _check(
    reference: Mapping[str, Mapping[str, Any]],
    rows: Iterable[tuple[str, Any, str, Any]],
) -> None:
    """Each (key, image, caption, JSON) row equals webdataset's, and every key comes once."""
    seen = []
    for key, image, text, meta in rows:
        theirs = reference[key]
        assert text == theirs["txt"], key
        assert meta == theirs["json"], key
        assert json.dumps(meta) == json.dumps(theirs["json"]), key  # key order, types
        image = np.asarray(image)
        assert image.dtype == np.uint8, key
        assert image.shape == theirs["jpg"].shape == (HEIGHT, WIDTH, 3), key
        np.testing.assert_array_equal(image, theirs["jpg"], err_msg=key)
        seen.append(key)
    assert sorted(seen) == sorted(reference)


def test_the_reference_is_what_was_written(data: Data) -> None:
    # webdataset's decoding is the reference: check that it decoded what the tars hold.
    assert sorted(data.reference) == [f"{i:04d}" for i in range(SAMPLES)]
    for key, sample in data.reference.items():
        written = _record(int(key))
        assert (sample["txt"], sample["json"]) == (written["txt"], written["json"])
        pixels = np.asarray(Image.open(io.BytesIO(written["jpg"])).convert("RGB"))
        np.testing.assert_array_equal(sample["jpg"], pixels)


@pytest.mark.parametrize("kind", KINDS)
def test_loader(data: Data, kind: str) -> None:
    with Loader(
        data.urls[kind],
        batch_size=BATCH,
        decode=DecodeConfig(threads=2),
        storage_options=data.options,
    ) as loader:
        batches = list(loader)
    assert all(isinstance(b["txt"], list) and isinstance(b["json"], list) for b in batches)
    _check(
        data.reference,
        (
            row
            for b in batches
            for row in zip(b["key"], b["image"], b["txt"], b["json"], strict=True)
        ),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_torch_loader_with_two_workers(data: Data, kind: str) -> None:
    import torch

    from stoker.integrations.torch import TorchLoader

    loader = TorchLoader(
        data.urls[kind], batch_size=BATCH, num_workers=2, storage_options=data.options
    )
    batches = list(loader)
    for batch in batches:
        assert isinstance(batch["image"], torch.Tensor)
        assert isinstance(batch["txt"], list)
        assert isinstance(batch["json"], list)
    _check(
        data.reference,
        (
            (key, image.numpy(), text, meta)
            for b in batches
            for key, image, text, meta in zip(
                b["key"], b["image"], b["txt"], b["json"], strict=True
            )
        ),
    )


def test_cmyk_jpegs_are_within_one_of_webdatasets(tmp_path: Path) -> None:
    # Known difference, not pixel-equal: stoker converts CMYK (Adobe, inverted) JPEGs with
    # simplejpeg's formula, Pillow (webdataset's rgb8) with its own rounding; nearly every
    # value differs by one. Bounded here so that a real fault (channels swapped, CMYK not
    # inverted) still fails.
    import webdataset as wds

    from stoker.pack.indexer import index_webdataset as index

    rgb = Image.open(io.BytesIO(make_jpeg(np.random.default_rng(0), width=WIDTH, height=HEIGHT)))
    out = io.BytesIO()
    rgb.convert("CMYK").save(out, format="JPEG", quality=95)
    with wds.TarWriter(str(tmp_path / "cmyk-0000.tar")) as sink:
        sink.write({"__key__": "cmyk", "jpg": out.getvalue(), "txt": "CMYK"})
    index(tmp_path)
    theirs = _reference([tmp_path / "cmyk-0000.tar"])["cmyk"]["jpg"]
    with Loader(str(tmp_path), batch_size=1) as loader:
        (batch,) = list(loader)
    ours = np.asarray(batch["image"][0])
    assert ours.shape == theirs.shape == (HEIGHT, WIDTH, 3)
    assert np.abs(ours.astype(np.int16) - theirs).max() <= 1


@pytest.fixture(scope="module")
def child_saw(data: Data) -> dict[str, Any]:
    """What TensorFlow and JAX saw, as the child saved it."""
    if data.child is None:
        pytest.fail("tensorflow and jax are needed (pip install -e '.[test]')")
    returncode = data.child.wait(timeout=240)
    assert returncode == 0, (data.out / "child.log").read_text()[-4000:]
    facts = json.loads((data.out / "facts.json").read_text())
    with np.load(data.out / "images.npz") as saved:
        facts["images"] = dict(saved)
    return dict(facts)


@pytest.mark.parametrize("kind", KINDS)
def test_make_dataset_and_keras_fit(data: Data, child_saw: dict[str, Any], kind: str) -> None:
    seen = child_saw["tf"][kind]
    _check(
        data.reference,
        zip(
            seen["key"],
            child_saw["images"][f"tf-{kind}"],
            seen["txt"],
            [json.loads(text) for text in seen["json"]],
            strict=True,
        ),
    )
    # Keras fit ran one epoch of two steps on (image, caption) -> class, and what it
    # trained on was the samples as webdataset decodes them, each image with its caption.
    fit = child_saw["fit"][kind]
    assert len(fit["loss"]) == 1
    assert np.isfinite(fit["loss"][0])
    assert len(fit["txt"]) == 2 * BATCH
    by_caption = {sample["txt"]: key for key, sample in data.reference.items()}
    keys = [by_caption[text] for text in fit["txt"]]
    assert len(set(keys)) == len(keys)
    fit_images = child_saw["images"][f"fit-{kind}"]
    for key, image, cls in zip(keys, fit_images, fit["cls"], strict=True):
        np.testing.assert_array_equal(image, data.reference[key]["jpg"], err_msg=key)
        assert cls == data.reference[key]["cls"]


@pytest.mark.parametrize("kind", KINDS)
def test_jax_loader(data: Data, child_saw: dict[str, Any], kind: str) -> None:
    seen = child_saw["jax"][kind]
    # Images and classes were jax.Arrays over the child's two CPU devices; text and JSON
    # stayed on the host.
    assert seen["types"] == {
        "image": "ArrayImpl",
        "label": "ArrayImpl",
        "txt": "list",
        "json": "list",
    }
    assert seen["devices"] == 2
    _check(
        data.reference,
        zip(
            seen["key"], child_saw["images"][f"jax-{kind}"], seen["txt"], seen["json"], strict=True
        ),
    )


def test_jax_keeps_64_bit_values_or_names_the_field(child_saw: dict[str, Any]) -> None:
    # Without jax_enable_x64 JAX keeps 64-bit numbers in 32 bits: values that fit (and
    # float64 rounded to float32) pass; values that would change are an error naming the
    # field, where JAX wrapped them silently (2**40 became 0). Big-endian arrays (numpy's
    # '>f4') raised JAX's TypeError; longdouble, which JAX has no type for, stays numpy.
    made = child_saw["jax_dtypes"]
    for name in ("fits_int32", "big_endian", "big_endian_int64", "float64"):
        values, dtype = WIDE_FIELDS[name]
        expected = np.array(values, dtype=dtype).astype(np.float32 if "f" in dtype else np.int32)
        assert made[name].get("type") == "ArrayImpl", made[name]
        assert made[name]["dtype"] == expected.dtype.name, name
        assert made[name]["values"] == expected.astype(np.float64).tolist(), name
    if np.dtype(np.longdouble).itemsize > 8:  # x86-64: float128 (arm64: float64 itself)
        assert made["longdouble"].get("type") == "ndarray", made["longdouble"]
        assert made["longdouble"]["values"] == [1, 2, 3, 4]
    for name, reason in (
        ("ns_timestamp", "int64 values from 0 to 1700000000000000000 do not fit int32"),
        ("uint64_id", "uint64 values from 1 to 9223372036854775808 do not fit uint32"),
        ("float64_huge", "float64 values beyond the range of float32"),
    ):
        assert made[name]["error"].startswith(f"ValueError: field {name!r}: {reason}"), made[name]
        assert "jax_enable_x64" in made[name]["error"]


# -- the child: everything that needs TensorFlow or JAX ------------------------------------


def child(urls: dict[str, str], options: dict[str, Any], out: Path) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 2)  # before JAX starts
    facts: dict[str, Any] = {"tf": {}, "fit": {}, "jax": {}}
    images: dict[str, np.ndarray] = {}
    for kind, url in urls.items():
        facts["tf"][kind], facts["fit"][kind] = tensorflow_pass(url, options, images, kind)
        facts["jax"][kind] = jax_pass(url, options, images, kind)
    facts["jax_dtypes"] = jax_dtypes()
    np.savez(out / "images.npz", **images)
    (out / "facts.json").write_text(json.dumps(facts))


def tensorflow_pass(
    url: str, options: dict[str, Any], images: dict[str, np.ndarray], kind: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    import keras

    from stoker.integrations.tensorflow import make_dataset

    seen: dict[str, list[Any]] = {"key": [], "txt": [], "json": []}
    every = make_dataset(
        url, batch_size=BATCH, fields=("key", "image", "txt", "json"), storage_options=options
    )
    pixels = []
    for keys, image, text, meta in every:
        seen["key"] += [k.decode() for k in keys.numpy().tolist()]
        seen["txt"] += [t.decode() for t in text.numpy().tolist()]
        seen["json"] += [m.decode() for m in meta.numpy().tolist()]
        pixels.append(image.numpy())
    images[f"tf-{kind}"] = np.concatenate(pixels)

    trained: list[tuple[np.ndarray, list[str], np.ndarray]] = []

    class Recording(keras.Model):  # type: ignore[misc]
        def train_step(self, batch: Any) -> Any:
            (image, text), cls = batch
            trained.append((image.numpy(), [t.decode() for t in text.numpy()], cls.numpy()))
            return super().train_step(batch)

    pairs = make_dataset(
        url, batch_size=BATCH, fields=(("image", "txt"), "label"), storage_options=options
    )
    image_in = keras.Input((HEIGHT, WIDTH, 3), dtype="uint8")
    text_in = keras.Input((), dtype="string")
    pooled = keras.layers.GlobalAveragePooling2D()(keras.layers.Rescaling(1 / 255)(image_in))
    words = keras.layers.Embedding(16, 4)(keras.layers.Hashing(num_bins=16)(text_in))
    joined = keras.layers.Concatenate()([pooled, words])
    model = Recording([image_in, text_in], keras.layers.Dense(3, activation="softmax")(joined))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", run_eagerly=True)
    history = model.fit(pairs, epochs=1, steps_per_epoch=2, verbose=0)
    images[f"fit-{kind}"] = np.concatenate([image for image, _, _ in trained])
    fit = {
        "loss": history.history["loss"],
        "txt": [t for _, texts, _ in trained for t in texts],
        "cls": [int(c) for _, _, cls in trained for c in cls],
    }
    return seen, fit


def jax_pass(
    url: str, options: dict[str, Any], images: dict[str, np.ndarray], kind: str
) -> dict[str, Any]:
    import jax

    from stoker.integrations.jax import JaxLoader

    seen: dict[str, Any] = {"key": [], "txt": [], "json": [], "types": {}}
    pixels = []
    with JaxLoader(url, batch_size=BATCH, storage_options=options) as loader:
        for batch in loader:
            seen["types"] = {
                name: type(batch[name]).__name__ for name in ("image", "label", "txt", "json")
            }
            seen["devices"] = len(batch["image"].sharding.device_set)
            seen["key"] += batch["key"]
            seen["txt"] += batch["txt"]
            seen["json"] += batch["json"]
            pixels.append(np.asarray(jax.device_get(batch["image"])))
    images[f"jax-{kind}"] = np.concatenate(pixels)
    return seen


#: Fields of 64-bit numbers (an npy of ids, timestamps, measurements) and of the dtypes
#: JAX has no type for: field -> four rows of values and their dtype.
WIDE_FIELDS: dict[str, tuple[list[Any], str]] = {
    "fits_int32": ([2**31 - 1, -(2**31), 0, 7], "<i8"),
    "big_endian": ([0.5, -1.25, 3.0, 1e30], ">f4"),
    "big_endian_int64": ([1, 2, 3, -4], ">i8"),
    "float64": ([0.1, 1e-50, float("inf"), 3e38], "<f8"),
    "longdouble": ([1.0, 2.0, 3.0, 4.0], "longdouble"),
    "ns_timestamp": ([1_700_000_000_000_000_000, 0, 1, 2], "<i8"),
    "uint64_id": ([2**63, 1, 2, 3], "<u8"),
    "float64_huge": ([1e300, 0.0, 1.0, 2.0], "<f8"),
}


def jax_dtypes() -> dict[str, Any]:
    """What to_arrays makes of each of WIDE_FIELDS, one at a time: its dtype and values,
    or its error."""
    from stoker.integrations.jax import batch_sharding, to_arrays

    made: dict[str, Any] = {}
    for name, (values, dtype) in WIDE_FIELDS.items():
        try:
            (placed,) = to_arrays({name: np.array(values, dtype=dtype)}, batch_sharding()).values()
        except Exception as exc:  # any error: the test says which one it wants
            made[name] = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            made[name] = {
                "type": type(placed).__name__,
                "dtype": str(placed.dtype),
                "values": np.asarray(placed).astype(np.float64).tolist(),
            }
    return made


if __name__ == "__main__":
    child(json.loads(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3]))
