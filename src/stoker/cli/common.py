"""What every command shares: the global-options context, error handling, option lists."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import click

from stoker.errors import StokerError
from stoker.storage import StorageOptions, open_store
from stoker.storage.base import Store
from stoker.storage.engine import IOEngine, abort_all

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Context:
    """What the global options say, handed to every command."""

    storage_options: StorageOptions
    verbose: int


def storage_options(ctx: click.Context) -> Any:
    """The `StorageOptions` the global options gave, for a command handed click's context."""
    return ctx.obj.storage_options


def open_url(ctx: Context, url: str, *, max_in_flight: int | None = None) -> Store:
    """The store at ``url`` with the global options (and its own I/O engine, bounded to
    ``max_in_flight`` requests, if given)."""
    engine = IOEngine(max_in_flight=max_in_flight) if max_in_flight else None
    return open_store(url, storage_options=ctx.storage_options, engine=engine)


def fail(message: str) -> None:
    """Print ``stoker: error: MESSAGE`` on stderr and exit with status 1."""
    click.echo(f"stoker: error: {message}", err=True)
    sys.exit(1)


def printable(text: str) -> str:
    """``text`` with control and other unprintable characters escaped (``\\n``), so that a
    hostile object key cannot break a line of output or drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


#: The exit status after Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130


def interrupted() -> None:
    """Stop every request in flight, print ``stoker: interrupted`` and exit with status 130."""
    abort_all()
    click.echo("stoker: interrupted", err=True)
    sys.exit(INTERRUPTED)


def on_sigint(signum: int, frame: FrameType | None) -> None:
    """SIGINT handler: cancel the requests in flight first, so that whatever the main thread
    waits for (a request, or a thread waiting for one) ends at once; then interrupt it."""
    abort_all()
    raise KeyboardInterrupt


def handle_errors(func: F) -> F:
    """Turn stoker's (and the OS's) errors into one clear line and exit status 1, and Ctrl-C
    into ``stoker: interrupted`` and exit status 130."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted()
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
