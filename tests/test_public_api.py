"""The public surface is explicit, sorted, and imports no framework."""

from __future__ import annotations

import subprocess
import sys

import stoker


def test_all_is_sorted_and_complete() -> None:
    assert stoker.__all__ == sorted(stoker.__all__)
    for name in stoker.__all__:
        assert hasattr(stoker, name), name


def test_import_loads_no_framework() -> None:
    code = (
        "import sys, stoker; "
        "print(sorted(m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_config_the_loader_takes_is_exported() -> None:
    import inspect
    import typing

    hints = typing.get_type_hints(stoker.Loader.__init__)
    configs = {
        arg.__name__
        for hint in hints.values()
        for arg in typing.get_args(hint) or (hint,)
        if isinstance(arg, type) and arg.__name__.endswith(("Config", "World"))
    }
    assert configs >= {"OrderConfig", "AutotuneConfig", "DecodeConfig", "CacheConfig", "World"}
    assert configs <= set(stoker.__all__), configs - set(stoker.__all__)
    assert len(inspect.signature(stoker.Loader).parameters) <= 12


def test_transforms_import_as_users_write_them() -> None:
    from stoker.transforms import CenterCrop, RandomResizedCrop, Resize

    assert stoker.transforms.RandomResizedCrop is RandomResizedCrop
    assert {CenterCrop, Resize} <= {
        getattr(stoker.transforms, n) for n in stoker.transforms.__all__
    }
