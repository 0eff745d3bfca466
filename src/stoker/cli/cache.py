"""``stoker cache``: look at, check and empty a node-local disk cache."""

from __future__ import annotations

import json

import click

from stoker.cli.common import handle_errors
from stoker.core.units import format_bytes
from stoker.storage import DiskCache

_DIRECTORY = click.argument("directory", type=click.Path(file_okay=False, exists=True))


def _open(directory: str) -> DiskCache:
    # The limit only matters when writing; these commands never write entries.
    return DiskCache(directory, max_bytes=1 << 62)


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
    disk under the cache is sound.
    """
    cache = _open(directory)
    checked, damaged = cache.verify()
    cache.close()
    click.echo(f"{checked:,} entries checked, {damaged:,} damaged and removed.")


@cache_group.command("clear")
@_DIRECTORY
@handle_errors
def cache_clear(directory: str) -> None:
    """Delete every entry (safe while loaders use the cache: they read from the store)."""
    cache = _open(directory)
    entries = cache.entries()
    cache.clear()
    cache.close()
    click.echo(f"Removed {entries:,} entries from {directory}.")
