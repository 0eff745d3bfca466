"""Packing every kind of input, each followed by verify; and packing with Ray."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import h5py
import numpy as np
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.cli.main import cli
from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.pack.reencode import ImagePolicy
from stoker.pack.sources import guess_format
from stoker.testing.images import make_jpeg

RNG = np.random.default_rng(7)
JPEGS = [make_jpeg(RNG, width=40 + i, height=30) for i in range(12)]


def _write_wds(path: Path, items: list[tuple[str, dict[str, bytes]]]) -> None:
    with tarfile.open(path, "w") as tar:
        for key, fields in items:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_pack_tfrecord_from_reference_writer(s3_bucket, tmp_path: Path) -> None:
    import tfrecord

    path = tmp_path / "train.tfrecord"
    writer = tfrecord.TFRecordWriter(str(path))
    for i, jpeg in enumerate(JPEGS):
        writer.write({"image/encoded": (jpeg, "byte"), "image/class/label": (i % 3, "int")})
    writer.close()
    s3_bucket.store("tf").put("train.tfrecord", path.read_bytes())
    options = s3_bucket.options()
    assert guess_format(f"{s3_bucket.url}/tf", storage_options=options) == "tfrecord"
    report = pack(
        f"{s3_bucket.url}/tf",
        f"{s3_bucket.url}/ds",
        storage_options=options,
        config=PackConfig(samples_per_shard=5, shuffle_seed=None),  # compared in input order
    )
    assert (report.source_format, report.samples, report.shards) == ("tfrecord", 12, 3)
    dataset = open_dataset(f"{s3_bucket.url}/ds", storage_options=options)
    assert dataset.verify().ok
    got = dataset.read_many(range(12))
    assert [s["jpg"] for s in got] == JPEGS
    assert [s["label"] for s in got] == [i % 3 for i in range(12)]


def test_pack_hdf5_pixels_and_encoded(tmp_path: Path) -> None:
    pixels = RNG.integers(0, 255, size=(6, 16, 20, 3), dtype=np.uint8)
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["images"] = pixels
        f["labels"] = np.arange(6) % 2
        f.attrs["class_names"] = ["even", "odd"]
    report = pack(tmp_path / "data.h5", tmp_path / "ds", config=PackConfig(shuffle_seed=None))
    assert (report.source_format, report.samples) == ("hdf5", 6)
    dataset = open_dataset(tmp_path / "ds")
    assert dataset.class_names == ["even", "odd"]
    assert dataset.verify().ok
    from PIL import Image

    for i, sample in enumerate(dataset.read_many(range(6))):
        with Image.open(io.BytesIO(sample["png"])) as image:
            assert np.array_equal(np.asarray(image), pixels[i])  # PNG is lossless
        assert sample["label"] == i % 2


def test_pack_webdataset_tars_with_resize(tmp_path: Path) -> None:
    (tmp_path / "wds").mkdir()
    items = [(f"img{i:03d}", {"jpg": JPEGS[i], "cls": str(i % 4).encode()}) for i in range(12)]
    _write_wds(tmp_path / "wds" / "a.tar", items[:7])
    _write_wds(tmp_path / "wds" / "b.tar", items[7:])
    result = CliRunner().invoke(
        cli,
        [
            "pack",
            str(tmp_path / "wds"),
            str(tmp_path / "ds"),
            "--resize",
            "16",
            "--quality",
            "70",
            "--keep-order",  # compared in input order
        ],
    )
    assert result.exit_code == 0, result.output
    assert "as webdataset" in result.output
    dataset = open_dataset(tmp_path / "ds")
    assert dataset.verify().ok
    assert [s["label"] for s in dataset.read_many(range(12))] == [i % 4 for i in range(12)]


def test_pack_csv_list_with_class_names(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    rows = ["path,label"]
    for i, jpeg in enumerate(JPEGS[:6]):
        (tmp_path / "img" / f"{i}.jpg").write_bytes(jpeg)
        rows.append(f"img/{i}.jpg,{'cat' if i % 2 else 'dog'}")
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    report = pack(tmp_path / "list.csv", tmp_path / "ds", config=PackConfig(shuffle_seed=None))
    assert report.source_format == "list"
    dataset = open_dataset(tmp_path / "ds")
    assert dataset.class_names == ["cat", "dog"]
    assert [dataset.class_names[s["label"]] for s in dataset.read_many(range(6))] == [
        "dog",
        "cat",
        "dog",
        "cat",
        "dog",
        "cat",
    ]
    assert dataset.verify().ok


def test_pack_with_ray_on_a_local_cluster(s3_bucket, tmp_path: Path) -> None:
    import ray

    from stoker.testing.images import write_image_folder

    write_image_folder(tmp_path / "src", files=40, classes=2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        options = s3_bucket.options()
        report = pack(
            tmp_path / "src",
            f"{s3_bucket.url}/ray",
            config=PackConfig(engine="ray", samples_per_shard=10),
            storage_options=options,
        )
    finally:
        ray.shutdown()
    assert (report.samples, report.shards) == (40, 4)
    dataset = open_dataset(f"{s3_bucket.url}/ray", storage_options=options)
    assert dataset.verify().ok
    originals = {
        p.relative_to(tmp_path / "src").with_suffix("").as_posix(): p.read_bytes()
        for p in (tmp_path / "src").rglob("*.jpg")
    }
    assert {s["key"]: s["jpg"] for s in dataset.read_many(range(40))} == originals


samples = st.lists(
    st.tuples(
        st.dictionaries(
            st.sampled_from(["bin", "txt", "json"]),
            st.binary(max_size=2000),
            min_size=1,
            max_size=3,
        ),
        st.integers(0, 9),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(items=samples, per_shard=st.integers(1, 8), seed=st.none() | st.integers(0, 5))
def test_pack_round_trip_property(tmp_path_factory, items, per_shard, seed) -> None:
    """Whatever the samples, pack then read returns every sample's bytes and label."""
    root = tmp_path_factory.mktemp("prop")
    source = [
        (f"s{i:04d}", {**fields, "cls": str(label).encode()}, label)
        for i, (fields, label) in enumerate(items)
    ]
    _write_wds(root / "in.tar", [(k, f) for k, f, _ in source])
    pack(
        root / "in.tar",
        root / "ds",
        config=PackConfig(
            samples_per_shard=per_shard, shuffle_seed=seed, images=ImagePolicy(check=False)
        ),
    )
    dataset = open_dataset(root / "ds")
    got = {s["key"]: s for s in dataset.read_many(range(len(dataset)))}
    assert len(got) == len(source)
    for key, fields, label in source:
        assert got[key]["label"] == label
        assert {k: v for k, v in got[key].items() if k not in ("key", "label")} == fields
    manifest = json.loads((root / "ds" / "index.json").read_text())
    assert sum(s["samples"] for s in manifest["shards"]) == len(source)
