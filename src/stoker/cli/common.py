"""What every command shares: the global-options context, error handling, option lists."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from stoker.errors import StokerError
from stoker.storage import StorageOptions

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Context:
    """What the global options say, handed to every command."""

    storage_options: StorageOptions
    verbose: int


def storage_options(ctx: click.Context) -> Any:
    """The `StorageOptions` the global options gave, for a command handed click's context."""
    return ctx.obj.storage_options


def fail(message: str) -> None:
    """Print ``stoker: error: MESSAGE`` on stderr and exit with status 1."""
    click.echo(f"stoker: error: {message}", err=True)
    sys.exit(1)


def handle_errors(func: F) -> F:
    """Turn stoker's (and the OS's) errors into one clear line and exit status 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:
            # The reader went away (`stoker ls ... | head`): stop quietly.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        except (StokerError, OSError, ValueError) as exc:
            fail(str(exc) or type(exc).__name__)
        return None

    return wrapper  # type: ignore[return-value]  # functools.wraps keeps the signature


def with_options(options: Sequence[Callable[[F], F]]) -> Callable[[F], F]:
    """A decorator applying a list of click options in the order listed."""

    def apply(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return apply
