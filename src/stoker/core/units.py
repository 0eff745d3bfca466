"""Human-readable sizes and rates, and sizes read from text."""

from __future__ import annotations

import decimal

from stoker.core.checks import shown

_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def format_bytes(n: float) -> str:
    """``1234567`` -> ``"1.2 MB"`` (decimal units, as storage bills use)."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1000 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


#: Multipliers of the size units :func:`parse_size` reads (decimal and binary).
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: The largest size :func:`parse_size` returns: sizes and offsets are stored as int64.
MAX_SIZE = 2**63 - 1


def parse_size(text: str) -> int:
    """``"128MB"`` -> 128000000; ``"64MiB"``, ``"1.5GB"``, plain bytes (fractions of a byte
    are dropped).

    Raises:
        ValueError: Not a number with an optional unit, negative, infinite, NaN, or more than
            :data:`MAX_SIZE` bytes; the message quotes ``text``.
    """
    value = text.strip().lower()
    number = value.rstrip("kmgtib")
    unit = value[len(number) :]
    example = "use a number of bytes, or one with a unit: 128MB, 64MiB, 1.5GB"
    try:
        amount = decimal.Decimal(number)
    except decimal.InvalidOperation:
        amount = None
    if unit not in SIZE_UNITS or amount is None:
        raise ValueError(f"{shown(text)} is not a size: {example}")
    if not amount.is_finite():
        raise ValueError(f"{shown(text)} is not a finite size: {example}")
    if amount < 0:
        raise ValueError(f"{shown(text)} is negative: {example}")
    size = (
        min(amount, decimal.Decimal(MAX_SIZE + 1)) * SIZE_UNITS[unit]
    )  # 1e999999999 would overflow
    if size > MAX_SIZE:
        raise ValueError(f"{shown(text)} is more than the largest size, {MAX_SIZE:,} bytes")
    return int(size)
