"""The ``stoker`` command line: thin click commands over the library."""

from __future__ import annotations

import json
import logging
import signal
import threading
from typing import Any

import click

from stoker.cli.bench import bench_command
from stoker.cli.cache import cache_group
from stoker.cli.common import (
    Context,
    fail,
    handle_errors,
    on_sigint,
    open_url,
    printable,
)
from stoker.cli.dataset import index_command, pack_command, verify_command
from stoker.cli.inspect import inspect_command
from stoker.cli.params import EndpointUrl, FiniteFloat
from stoker.cli.profile import doctor_command, show_command
from stoker.cli.transfer import download_command, upload_command
from stoker.core.units import format_bytes
from stoker.errors import BucketNotFoundError
from stoker.format.remove import plan_removal, remove_dataset
from stoker.storage import StorageOptions
from stoker.storage.base import key_problem
from stoker.storage.shaping import ShapingPolicy
from stoker.storage.transfer import DEFAULT_WORKERS


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--endpoint-url",
    type=EndpointUrl(),
    metavar="URL",
    help="S3 endpoint of a non-AWS store (MinIO, SeaweedFS, IBM COS, R2). "
    "Default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, the profile's endpoint_url, or AWS.",
)
@click.option(
    "--region", metavar="NAME", help="Signing region. Default: $AWS_REGION or the profile's."
)
@click.option(
    "--profile",
    metavar="NAME",
    help="Profile in ~/.aws/credentials and ~/.aws/config. Default: $AWS_PROFILE or 'default'.",
)
@click.option("--no-verify-ssl", is_flag=True, help="Do not verify TLS certificates.")
@click.option("--anonymous", is_flag=True, help="Send unsigned requests (public buckets).")
@click.option(
    "--addressing-style",
    type=click.Choice(["auto", "path", "virtual"]),
    default="auto",
    show_default=True,
    help="Path-style (endpoint/bucket/key) or virtual-hosted (bucket.endpoint/key) URLs.",
)
@click.option(
    "--max-requests-per-s",
    type=FiniteFloat(min=0, min_open=True),
    metavar="N",
    help="Send at most N requests per second to one prefix of a bucket. Default: no fixed cap.",
)
@click.option(
    "--no-adaptive-rate",
    is_flag=True,
    help="Do not slow down when the store throttles (503 SlowDown, 429); only retry.",
)
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
@click.version_option(package_name="stoker")
@click.pass_context
def cli(
    ctx: click.Context,
    endpoint_url: str | None,
    region: str | None,
    profile: str | None,
    no_verify_ssl: bool,
    anonymous: bool,
    addressing_style: str,
    max_requests_per_s: float | None,
    no_adaptive_rate: bool,
    verbose: int,
) -> None:
    """stoker: keep accelerators fed with training data that lives in object storage.

    URLs are s3://BUCKET/PREFIX, gs://, az://, file:// or local paths. Credentials come from
    the standard AWS variables and config files (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...); they
    are never printed. Requests to one prefix of a bucket slow down by themselves when the
    store throttles them.
    """
    if verbose:
        logging.basicConfig(
            level=logging.DEBUG if verbose > 1 else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    try:
        options = StorageOptions(
            endpoint_url=endpoint_url,
            region=region,
            profile=profile,
            verify_ssl=not no_verify_ssl,
            anonymous=anonymous,
            addressing_style=addressing_style,  # type: ignore[arg-type]  # click.Choice checked it
            max_requests_per_s=max_requests_per_s,
            shaping=ShapingPolicy(adaptive=not no_adaptive_rate),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    ctx.obj = Context(storage_options=options, verbose=verbose)


@cli.command("ls")
@click.argument("url")
@click.option("-r", "--recursive", is_flag=True, help="List every object under URL.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_obj
@handle_errors
def ls_command(ctx: Context, url: str, recursive: bool, as_json: bool) -> None:
    """List objects and prefixes under URL.

    Without --recursive, shows one level: sub-prefixes (PRE) and the objects directly
    under URL. With --recursive, shows every object and a total. With --json, one JSON
    object a line, the last one the totals: {"total": {"objects": N, "bytes": N}}
    ("prefixes" too without --recursive). Exits 1 if nothing is under URL (a missing
    prefix, folder or bucket).
    """
    store = open_url(ctx, url)
    count = total = prefixes = 0
    unusable: list[tuple[str, str]] = []
    if recursive:
        for meta in store.list(""):
            count += 1
            total += meta.size
            _print_object(meta, as_json, unusable)
    else:
        listing = store.list_dir("")
        prefixes = len(listing.prefixes)
        for prefix in listing.prefixes:
            if as_json:
                click.echo(json.dumps({"prefix": prefix + "/"}))
            else:
                click.echo(f"{'':19} {'PRE':>12} {printable(prefix)}/")
        for meta in listing.objects:
            count += 1
            total += meta.size
            _print_object(meta, as_json, unusable)
    if count == 0 and prefixes == 0:
        fail(f"nothing under {url}: no such prefix, folder or bucket")
    if as_json:
        totals = {"objects": count, "bytes": total}
        click.echo(json.dumps({"total": totals if recursive else {**totals, "prefixes": prefixes}}))
    elif recursive:
        click.echo(f"{count} objects, {format_bytes(total)}", err=True)
    for key, problem in unusable:
        click.echo(f"stoker: failed: {printable(key)}: unusable key ({problem})", err=True)
    if unusable:
        fail(f"{len(unusable)} keys cannot be read or downloaded; the others were listed")


def _print_object(meta: Any, as_json: bool, unusable: list[tuple[str, str]]) -> None:
    # A key that stoker cannot use is listed too (escaped), and named as a failure after.
    problem = key_problem(meta.key)
    if problem is not None:
        unusable.append((meta.key, problem))
    if as_json:
        click.echo(json.dumps(_meta_dict(meta)))
    else:
        click.echo(f"{_when(meta.last_modified)} {meta.size:>12} {printable(meta.key)}")


def _when(moment: Any) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment is not None else " " * 19


def _meta_dict(meta: Any) -> dict[str, Any]:
    return {
        "key": meta.key,
        "size": meta.size,
        "etag": meta.etag,
        "last_modified": meta.last_modified.isoformat() if meta.last_modified else None,
    }


@cli.command("rm")
@click.argument("url")
@click.option("-y", "--yes", is_flag=True, help="Remove without asking.")
@click.option(
    "--shards",
    "with_shards",
    is_flag=True,
    help="Remove the shards too when stoker did not write them (tars indexed in place by "
    "stoker index); without it only their index goes.",
)
@click.pass_obj
@handle_errors
def rm_command(ctx: Context, url: str, yes: bool, with_shards: bool) -> None:
    """Remove the packed dataset at URL: its index first, then its shards.

    Deletes only what the dataset's index names (index.json, index.bin, the shards and
    pack's state for them); anything else under URL is left alone. Shards that stoker pack
    did not write (tars given an index in place by stoker index) stay unless --shards.
    Asks first unless --yes. A URL without an index is refused and nothing is removed.
    """
    store = open_url(ctx, url)
    try:
        plan = plan_removal(store, with_shards=with_shards)
    except FileNotFoundError as exc:
        if isinstance(exc, BucketNotFoundError):
            raise
        fail(f"{url} has no index (index.json): not a packed dataset; nothing was removed")
        return
    if plan.kept_shards:
        what = f"the index of the dataset at {url} (index.json, index.bin)"
    else:
        what = (
            f"the dataset at {url}: its index and {len(plan.shards)} shards "
            f"({format_bytes(plan.shard_bytes)})"
        )
    try:
        confirmed = yes or click.confirm(f"Remove {what}?", default=False, err=True)
    except click.Abort:  # no answer: stdin closed
        confirmed = False
    if not confirmed:
        fail("nothing was removed")
    plan = remove_dataset(store, plan)
    if plan.missing_shards:  # a delete succeeds either way: say what was not there
        named = ", ".join(printable(name) for name in plan.missing_shards[:5])
        more = f" and {len(plan.missing_shards) - 5} more" if len(plan.missing_shards) > 5 else ""
        what = (
            f"the dataset at {url}: its index and {plan.removed_shards} of the "
            f"{len(plan.shards)} shards it lists; {len(plan.missing_shards)} "
            f"{'was' if len(plan.missing_shards) == 1 else 'were'} not there ({named}{more})"
        )
    click.echo(f"Removed {what}.")
    if plan.kept_shards:
        named = ", ".join(printable(name) for name in plan.kept_shards[:5])
        more = f" and {len(plan.kept_shards) - 5} more" if len(plan.kept_shards) > 5 else ""
        click.echo(
            f"Left its {len(plan.kept_shards)} shards ({format_bytes(plan.kept_bytes)}: "
            f"{named}{more}): stoker index indexed them in place, it did not write them; "
            "stoker rm --shards removes them too."
        )


@cli.command("demo")
@click.option(
    "--files",
    type=click.IntRange(10, 100_000),
    default=2000,
    show_default=True,
    help="How many JPEGs to generate.",
)
@click.option(
    "--rtt-ms",
    type=FiniteFloat(0, 1000),
    default=20.0,
    show_default=True,
    help="Round trip the emulated cloud link adds to every request.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 4096),
    default=DEFAULT_WORKERS,
    show_default=True,
    help="Parallel transfers.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="stoker-demo",
    show_default=True,
    help="Directory for compare.png, doctor.png, trace.json and grid.png.",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    envvar="STOKER_DEMO_PORT",
    show_envvar=True,
    help="Port of 127.0.0.1 for the emulated cloud link, the endpoint every request goes to "
    "(default: a free one).",
)
@click.option(
    "--server-port",
    type=click.IntRange(1, 65535),
    envvar="STOKER_DEMO_SERVER_PORT",
    show_envvar=True,
    help="Port of 127.0.0.1 for SeaweedFS's S3 gateway behind the link (default: a free "
    "one; its internal ports are free ones).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@handle_errors
def demo_command(
    files: int,
    rtt_ms: float,
    workers: int,
    out_dir: str,
    port: int | None,
    server_port: int | None,
    as_json: bool,
) -> None:
    """Run the main job end to end on generated data; no credentials, no network.

    Makes a folder of JPEGs in class folders (crops of real photographs when scikit-image
    is installed: pip install 'stoker[bench]'), starts a SeaweedFS S3 server on loopback
    behind a proxy that adds a cloud-like round trip, and uploads the folder. Then times
    the four ways to train on it to the first batch and one epoch (download one by one,
    download in parallel, stream the small files, pack then stream), checks the packed
    copy byte for byte, runs the doctor on it and draws nine samples of one training
    batch (grid.png). Needs SeaweedFS: pip install 'stoker[demo]'.
    """
    from stoker.demo import run_demo

    result = run_demo(
        files=files,
        rtt_s=rtt_ms / 1000,
        workers=workers,
        out_dir=out_dir,
        log=None if as_json else click.echo,
        port=port,
        server_port=server_port,
    )
    if as_json:
        click.echo(json.dumps(result, indent=2))


for _command in (
    download_command,
    upload_command,
    pack_command,
    inspect_command,
    verify_command,
    index_command,
    show_command,
    bench_command,
    doctor_command,
    cache_group,
):
    cli.add_command(_command)


def main() -> None:
    """Entry point of the ``stoker`` script."""
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C cancels the requests in flight first; handle_errors then exits 130.
        signal.signal(signal.SIGINT, on_sigint)
    cli(prog_name="stoker")
