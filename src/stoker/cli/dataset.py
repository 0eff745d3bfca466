"""``stoker pack``, ``verify`` and ``index``: making and checking datasets.

``stoker inspect`` is :mod:`stoker.cli.inspect` (its names are importable from here too).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from stoker.cli.common import handle_errors, printable
from stoker.cli.common import storage_options as _storage
from stoker.cli.inspect import LABEL_MIX_BATCH, inspect_command
from stoker.cli.params import ByteSize
from stoker.cli.progress import pack_bar
from stoker.cli.tokens import check_pack_options, pack_tokens_command, with_token_pack_options
from stoker.core.units import format_bytes
from stoker.format.reader import open_dataset
from stoker.format.spec import DEFAULT_MAX_PIXELS, MAX_PREFIXES
from stoker.pack.indexer import index_webdataset
from stoker.pack.limits import check_workers
from stoker.pack.packer import DEFAULT_SHARD_BYTES, PackConfig, PackReport, pack
from stoker.pack.reencode import ImagePolicy
from stoker.pack.sources import FORMATS
from stoker.pack.video_reencode import VideoPolicy

__all__ = [
    "LABEL_MIX_BATCH",
    "index_command",
    "inspect_command",
    "pack_command",
    "verify_command",
]


@click.command("pack")
@click.argument("src")
@click.argument("dst_url")
@click.option(
    "--format",
    "source_format",
    type=click.Choice(FORMATS),
    default="auto",
    show_default=True,
    help="Input format; auto guesses from names and says so.",
)
@click.option(
    "--shard-size",
    type=ByteSize(minimum=1),
    default=f"{DEFAULT_SHARD_BYTES // 10**6}MB",
    show_default=True,
    help="Target shard size (input bytes), e.g. 64MB, 256MiB.",
)
@click.option("--samples-per-shard", type=click.IntRange(1), help="Cut shards by count.")
@click.option(
    "--resize",
    "resize_shorter",
    type=click.IntRange(1),
    metavar="SHORTER_SIDE",
    help="Scale images (and videos, re-encoded as H.264) so the shorter side is this many "
    "pixels (never enlarges).",
)
@click.option("--max-side", type=click.IntRange(1), help="Scale so the longer side fits.")
@click.option(
    "--fps",
    type=click.FloatRange(0, 1000, min_open=True),
    help="Re-encode videos at this frame rate, as H.264 (default: videos kept as they are).",
)
@click.option(
    "--quality",
    type=click.IntRange(1, 100),
    help="Re-encode images as JPEG at this quality (default: keep original bytes).",
)
@click.option(
    "--max-pixels",
    type=click.IntRange(1),
    default=DEFAULT_MAX_PIXELS,
    show_default=True,
    help="Refuse images declaring more pixels than this (decompression bombs).",
)
@click.option(
    "--shuffle-seed",
    type=int,
    default=0,
    show_default=True,
    help="Pack in the random order of this seed, so that batches mix classes.",
)
@click.option(
    "--keep-order",
    is_flag=True,
    help="Pack in the input's order instead (for windows of consecutive records).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 1024),
    default=32,
    show_default=True,
    help="Samples read at once; at most the open-file limit (ulimit -n) less 64.",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Local threads, or Ray tasks writing whole shards.",
)
@click.option(
    "--on-error",
    type=click.Choice(["raise", "skip"]),
    default="raise",
    show_default=True,
    help="Stop at the first bad input, or skip it and record why in the manifest.",
)
@click.option(
    "--prefixes",
    type=click.IntRange(1, MAX_PREFIXES),
    default=1,
    show_default=True,
    help="Spread shards over this many key prefixes (00/, 40/, ...): each S3 prefix "
    "serves a limited number of requests per second.",
)
@click.option(
    "--class-name",
    "class_names",
    multiple=True,
    metavar="NAME",
    help="Name of label 0, then 1, ... (repeat, in label order) for the index, and for "
    "class names in a list's label column. An image folder's names are its folders.",
)
@click.option(
    "--allow-outside-list",
    is_flag=True,
    help="Let a CSV/JSONL list name files outside its own folder (absolute paths, ../, "
    "other buckets); refused by default.",
)
@with_token_pack_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-progress", is_flag=True, help="Do not show the progress bar.")
@click.pass_context
@handle_errors
def pack_command(
    ctx: click.Context,
    src: str,
    dst_url: str,
    source_format: str,
    shard_size: int,
    samples_per_shard: int | None,
    resize_shorter: int | None,
    max_side: int | None,
    fps: float | None,
    quality: int | None,
    max_pixels: int,
    shuffle_seed: int,
    keep_order: bool,
    workers: int,
    engine: str,
    on_error: str,
    prefixes: int,
    class_names: tuple[str, ...],
    allow_outside_list: bool,
    tokens: bool,
    offsets: str | None,
    bin_dtype: str | None,
    text_field: str,
    tokenizer: str | None,
    vocab_size: int | None,
    eos_id: int | None,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Pack SRC (image or video folder, CSV/JSONL list, WebDataset tars, TFRecord, HDF5,
    Parquet; local or in a bucket) into indexed tar shards at DST_URL.

    Shards are written whole and the index last, so an interrupted pack never leaves an index
    that points at a partial shard; rerunning the same command resumes where it stopped (with
    other input or arguments it is refused, naming what differs). Every image is checked as
    training will decode it; every video (.mp4, .mkv, .webm, .mov) is stored as it is,
    unless --resize, --max-side or --fps re-encode it, with a seek index that lets a clip
    be read alone (SourceConfig(url, video=VideoConfig(...))). DST_URL may not lie inside an
    input folder, and must be empty unless it holds that pack: anything else there is
    named and nothing is written.

    With --tokens, SRC holds tokenized documents or text and DST_URL gets token shards
    (uint16 when the ids fit, else uint32), documents in a shuffled order (--keep-order
    keeps the input's), each checked: an id out of range, an empty document or an array
    that is not 1-D integers is named, or skipped and listed with --on-error skip.
    """
    check_pack_options(ctx, tokens)
    if tokens:
        pack_tokens_command(ctx, src, dst_url, on_error, as_json, no_progress)
        return
    try:
        check_workers(workers)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--workers") from None
    show = not no_progress and not as_json and sys.stderr.isatty()
    bar, progress = pack_bar("samples", enabled=show)
    with bar:
        report = pack(
            src,
            dst_url,
            config=_pack_config(ctx.params),
            source_format=source_format,
            storage_options=_storage(ctx),
            progress=progress,
            class_names=list(class_names) or None,
            allow_outside_list=allow_outside_list,
        )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _say_packed(report)


def _pack_config(params: dict[str, Any]) -> PackConfig:
    """The PackConfig of ``stoker pack``'s options."""
    return PackConfig(
        max_shard_bytes=params["shard_size"],
        samples_per_shard=params["samples_per_shard"],
        images=ImagePolicy(
            resize_shorter=params["resize_shorter"],
            max_side=params["max_side"],
            quality=params["quality"],
            max_pixels=params["max_pixels"],
        ),
        videos=VideoPolicy(
            resize_shorter=params["resize_shorter"],
            max_side=params["max_side"],
            fps=params["fps"],
        ),
        shuffle_seed=None if params["keep_order"] else params["shuffle_seed"],
        workers=params["workers"],
        engine=params["engine"],
        on_error=params["on_error"],
        prefixes=params["prefixes"],
    )


def _say_packed(report: PackReport) -> None:
    """A pack's report for a reader: what was read and written, retries, what was skipped."""
    click.echo(f"Read {report.source} as {report.source_format}.")
    reused = (
        f"; {report.shards_reused} shards reused from an earlier run"
        if report.shards_reused
        else ""
    )
    click.echo(
        f"Packed {report.samples:,} samples into {report.shards} shards at {report.destination} "
        f"in {report.seconds:.1f} s ({report.samples / max(report.seconds, 1e-9):,.0f} samples/s); "
        f"read {format_bytes(report.bytes_in)}, wrote {format_bytes(report.bytes_out)}{reused}."
    )
    retries = sum(side.get("retries", 0) for side in report.requests.values())
    if retries:
        click.echo(f"Retried {retries} requests that failed (all recovered).")
    if report.skipped:
        click.echo(f"Skipped {len(report.skipped)} inputs (listed in index.json):", err=True)
        for item in report.skipped[:20]:
            click.echo(f"  {printable(item['source'])}: {printable(item['reason'])}", err=True)


@click.command("verify")
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@handle_errors
def verify_command(ctx: click.Context, url: str, as_json: bool) -> None:
    """Read every shard and check its SHA-256 and every sample's CRC-32.

    Exits 1 if anything is wrong, naming each shard and sample.
    """
    dataset = open_dataset(url, storage_options=_storage(ctx))
    report = dataset.verify()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    elif report.ok:
        click.echo(
            f"OK: {report.shards} shards, {report.samples:,} samples, "
            f"{format_bytes(report.bytes)} verified."
        )
    else:
        for shard, key, problem in report.corrupt:
            click.echo(
                f"stoker: corrupt: {shard}{' sample ' + repr(key) if key else ''}: {problem}",
                err=True,
            )
    if not report.ok:
        sys.exit(1)


@click.command("index")
@click.argument("url")
@click.option(
    "--class-name",
    "class_names",
    multiple=True,
    metavar="NAME",
    help="Class names in label order (repeat); labels come from .cls members. Without "
    'names, labels are named "0", "1", ...',
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
@handle_errors
def index_command(
    ctx: click.Context, url: str, class_names: tuple[str, ...], as_json: bool
) -> None:
    """Build a stoker index for existing WebDataset tars under URL, without rewriting them.

    Reads each .tar once, in order; afterwards the dataset opens with two GETs and every
    sample is one ranged GET. Tars that break WebDataset's rules (or hold unsafe member
    names, links or devices) are refused, naming the tar and member.
    """
    report = index_webdataset(url, storage_options=_storage(ctx), class_names=list(class_names))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    click.echo(
        f"Indexed {report.samples:,} samples in {report.shards} shards "
        f"({format_bytes(report.bytes)}) at {report.url} in {report.seconds:.1f} s."
    )
