"""``stoker pack``, ``inspect``, ``verify`` and ``index``: making and checking datasets."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
from rich.table import Table

from stoker.cli.common import handle_errors, with_options
from stoker.core.units import format_bytes
from stoker.format.reader import open_dataset
from stoker.format.spec import DEFAULT_MAX_PIXELS
from stoker.pack.indexer import index_webdataset
from stoker.pack.packer import DEFAULT_SHARD_BYTES, PackConfig, pack
from stoker.pack.reencode import ImagePolicy
from stoker.pack.sources import FORMATS

if TYPE_CHECKING:
    from stoker.pipeline.loader import Loader
    from stoker.profile.compare import CompareConfig


def parse_size(text: str) -> int:
    """``"128MB"`` -> 128000000; ``"64MiB"``, ``"1.5GB"``, plain bytes."""
    units = {
        "": 1,
        "b": 1,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
    }
    value = text.strip().lower()
    number = value.rstrip("kmgib")
    unit = value[len(number) :]
    if unit not in units:
        raise click.BadParameter(f"{text!r}: use a size such as 128MB or 64MiB")
    try:
        return int(float(number) * units[unit])
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: use a size such as 128MB or 64MiB") from exc


def _storage(ctx: click.Context) -> Any:
    return ctx.obj.storage_options


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
    help="Scale images so the shorter side is this many pixels (never enlarges).",
)
@click.option("--max-side", type=click.IntRange(1), help="Scale so the longer side fits.")
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
@click.option("--shuffle-seed", type=int, help="Pack in a seeded random order.")
@click.option(
    "--workers",
    type=click.IntRange(1, 1024),
    default=32,
    show_default=True,
    help="Samples read at once.",
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
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-progress", is_flag=True, help="Do not show the progress bar.")
@click.pass_context
@handle_errors
def pack_command(
    ctx: click.Context,
    src: str,
    dst_url: str,
    source_format: str,
    shard_size: str,
    samples_per_shard: int | None,
    resize_shorter: int | None,
    max_side: int | None,
    quality: int | None,
    max_pixels: int,
    shuffle_seed: int | None,
    workers: int,
    engine: str,
    on_error: str,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Pack SRC (image folder, CSV/JSONL list, WebDataset tars, TFRecord, HDF5; local or in a
    bucket) into indexed tar shards at DST_URL.

    Shards are written whole and the index last, so an interrupted pack never leaves an index
    that points at a partial shard; rerunning the same command resumes where it stopped.
    """
    config = PackConfig(
        max_shard_bytes=parse_size(shard_size),
        samples_per_shard=samples_per_shard,
        images=ImagePolicy(
            resize_shorter=resize_shorter,
            max_side=max_side,
            quality=quality,
            max_pixels=max_pixels,
        ),
        shuffle_seed=shuffle_seed,
        workers=workers,
        engine=engine,  # type: ignore[arg-type]
        on_error=on_error,  # type: ignore[arg-type]
    )
    show = not no_progress and not as_json and sys.stderr.isatty()
    bar = Progress(
        "pack",
        BarColumn(),
        MofNCompleteColumn(),
        "samples",
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not show,
    )
    task = bar.add_task("pack", total=None)

    def progress(total: int, samples: int, _nbytes: int) -> None:
        bar.update(task, total=total, advance=samples)

    with bar:
        report = pack(
            src,
            dst_url,
            config=config,
            source_format=source_format,
            storage_options=_storage(ctx),
            progress=progress,
        )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    click.echo(f"Read {report.source} as {report.source_format}.")
    click.echo(
        f"Packed {report.samples:,} samples into {report.shards} shards at {report.destination} "
        f"in {report.seconds:.1f} s ({report.samples / max(report.seconds, 1e-9):,.0f} samples/s); "
        f"read {format_bytes(report.bytes_in)}, wrote {format_bytes(report.bytes_out)}"
        + (
            f"; {report.shards_reused} shards reused from an earlier run"
            if report.shards_reused
            else ""
        )
        + "."
    )
    retries = sum(side.get("retries", 0) for side in report.requests.values())
    if retries:
        click.echo(f"Retried {retries} requests that failed (all recovered).")
    if report.skipped:
        click.echo(f"Skipped {len(report.skipped)} inputs (listed in index.json):", err=True)
        for item in report.skipped[:20]:
            click.echo(f"  {item['source']}: {item['reason']}", err=True)


@click.command("inspect")
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
@click.pass_context
@handle_errors
def inspect_command(ctx: click.Context, url: str, as_json: bool) -> None:
    """Summarise a packed dataset: samples, classes, fields and shards (two GETs)."""
    dataset = open_dataset(url, storage_options=_storage(ctx))
    index = dataset.index
    counts: dict[int, int] = {}
    for label in index.label.tolist():
        counts[label] = counts.get(label, 0) + 1
    names = dataset.class_names
    classes = {(names[k] if 0 <= k < len(names) else str(k)): v for k, v in sorted(counts.items())}
    total_bytes = sum(s.size for s in dataset.shards)
    summary = {
        "url": dataset.url,
        "samples": len(dataset),
        "shards": len(dataset.shards),
        "bytes": total_bytes,
        "fields": index.fields,
        "classes": classes,
        "skipped": len(index.skipped),
        "packed_with": index.packed_with,
        "shard_table": [
            {"name": s.name, "samples": s.samples, "bytes": s.size, "sha256": s.sha256}
            for s in dataset.shards
        ],
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    console = Console()
    console.print(
        f"[bold]{dataset.url}[/]: {len(dataset):,} samples in {len(dataset.shards)} "
        f"shards, {format_bytes(total_bytes)}; fields {index.fields}; "
        f"{len(index.skipped)} inputs skipped at pack time"
    )
    table = Table("class", "samples")
    for name, count in classes.items():
        table.add_row(name, f"{count:,}")
    console.print(table)
    shards = Table("shard", "samples", "bytes", "sha256")
    for entry in dataset.shards[:50]:
        shards.add_row(
            entry.name, f"{entry.samples:,}", format_bytes(entry.size), entry.sha256[:16]
        )
    console.print(shards)
    if len(dataset.shards) > 50:
        console.print(f"... and {len(dataset.shards) - 50} more shards (--json lists all)")


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
        click.echo(
            json.dumps(
                {
                    "ok": report.ok,
                    "shards": report.shards,
                    "samples": report.samples,
                    "bytes": report.bytes,
                    "corrupt": [
                        {"shard": s, "sample": k, "problem": p} for s, k, p in report.corrupt
                    ],
                },
                indent=2,
            )
        )
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
    help="Class names in label order (repeat); labels come from .cls members.",
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
        click.echo(
            json.dumps(
                {
                    "url": report.url,
                    "shards": report.shards,
                    "samples": report.samples,
                    "bytes": report.bytes,
                    "seconds": round(report.seconds, 3),
                },
                indent=2,
            )
        )
        return
    click.echo(
        f"Indexed {report.samples:,} samples in {report.shards} shards "
        f"({format_bytes(report.bytes)}) at {report.url} in {report.seconds:.1f} s."
    )


def _transform(kind: str, size: int) -> Any:
    from stoker.pipeline.transforms import CenterCrop, RandomResizedCrop

    if kind == "random-resized-crop":
        return RandomResizedCrop(size, flip=True)
    return CenterCrop(size, resize=round(size * 256 / 224))


_with_transform_options = with_options(
    [
        click.option(
            "--size",
            type=click.IntRange(8, 4096),
            default=224,
            show_default=True,
            help="Output side of the transform.",
        ),
        click.option(
            "--transform",
            "transform_kind",
            type=click.Choice(["random-resized-crop", "center-crop"]),
            default="random-resized-crop",
            show_default=True,
            help="Training-style random crops with flips, or the evaluation crop.",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="Order and crop seed."),
    ]
)

# What `bench` and `doctor` run: the Loader with these settings.
_with_loader_options = with_options(
    [
        click.option(
            "--batch-size",
            type=click.IntRange(1),
            default=256,
            show_default=True,
            help="Samples per batch.",
        ),
        click.option("--batches", type=click.IntRange(1), help="Run only this many batches."),
        click.option(
            "--threads", type=click.IntRange(1), help="Decode threads (default: autotuned)."
        ),
        _with_transform_options,
        click.option(
            "--cache-dir",
            type=click.Path(file_okay=False),
            help="Read through a disk cache in this directory (a second run reads from it).",
        ),
    ]
)


def _open_loader(
    ctx: click.Context,
    url: str,
    *,
    batch_size: int,
    seed: int,
    transform_kind: str,
    size: int,
    threads: int | None = None,
    cache_dir: str | None = None,
) -> Loader:
    from stoker.pipeline.loader import Loader

    return Loader(
        url,
        batch_size=batch_size,
        seed=seed,
        num_threads=threads,
        transform=_transform(transform_kind, size),
        storage_options=_storage(ctx),
        cache_dir=cache_dir,
    )


@click.command("show")
@click.argument("url")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default="grid.png",
    show_default=True,
    help="PNG file to write.",
)
@_with_transform_options
@click.pass_context
@handle_errors
def show_command(
    ctx: click.Context, url: str, out: str, size: int, transform_kind: str, seed: int
) -> None:
    """Write a 3x3 grid of decoded, transformed samples titled with their class names.

    The quick visual check of a pipeline: are the crops sensible, the labels right?
    """
    from stoker.profile.grid import save_sample_grid

    with _open_loader(
        ctx, url, batch_size=9, seed=seed, transform_kind=transform_kind, size=size
    ) as loader:
        path = save_sample_grid(loader, out)
    click.echo(f"Wrote {path} (9 samples of {url}).")


@click.command("bench")
@click.argument("url")
@_with_loader_options
@click.option(
    "--compare",
    is_flag=True,
    help="URL is a folder of small images (class folders of JPEGs): time downloading them "
    "one by one, downloading in parallel, streaming them, and packing then streaming.",
)
@click.option(
    "--limit",
    type=click.IntRange(1),
    default=1000,
    show_default=True,
    help="With --compare: files used (an evenly spaced sample of a larger folder).",
)
@click.option(
    "--pack-to",
    metavar="URL",
    help="With --compare: an empty location to pack into (default: URL-stoker-compare).",
)
@click.option(
    "--keep-packed", is_flag=True, help="With --compare: keep the packed copy (else deleted)."
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default="compare.png",
    show_default=True,
    help="With --compare: the bar chart to write.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@handle_errors
def bench_command(
    ctx: click.Context,
    url: str,
    batch_size: int,
    batches: int | None,
    threads: int | None,
    size: int,
    transform_kind: str,
    seed: int,
    cache_dir: str | None,
    compare: bool,
    limit: int,
    pack_to: str | None,
    keep_packed: bool,
    out: str,
    as_json: bool,
) -> None:
    """Run the loader over URL (one epoch, or --batches) and report its speed.

    Images per second, time to first batch, bytes and GET requests per sample, the share
    of time a consumer would wait, peak memory, and the shuffle's quality (how far apart
    neighbours are, shards per batch) with its cost in GETs per epoch.

    With --compare, URL is a folder of small images instead, and the four usual ways to
    train on it are timed to the first batch and to the end of one epoch, with the same
    decoding: (a) download one by one, then train; (b) download in parallel, then train;
    (c) stream the small files, one GET each; (d) pack, then stream the shards. Prints a
    table and writes a bar chart (--out).
    """
    if compare:
        if batches is not None or cache_dir is not None or transform_kind != "random-resized-crop":
            raise click.UsageError("--compare takes no --batches, --cache-dir or --transform")
        from stoker.profile.compare import CompareConfig

        config = CompareConfig(
            limit=limit, batch_size=batch_size, size=size, threads=threads, seed=seed
        )
        _compare(
            ctx, url, config, pack_to=pack_to, keep_packed=keep_packed, out=out, as_json=as_json
        )
        return
    from stoker.pipeline.quality import shuffle_quality
    from stoker.profile.bench import bench_loader

    with _open_loader(
        ctx,
        url,
        batch_size=batch_size,
        seed=seed,
        transform_kind=transform_kind,
        size=size,
        threads=threads,
        cache_dir=cache_dir,
    ) as loader:
        result = bench_loader(loader, max_batches=batches)
        quality = shuffle_quality(
            [s.samples for s in loader.dataset.shards],
            config=loader.order_config,
            batch_size=batch_size,
        )
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "shuffle": quality.to_dict()}, indent=2))
        return
    click.echo(
        f"{result.samples:,} samples in {result.seconds:.2f} s: {result.images_per_s:,.0f} "
        f"images/s; first batch after {result.first_batch_s:.2f} s; "
        f"{format_bytes(result.bytes_per_sample)} and {result.requests_per_sample:.3f} GETs "
        f"per sample; peak RSS {result.peak_rss_mb:,.0f} MB."
    )
    click.echo(
        f"Shuffle: neighbours {quality.mean_neighbour_distance:.3f} of the dataset apart "
        f"(random: ~0.333), {quality.mean_shards_per_batch:.1f} shards per batch, "
        f"{quality.requests_per_epoch:,} GETs per epoch ({quality.requests_per_sample:.3f} "
        "per sample)."
    )


def _compare(
    ctx: click.Context,
    url: str,
    config: CompareConfig,
    *,
    pack_to: str | None,
    keep_packed: bool,
    out: str,
    as_json: bool,
) -> None:
    from stoker.profile.compare import compare_methods, default_pack_to, format_comparison
    from stoker.profile.plots import render_comparison, save_png

    result = compare_methods(
        url,
        pack_to=pack_to or default_pack_to(url),
        storage_options=_storage(ctx),
        config=config,
        keep_packed=keep_packed,
        log=None if as_json else (lambda line: click.echo(line, err=True)),
    )
    path = save_png(render_comparison(result), out)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "png": str(path)}, indent=2))
        return
    click.echo(format_comparison(result))
    kept = f" The packed copy is at {result.packed}." if result.packed else ""
    click.echo(f"Wrote {path}.{kept}")


@click.command("doctor")
@click.argument("url")
@click.option(
    "--step-ms",
    type=click.FloatRange(0),
    default=100.0,
    show_default=True,
    help="Your training step per batch, simulated by sleeping (as waiting on a GPU does).",
)
@click.option(
    "--seconds",
    type=click.FloatRange(0.1),
    default=15.0,
    show_default=True,
    help="Measure for about this long (epochs repeat as needed; --batches instead).",
)
@_with_loader_options
@click.option(
    "--busy-step",
    is_flag=True,
    help="Simulate the step by keeping a core busy (a model on the CPU) instead of sleeping.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default="doctor.png",
    show_default=True,
    help="The picture: verdict, timeline, where the time went.",
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False),
    help="Also write the timeline as Chrome-trace JSON (open it in ui.perfetto.dev).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
@click.pass_context
@handle_errors
def doctor_command(
    ctx: click.Context,
    url: str,
    step_ms: float,
    batch_size: int,
    seconds: float,
    batches: int | None,
    threads: int | None,
    size: int,
    transform_kind: str,
    seed: int,
    cache_dir: str | None,
    busy_step: bool,
    out: str,
    trace_path: str | None,
    as_json: bool,
) -> None:
    """Say whether the input pipeline would hold back training on URL, and what to change.

    Runs the loader against a simulated training step of --step-ms per batch and measures
    how long the loop waits for data. If it waits more than 10% of the time the pipeline
    is the bottleneck, and the stage it waited on is named: the store (requests too slow
    or too few), decoding, your transform, or assembling batches; otherwise the model is
    (compute-bound). Prints concrete changes with values to try, writes a PNG (--out) and,
    with --trace, a Chrome trace of every stage on every thread.
    """
    from stoker.profile.advice import format_diagnosis
    from stoker.profile.doctor import diagnose
    from stoker.profile.plots import render_doctor, save_png
    from stoker.profile.trace import write_chrome_trace

    with _open_loader(
        ctx,
        url,
        batch_size=batch_size,
        seed=seed,
        transform_kind=transform_kind,
        size=size,
        threads=threads,
        cache_dir=cache_dir,
    ) as loader:
        diagnosis = diagnose(
            loader,
            step_s=step_ms / 1000,
            max_batches=batches,
            seconds=None if batches else seconds,
            step="spin" if busy_step else "sleep",
        )
    png = save_png(render_doctor(diagnosis), out)
    if trace_path:
        write_chrome_trace(diagnosis.events, trace_path, origin_s=diagnosis.origin_s)
    if as_json:
        click.echo(
            json.dumps({**diagnosis.to_dict(), "png": str(png), "trace": trace_path}, indent=2)
        )
        return
    click.echo(format_diagnosis(diagnosis))
    click.echo(
        f"\nWrote {png}"
        + (f" and {trace_path} (open in ui.perfetto.dev)" if trace_path else "")
        + "."
    )
