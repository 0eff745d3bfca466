"""Checks of argument values, one per kind of value, each error naming the argument.

Config objects call these from ``__post_init__`` and functions at their entry, so that a
wrong value fails where it is given, with its name, what it takes and what it got::

    check_int("batch_size", batch_size, minimum=1)      # TypeError for 2.5, True, "8"
    check_choice("mode", mode, ("blocks", "random", "none"))
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence

import numpy as np


def check_int(name: str, value: object, *, minimum: int | None = None, kind: str = "an int") -> int:
    """``value`` as an ``int``, if it is an integer (numpy's too) of at least ``minimum``;
    ``kind`` says what it is in the error (``"an int number of bytes"``).

    Raises:
        TypeError: A float, string, bool or anything else that is not an integer.
        ValueError: Less than ``minimum``.
    """
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise TypeError(f"{name} must be {kind}, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {shown(value)}")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """``value``, if it is ``True`` or ``False`` (numpy's too): ``"no"`` is not false.

    Raises:
        TypeError: Anything else.
    """
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {shown(value)}")
    return bool(value)


def check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    """Refuse a ``value`` that is not one of ``choices``.

    Raises:
        ValueError: Not one of them.
    """
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise ValueError(f"{name} must be {listed}, got {shown(value)}")


def check_instance(name: str, value: object, kind: type, example: str) -> None:
    """Refuse a ``value`` that is neither None nor a ``kind``; ``example`` shows the call
    that was probably meant (``"OrderConfig(mode='random')"``).

    Raises:
        TypeError: Anything else.
    """
    if value is not None and not isinstance(value, kind):
        raise TypeError(
            f"{name} must be {kind.__name__}(...) or None, got {shown(value)}: "
            f"e.g. {name}={example}"
        )


def shown(value: object) -> str:
    """``repr(value)`` cut short (a long string, a list, a huge int), for error messages."""
    try:
        return reprlib.repr(value)
    except ValueError:  # an int of more digits than str() converts
        return f"an int of {value.bit_length()} bits" if isinstance(value, int) else "?"
