"""A sample's class reaches the batch once, as ``label``: the ``cls`` member that
``stoker pack`` writes and ``stoker index`` reads labels from is not repeated as ``cls``
(issue 33 item 6), and a ``cls`` member that says something else is not dropped."""

from __future__ import annotations

import numpy as np
import pytest

from stoker import DecodeConfig, FieldsConfig
from stoker.format.reader import open_dataset
from stoker.pipeline.fields import decode_fields
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import CenterCrop
from stoker.testing.images import write_image_folder, write_packed_images

FILES = 12
CLASSES = 3


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("class-once")
    packed = write_packed_images(root / "packed", files=FILES, classes=CLASSES, width=24, height=20)
    write_image_folder(root / "unpacked", files=FILES, classes=CLASSES, width=24, height=20)
    return {"packed": packed, "unpacked": str(root / "unpacked")}


@pytest.mark.parametrize("kind", ["packed", "unpacked"])
@pytest.mark.parametrize("method", ["thread", "process"])
def test_image_batches_carry_the_class_once_as_label(
    folders: dict[str, str], kind: str, method: str
) -> None:
    # fails before: the packed folder's batches had "cls" beside "label"
    decode = DecodeConfig(threads=2, method=method)  # type: ignore[arg-type]
    with Loader(folders[kind], batch_size=5, transform=CenterCrop(16), decode=decode) as loader:
        names = loader.dataset.class_names
        batches = list(loader)
    assert sum(len(batch["key"]) for batch in batches) == FILES
    for batch in batches:
        assert sorted(batch) == ["image", "index", "key", "label"]
        for key, label in zip(batch["key"], batch["label"].tolist(), strict=True):
            assert names[label] == key.split("/")[0]


def test_the_packed_sample_still_holds_its_cls_member(folders: dict[str, str]) -> None:
    # The member stays in the shard (WebDataset readers of the tars see it), and the
    # index's label is the number it holds.
    dataset = open_dataset(folders["packed"])
    for i in range(len(dataset)):
        sample = dataset[i]
        assert int(sample["cls"]) == sample["label"] >= 0


def test_a_selection_naming_cls_has_it_too(folders: dict[str, str]) -> None:
    fields = FieldsConfig(select={"image": "jpg", "cls": "cls"})
    with Loader(
        folders["packed"],
        batch_size=FILES,
        transform=CenterCrop(16),
        decode=DecodeConfig(fields=fields),
    ) as loader:
        (batch,) = list(loader)
    np.testing.assert_array_equal(batch["cls"], batch["label"])


@pytest.mark.parametrize(
    ("cls", "label", "carried"),
    [
        (b"3\n", 3, None),  # the label's own member: once, as label
        (b"4", 3, 4),  # a class that is not the label is carried
        (b"2", -1, 2),  # a sample without a label keeps its cls
    ],
)
def test_a_cls_member_is_left_out_only_where_it_is_the_label(
    cls: bytes, label: int, carried: int | None
) -> None:
    sample = {"key": "0001", "label": label, "cls": cls, "txt": b"a cat"}
    out = decode_fields(sample, FieldsConfig())
    assert out.get("cls") == carried
    assert out["txt"] == "a cat"


def test_a_cls_that_is_no_number_still_fails_by_name() -> None:
    sample = {"key": "0001", "label": -1, "cls": b"seven"}
    with pytest.raises(ValueError, match=r"field 'cls'.*not an integer"):
        decode_fields(sample, FieldsConfig())


def test_without_a_label_entry_cls_is_an_ordinary_member() -> None:
    assert decode_fields({"cls": b"5"}, FieldsConfig()) == {"cls": 5}


def test_a_member_named_label_beside_cls_stays() -> None:
    sample = {"key": "s", "label": 1, "cls": b"1", "label_member": b"9"}
    assert decode_fields(sample, FieldsConfig()) == {"label_member": 9}
