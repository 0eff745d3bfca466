"""stoker.pack: turn foreign inputs into indexed shards.

``stoker.pack`` is this package and the function :func:`stoker.pack.packer.pack` at once:
``stoker.pack(source, destination)`` packs, and ``import stoker.pack.packer as packer`` and
``from stoker.pack import packer`` import its modules. The packer itself is imported on the
first call (or the first look at the signature), so ``import stoker`` stays light.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any


class _PackPackage(types.ModuleType):
    """The package ``stoker.pack``, callable as pack()."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _pack()(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(_pack())

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]  # read-only: pack()'s own
        return _pack().__doc__


def _pack() -> Callable[..., Any]:
    pack: Callable[..., Any] = importlib.import_module("stoker.pack.packer").pack
    return pack


# The import system returns whatever sys.modules holds once this body has run, and binds
# it as `stoker.pack` and as the parent of `stoker.pack.packer`: a callable copy of this
# module, made here, is the package everywhere.
_package = _PackPackage(__name__)
vars(_package).update(vars(sys.modules[__name__]))
sys.modules[__name__] = _package
