"""stoker's CRC-32 is zlib's, value for value, whatever buffer it is given; without zlib-ng
it is the standard library's."""

from __future__ import annotations

import importlib.util
import sys
import zlib

import numpy as np
import pytest

import stoker.core.crc
from stoker.core.crc import crc32


@pytest.mark.parametrize("size", [0, 1, 511, 5 * 1024 + 3, 1 << 20])
def test_the_same_values_as_zlib_for_every_kind_of_buffer(size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size + 7, dtype=np.uint8).tobytes()
    expected = zlib.crc32(data[7:])
    assert crc32(data[7:]) == expected
    assert crc32(memoryview(data)[7:]) == expected  # a view into a larger buffer
    assert crc32(bytearray(data[7:])) == expected
    assert crc32(np.frombuffer(data, dtype=np.uint8)[7:]) == expected
    half = 7 + size // 2
    assert crc32(data[half:], crc32(data[7:half])) == expected  # continued


def test_zlib_ng_computes_it_where_installed() -> None:
    assert crc32.__module__.startswith("zlib_ng")


def test_without_zlib_ng_the_standard_librarys_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zlib_ng", None)  # import zlib_ng raises ImportError
    monkeypatch.setitem(sys.modules, "zlib_ng.zlib_ng", None)
    path = stoker.core.crc.__file__
    assert path is not None
    spec = importlib.util.spec_from_file_location("crc_without_zlib_ng", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.crc32 is zlib.crc32
