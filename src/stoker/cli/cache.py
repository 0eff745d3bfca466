"""``stoker cache``: look at, check and empty a node-local disk cache."""

from __future__ import annotations

import json

import click

from stoker.cli.common import fail, handle_errors, printable
from stoker.core.units import format_bytes
from stoker.storage import DiskCache
from stoker.storage.cache_files import describe_path

_DIRECTORY = click.argument("directory", type=click.Path(file_okay=False, exists=True))
#: Paths left alone that are named one by one; the rest are counted.
_NAMED = 20


def _open(directory: str) -> DiskCache:
    # The limit only matters when writing; these commands never write entries. Nor do they
    # make a cache's folders: a folder that is not a cache is refused, untouched.
    try:
        return DiskCache(directory, max_bytes=1 << 62, create=False)
    except FileNotFoundError as exc:
        fail(f"{exc}; nothing was read or removed")
        raise  # fail() exits


def _say_left_alone(paths: list[str]) -> None:
    if not paths:
        return
    click.echo(
        f"Left alone {len(paths):,} path(s) the cache did not write (never read, written "
        "through or deleted):"
    )
    for path in paths[:_NAMED]:
        click.echo(f"  {printable(describe_path(path))}")
    if len(paths) > _NAMED:
        click.echo(f"  and {len(paths) - _NAMED:,} more")


@click.group("cache")
def cache_group() -> None:
    """Look at, check and empty a disk cache: the dir of a Loader's CacheConfig."""


@cache_group.command("info")
@_DIRECTORY
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def cache_info(directory: str, as_json: bool) -> None:
    """Show how many entries and bytes the cache in DIRECTORY holds."""
    cache = _open(directory)
    entries = cache.entries()
    size = cache.bytes
    cache.close()
    if as_json:
        click.echo(json.dumps({"directory": directory, "entries": entries, "bytes": size}))
        return
    click.echo(f"{directory}: {entries:,} entries, {format_bytes(size)}.")


@cache_group.command("verify")
@_DIRECTORY
@handle_errors
def cache_verify(directory: str) -> None:
    """Check every entry's length and CRC-32; remove the damaged ones.

    Never needed for correctness (every read checks its entry), but shows whether the
    disk under the cache is sound. Only files the cache wrote are read or removed: links
    and other files under it are named and left alone.
    """
    cache = _open(directory)
    checked, damaged = cache.verify()
    left_alone = cache.left_alone()
    cache.close()
    click.echo(f"{checked:,} entries checked, {damaged:,} damaged and removed.")
    _say_left_alone(left_alone)


@cache_group.command("clear")
@_DIRECTORY
@handle_errors
def cache_clear(directory: str) -> None:
    """Delete every entry (safe while loaders use the cache: they read from the store).

    Only files the cache wrote are deleted, never through a link; links and other files
    under it are named and left alone. A folder that is not a cache is refused.
    """
    cache = _open(directory)
    removed = cache.clear()
    left_alone = cache.left_alone()
    cache.close()
    click.echo(f"Removed {removed:,} entries from {directory}.")
    _say_left_alone(left_alone)
