"""``stoker download`` and ``upload``: parallel transfers between a bucket and a folder."""

from __future__ import annotations

import contextlib
import json
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import click

from stoker.cli.common import Context, fail, handle_errors, open_url, printable, with_options
from stoker.cli.progress import BarProgress
from stoker.core.units import format_bytes
from stoker.errors import TransferError
from stoker.storage.base import Store
from stoker.storage.transfer import (
    BASE_OPEN_FILES,
    DEFAULT_MAX_THROTTLED_S,
    DEFAULT_WORKERS,
    FILES_PER_WORKER,
    TransferConfig,
    TransferReport,
    bound_workers,
    download,
    upload,
)

#: The options download and upload share.
transfer_options = with_options(
    [
        click.option(
            "-w",
            "--workers",
            type=click.IntRange(1, 4096),
            default=DEFAULT_WORKERS,
            show_default=True,
            help="Files in flight at once (enough to hide a 20 ms round trip on small files).",
        ),
        click.option(
            "--include",
            multiple=True,
            metavar="GLOB",
            help="Only keys (relative paths) matching GLOB; repeatable.",
        ),
        click.option(
            "--exclude", multiple=True, metavar="GLOB", help="Leave out matching keys; repeatable."
        ),
        click.option(
            "--no-resume",
            is_flag=True,
            help="Transfer every file, even those already complete at the destination.",
        ),
        click.option(
            "--no-verify",
            is_flag=True,
            help="Skip the MD5-against-ETag check of each transferred file.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
        click.option("--no-progress", is_flag=True, help="Do not show the progress bar."),
    ]
)


def _summary(report: TransferReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    verb = "Downloaded" if report.direction == "download" else "Uploaded"
    click.echo(
        f"{verb} {report.files_transferred} files ({format_bytes(report.bytes_transferred)}) "
        f"in {report.seconds:.1f} s: {report.files_per_s:,.0f} files/s, "
        f"{format_bytes(report.bytes_per_s)}/s; {report.files_skipped} already complete, "
        f"{len(report.failures)} failed; retries: {report.requests.get('retries', 0)}."
    )
    if report.not_regular:
        click.echo(f"Skipped {len(report.not_regular)} entries that are not regular files:")
        for key, what in report.not_regular:
            click.echo(f"  {key}: {what}")


def _run_transfer(run: Callable[[], TransferReport], bar: BarProgress, as_json: bool) -> None:
    failure: TransferError | None = None
    with bar:
        try:
            report = run()
        except TransferError as exc:
            failure = exc
    # Print only once the bar has stopped, so the two never share a line.
    if failure is not None:
        for key, reason in failure.failures:
            click.echo(f"stoker: failed: {printable(key)}: {_first_line(reason)}", err=True)
        # The error's own headline: how many failed, or why the whole run stopped (a full
        # disk says how many files are complete and what to do).
        headline = _first_line(str(failure)).rstrip(":")
        fail(headline if "rerun" in headline else f"{headline}; rerun the same command to retry")
        return
    _summary(report, as_json)


def _first_line(reason: str) -> str:
    # obstore's messages run over several lines (a debug dump follows the first).
    return printable(reason.strip().split("\n", 1)[0])


@dataclass(frozen=True, slots=True)
class _TransferRun:
    store: Store
    config: TransferConfig
    bar: BarProgress
    as_json: bool


def _prepare(ctx: Context, url: str, direction: str, options: dict[str, Any]) -> _TransferRun:
    workers, max_in_flight = _fit_open_files(options["workers"])
    store = open_url(ctx, url, max_in_flight=max_in_flight)
    config = TransferConfig(
        workers=workers,
        include=options["include"],
        exclude=options["exclude"],
        resume=not options["no_resume"],
        verify=not options["no_verify"],
    )
    show = not options["no_progress"] and not options["as_json"] and sys.stderr.isatty()
    return _TransferRun(store, config, BarProgress(direction, enabled=show), options["as_json"])


def _fit_open_files(asked: int) -> tuple[int, int]:
    # Each worker holds a file and connections: raise the soft open-file limit as far as the
    # hard one allows, then use fewer workers if it is still too low (saying so).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = BASE_OPEN_FILES + FILES_PER_WORKER * asked + 128
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = wanted if soft == resource.RLIM_INFINITY else soft
    workers, max_in_flight = bound_workers(asked, limit)
    if workers < asked:
        click.echo(
            f"stoker: warning: --workers {asked} needs more open files than the limit of "
            f"{limit} (ulimit -n) allows; using {workers} workers",
            err=True,
        )
    return workers, max_in_flight


@click.command("download")
@click.argument("src_url")
@click.argument("dst_dir", type=click.Path(file_okay=False))
@transfer_options
@click.option(
    "--max-throttled-s",
    type=click.FloatRange(0, 86_400, min_open=True),
    default=DEFAULT_MAX_THROTTLED_S,
    show_default=True,
    metavar="SECONDS",
    help="Give up once the store has throttled every request (503 SlowDown) this long.",
)
@click.pass_obj
@handle_errors
def download_command(
    ctx: Context, /, src_url: str, dst_dir: str, max_throttled_s: float, **options: Any
) -> None:
    """Download every object under SRC_URL into DST_DIR, in parallel.

    Keys become paths relative to DST_DIR. A rerun skips files already complete (same size
    and modification time, or MD5 equal to the ETag); partial files are written as
    .NAME.stoker-partial and renamed only when complete (an object named so fails). Exits 1
    if any object failed, naming each, or if the store throttled every request for
    --max-throttled-s.
    """
    run = _prepare(ctx, src_url, "download", options)
    config = replace(run.config, max_throttled_s=max_throttled_s)
    _run_transfer(
        lambda: download(run.store, dst_dir, config=config, progress=run.bar),
        run.bar,
        run.as_json,
    )


@click.command("upload")
@click.argument("src_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("dst_url")
@transfer_options
@click.pass_obj
@handle_errors
def upload_command(ctx: Context, /, src_dir: str, dst_url: str, **options: Any) -> None:
    """Upload every file under SRC_DIR to DST_URL, in parallel.

    Relative paths become keys under DST_URL; large files go up as multipart uploads. A
    rerun skips objects already there with the same size and ETag. Exits 1 if any file
    failed, naming each.
    """
    run = _prepare(ctx, dst_url, "upload", options)
    _run_transfer(
        lambda: upload(src_dir, run.store, config=run.config, progress=run.bar),
        run.bar,
        run.as_json,
    )
