"""The public surface is explicit, sorted, and imports no framework."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_import_stoker_imports_no_export_until_it_is_used() -> None:
    # Each export's module loads on first use: `import stoker` alone is the package, and
    # stoker.pack (the package, callable as pack()) imports the packer at the first call.
    loaded = _run("import sys, stoker; print(sorted(m for m in sys.modules if 'stoker' in m))")
    assert loaded == "['stoker']"
    used = "import sys, stoker; stoker.Loader; print('stoker.pack.packer' in sys.modules)"
    assert _run(used) == "False"
    named = "import sys, stoker; stoker.pack; print('stoker.pack.packer' in sys.modules)"
    assert _run(named) == "False"


def test_a_training_process_imports_no_pack_cli_or_transfer_module() -> None:
    code = (
        "import sys; from stoker import Loader, OrderConfig; "
        "from stoker.transforms import RandomResizedCrop; "
        "print(sorted(m for m in sys.modules if m.startswith(('stoker.pack.', 'stoker.cli', "
        "'stoker.storage.transfer', 'stoker.profile', 'stoker.integrations', 'click', 'rich'))))"
    )
    assert _run(code) == "[]"


def test_every_export_is_what_its_module_defines() -> None:
    import importlib

    for name in stoker.__all__:
        where = stoker._EXPORTS[name]
        module = importlib.import_module(where)
        expected = module if where == f"stoker.{name}" else getattr(module, name)
        assert getattr(stoker, name) is expected, name
    assert set(stoker.__all__) <= set(dir(stoker))
    assert set(stoker._EXPORTS) == set(stoker.__all__)


def test_star_import_and_unknown_names() -> None:
    code = "from stoker import *\nimport stoker\nprint(sorted(set(stoker.__all__) - {*globals()}))"
    assert _run(code) == "[]"
    with pytest.raises(AttributeError, match="no attribute 'Lodaer'"):
        stoker.Lodaer  # noqa: B018
    code = "try:\n    from stoker import Lodaer\nexcept ImportError as exc:\n    print(exc)"
    assert "cannot import name 'Lodaer'" in _run(code)


def test_pack_stays_the_function_when_its_subpackage_is_imported_first() -> None:
    code = (
        "import inspect, stoker.pack.tokens, stoker.pack.packer, stoker; "
        "from stoker import pack; "
        "print(callable(stoker.pack), pack is stoker.pack, "
        "inspect.signature(pack) == inspect.signature(stoker.pack.packer.pack), "
        "pack.__doc__ == stoker.pack.packer.pack.__doc__)"
    )
    assert _run(code) == "True True True True"


# Imports as users write them, each run in a fresh interpreter, and the name that packs.
PACK_IMPORTS = {
    "import stoker.pack.packer as packer": "packer.pack",
    "from stoker.pack import packer": "packer.pack",
    "import stoker.pack.packer": "stoker.pack.packer.pack",
    "import stoker": "stoker.pack",
    "from stoker import pack": "pack",
    "import stoker.pack as pack": "pack",
    "import stoker.pack.packer as packer; import stoker": "stoker.pack",
    "import stoker.pack.packer as packer; from stoker import pack": "pack",
}


@pytest.mark.parametrize("imports", sorted(PACK_IMPORTS))
def test_both_import_forms_of_the_packer_work_and_stoker_pack_packs(
    imports: str, tmp_path: Path
) -> None:
    # issue 33 item 5: `import stoker.pack.packer as p` raised ImportError, since
    # `stoker.pack` was the function pack() (fails before)
    folder = tmp_path / "images" / "cat"
    folder.mkdir(parents=True)
    (folder / "a.png").write_bytes(_png())
    call = PACK_IMPORTS[imports]
    code = (
        f"{imports}\n"
        f"report = {call}({str(tmp_path / 'images')!r}, {str(tmp_path / 'packed')!r})\n"
        "print(type(report).__name__, report.samples)"
    )
    assert _run(code) == "PackReport 1"


def _png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()
