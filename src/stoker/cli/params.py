"""Click parameter types of the command line: each refuses what the library would only
refuse later, or with a traceback, naming the option (``Invalid value for '--shard-size'``)."""

from __future__ import annotations

import math
from typing import Any

import click

from stoker.core.units import parse_size
from stoker.storage.options import check_endpoint_url


class ByteSize(click.ParamType[int, Any]):
    """A size such as ``128MB``, ``64MiB`` or plain bytes, of at least ``minimum`` bytes
    (see :func:`stoker.core.units.parse_size`)."""

    name = "size"

    def __init__(self, minimum: int = 0) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            size = value
        else:
            try:
                size = parse_size(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if size < self.minimum:
            self.fail(f"{value!r} is less than {self.minimum} byte(s)", param, ctx)
        return size


class FiniteFloat(click.FloatRange):
    """A :class:`click.FloatRange` that also refuses ``inf`` and ``nan`` (and ``1e400``,
    which reads as ``inf``): ``FloatRange`` lets both through."""

    name = "float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


class EndpointUrl(click.ParamType[str, Any]):
    """An S3 endpoint such as ``https://host:port`` (see
    :func:`stoker.storage.options.check_endpoint_url`)."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            check_endpoint_url(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return str(value)
