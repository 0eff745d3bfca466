"""``stoker bench --compare``: the four ways to train on a folder of small images, timed,
optionally through a proxy that adds a remote bucket's round trip."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from stoker.cli.common import storage_options as _storage

if TYPE_CHECKING:
    from stoker.profile.compare import CompareConfig


@contextlib.contextmanager
def _delayed(
    ctx: click.Context, rtt_ms: float | None, port: int | None
) -> Iterator[tuple[Any, str, Any]]:
    """The storage options to use, through a delaying proxy listening on ``port`` (None: a
    free one) when ``rtt_ms`` is given, a note saying so, and the proxy (None without)."""
    options = _storage(ctx)
    if rtt_ms is None:
        yield options, "", None
        return
    from stoker.demo import cloud_link
    from stoker.testing.netproxy import LinkConfig

    # The endpoint as the store will resolve it (a profile's is not looked up here).
    given = options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
    endpoint = urlsplit(given or os.environ.get("AWS_ENDPOINT_URL") or "")
    if endpoint.scheme != "http" or not endpoint.hostname or not endpoint.port:
        raise click.UsageError(
            "--rtt-ms puts a delaying proxy in front of a server on this machine: give its "
            "address with --endpoint-url http://127.0.0.1:PORT"
        )
    link = LinkConfig(rtt_s=rtt_ms / 1000, bandwidth_bytes_s=125e6)
    with contextlib.ExitStack() as stack:
        try:
            proxy = stack.enter_context(
                cloud_link(endpoint.port, link, port, upstream_host=endpoint.hostname)
            )
        except ValueError as exc:  # not a loopback address
            raise click.UsageError(f"--rtt-ms: {exc}; the proxy fronts local servers only") from exc
        yield (
            replace(options, endpoint_url=proxy.endpoint),
            f"every request through a proxy on {proxy.endpoint} adding {rtt_ms:g} ms per "
            "round trip (1 Gbit/s)",
            proxy,
        )


def run_compare(
    ctx: click.Context,
    url: str,
    config: CompareConfig,
    *,
    pack_to: str | None,
    keep_packed: bool,
    out: str,
    as_json: bool,
    rtt_ms: float | None,
    port: int | None = None,
) -> None:
    """Run the comparison of ``stoker bench --compare``, print it and draw its chart
    (through a delaying proxy on ``port`` of 127.0.0.1 with ``rtt_ms``)."""
    from stoker.profile.compare import compare_methods, default_pack_to, format_comparison
    from stoker.profile.plots import render_comparison, save_png

    log = None if as_json else (lambda line: click.echo(line, err=True))
    with _delayed(ctx, rtt_ms, port) as (options, note, link):
        proxy = options.endpoint_url if note else None
        if log is not None and note:
            log(f"Comparing with {note}.")
        result = compare_methods(
            url,
            pack_to=pack_to or default_pack_to(url),
            storage_options=options,
            config=config,
            keep_packed=keep_packed,
            log=log,
        )
        # What went through the proxy: every request of every method, for a reader to see.
        through = None if link is None else link.stats().requests
    path = save_png(render_comparison(result), out)
    if as_json:
        extra = {"png": str(path), "rtt_ms": rtt_ms, "proxy": proxy, "proxy_requests": through}
        click.echo(json.dumps({**result.to_dict(), **extra}, indent=2))
        return
    click.echo(format_comparison(result))
    if note:
        click.echo(f"Measured with {note}.")
    kept = f" The packed copy is at {result.packed}." if result.packed else ""
    click.echo(f"Wrote {path}.{kept}")
