"""Fields of any record: decoders by extension, the choice of fields, collation."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
from PIL import Image

from stoker.pipeline.fields import (
    FieldsConfig,
    MissingField,
    collate,
    decode_fields,
    decode_npy,
    decoder_for,
)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def png_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_member_is_decoded_by_its_extension() -> None:
    mask = np.arange(12, dtype=np.uint8).reshape(3, 4)
    sample = {
        "key": "0001",
        "label": -1,  # no label: a cls member holding the label is the batch's label
        "jpg": b"(the transformed image)",
        "txt": b"a dog on a mat",
        "json": json.dumps({"w": 640, "tags": ["dog"]}).encode(),
        "npy": npy_bytes(np.arange(5, dtype=np.float32)),
        "cls": b"3\n",
        "seg.png": png_bytes(mask),
        "flac": b"fLaC...",
        "pyd": pickle.dumps({"x": 1}),
    }
    out = decode_fields(sample, FieldsConfig(), skip=("jpg",))
    assert sorted(out) == ["cls", "flac", "json", "npy", "pyd", "seg.png", "txt"]
    assert out["txt"] == "a dog on a mat"
    assert out["json"] == {"w": 640, "tags": ["dog"]}
    assert out["cls"] == 3
    np.testing.assert_array_equal(out["npy"], np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(out["seg.png"], mask)
    assert out["flac"] == b"fLaC..."
    # A pickle member is bytes, never loaded.
    assert out["pyd"] == sample["pyd"]


def test_a_member_named_like_a_loader_field_is_renamed_not_dropped() -> None:
    out = decode_fields({"key": "a", "label": 1, "index": b"7"}, FieldsConfig())
    assert out == {"index_member": 7}


def test_chosen_fields_rename_pick_alternatives_and_transform() -> None:
    config = FieldsConfig(
        select={"caption": "txt", "meta": ("json", "jsn")},
        transforms={"caption": str.upper},
    )
    out = decode_fields({"key": "a", "txt": b"hi", "jsn": b"[1]", "npy": b"ignored"}, config)
    assert out == {"caption": "HI", "meta": [1]}


def test_registered_decoder_wins_over_the_table() -> None:
    config = FieldsConfig(decoders={"flac": lambda b: len(b), "txt": lambda b: b[::-1]})
    assert decode_fields({"flac": b"1234", "txt": b"ab"}, config) == {"flac": 4, "txt": b"ba"}


def test_missing_field_policies() -> None:
    sample = {"key": "doc7", "npy": npy_bytes(np.zeros(2))}
    with pytest.raises(
        MissingField, match=r"no field 'caption' \(member 'txt'; the sample has \['npy'\]\)"
    ):
        decode_fields(sample, FieldsConfig(select={"caption": "txt"}))
    out = decode_fields(sample, FieldsConfig(select={"caption": "txt"}, missing="none"))
    assert out == {"caption": None}


@pytest.mark.parametrize(
    ("ext", "data", "message"),
    [
        ("txt", b"caf\xe9", "not UTF-8 text: unexpected end of data at byte 3"),
        ("json", b'{"a": ', "invalid JSON"),
        ("cls", b"seven", "not an integer"),
        ("npy", npy_bytes(np.arange(10))[:-8], "needs 80 bytes of data, has 72"),
        ("npy", b"\x93NUMPY\x01\x00" + b"junk", "not an npy array"),
        ("npy", b"not npy at all", "not an npy array"),
    ],
)
def test_bad_members_name_the_field(ext: str, data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=rf"field '{ext}' \(member '{ext}'\): .*{message}"):
        decode_fields({"key": "s", ext: data}, FieldsConfig())


def test_object_npy_stays_bytes_never_unpickled() -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert decode_npy(buffer.getvalue()) == buffer.getvalue()


def test_npy_keeps_dtype_shape_and_order() -> None:
    array = np.asfortranarray(np.arange(12, dtype=">i4").reshape(3, 4))
    out = decode_npy(npy_bytes(array))
    assert isinstance(out, np.ndarray)
    assert out.dtype == array.dtype
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(out, array)
    out[0, 0] = 99  # a writable array of its own


def test_decoder_lookup_by_last_part_of_the_extension() -> None:
    assert decoder_for("seg.png") is decoder_for("png")
    assert decoder_for("unknown")(b"x") == b"x"


def test_collate_stacks_pads_and_lists() -> None:
    same = [np.ones(3, np.float32), np.zeros(3, np.float32)]
    assert collate("x", same)["x"].shape == (2, 3)
    ragged = [np.arange(2, dtype=np.int32), np.arange(4, dtype=np.int32)]
    assert isinstance(collate("x", ragged)["x"], list)
    padded = collate("x", ragged, pad=-1)
    np.testing.assert_array_equal(padded["x"], [[0, 1, -1, -1], [0, 1, 2, 3]])
    np.testing.assert_array_equal(padded["x_lengths"], [2, 4])
    assert padded["x"].dtype == np.int32
    assert collate("t", ["a", "b"]) == {"t": ["a", "b"]}
    assert collate("t", ["a", None]) == {"t": ["a", None]}
    np.testing.assert_array_equal(collate("c", [1, 2])["c"], [1, 2])
    assert collate("j", [{"a": 1}, [2]]) == {"j": [{"a": 1}, [2]]}


def test_collate_refuses_mixed_dtypes_naming_the_field() -> None:
    with pytest.raises(ValueError, match="field 'emb': arrays of different dtypes"):
        collate("emb", [np.zeros(2, np.float32), np.zeros(2, np.float64)])
    with pytest.raises(ValueError, match="field 'emb': arrays can be padded"):
        collate("emb", [np.zeros((2, 3)), np.zeros((2, 4))], pad=0)


def test_config_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="missing must be"):
        FieldsConfig(missing="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"select\['a'\] must be an extension"):
        FieldsConfig(select={"a": ()})
    with pytest.raises(TypeError, match=r"transforms\['a'\] must be callable"):
        FieldsConfig(select={"a": "txt"}, transforms={"a": 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"transforms\['b'\] names no field"):
        FieldsConfig(select={"a": "txt"}, transforms={"b": str})
    with pytest.raises(TypeError, match=r"pad\['a'\] must be a number"):
        FieldsConfig(pad={"a": "0"})  # type: ignore[dict-item]
