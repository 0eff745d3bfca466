"""``stoker show``, ``bench`` and ``doctor``: running the Loader over a dataset."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from stoker.cli.common import handle_errors, with_options
from stoker.cli.common import storage_options as _storage
from stoker.cli.compare import run_compare
from stoker.cli.params import FiniteFloat
from stoker.core.units import format_bytes
from stoker.profile.doctor import MAX_STEP_S

#: Batch sizes when --batch-size is not given: images, and token sequences (bench --seq-len).
IMAGE_BATCH = 256
TOKEN_BATCH = 8

if TYPE_CHECKING:
    from stoker.format.reader import ShardDataset
    from stoker.pipeline.loader import Loader


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
        click.option(
            "--seed",
            type=click.IntRange(0),
            default=0,
            show_default=True,
            help="Order and crop seed.",
        ),
    ]
)

# What `bench` and `doctor` run: the Loader with these settings (and --batch-size: bench's
# default depends on --seq-len).
_with_loader_options = with_options(
    [
        click.option("--batches", type=click.IntRange(1), help="Run only this many batches."),
        click.option(
            "--threads", type=click.IntRange(1), help="Decode threads (default: one per CPU)."
        ),
        click.option(
            "--prefetch",
            type=click.IntRange(1),
            help="Read groups fetched ahead (default: autotuned within a memory budget).",
        ),
        click.option(
            "--block-size",
            type=click.IntRange(1),
            help="Samples per ranged GET (default: about 4 MB of the dataset's samples).",
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
    url: str | ShardDataset,
    *,
    batch_size: int,
    seed: int,
    transform_kind: str | None,
    size: int,
    threads: int | None = None,
    prefetch: int | None = None,
    block_size: int | None = None,
    cache_dir: str | None = None,
) -> Loader:
    from stoker.pipeline.config import CacheConfig, DecodeConfig
    from stoker.pipeline.loader import Loader
    from stoker.pipeline.order import OrderConfig

    return Loader(
        url,
        batch_size=batch_size,
        seed=seed,
        transform=_transform(transform_kind, size) if transform_kind else None,
        order=OrderConfig(block_size=block_size) if block_size is not None else None,
        decode=DecodeConfig(threads=threads or "cpus"),
        prefetch=prefetch or "auto",
        cache=CacheConfig(dir=cache_dir),
        storage_options=_storage(ctx),
    )


def _order_model(loader: Loader) -> tuple[list[int], Any]:
    """The shard sizes and order settings the loader's epochs really follow."""
    from stoker.format.reader import ShardDataset
    from stoker.pipeline.folder import FolderSource

    source, dataset = loader.source, loader.dataset
    if isinstance(source, FolderSource):  # one object per read: blocks of one
        return [source.units()], source.order_for(loader.order_config)
    sizes = [s.samples for s in dataset.shards] if isinstance(dataset, ShardDataset) else []
    return sizes, loader.order_config


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
    """Write a 3x3 grid of decoded, transformed samples titled with their class names, each
    with its caption (a txt field) under it.

    The quick visual check of a pipeline: are the crops sensible, the labels right? A dataset
    without images is shown as text instead: the fields of its first samples (captions,
    array dtypes, shapes and first values, JSON), and no PNG is written.

    URL is a packed dataset, or a folder of class folders of images (a bucket prefix or a
    local directory) streamed as it is, one GET per image (`stoker pack` makes it faster).
    """
    from stoker.profile.grid import GRID_CELLS, open_for_show, save_sample_grid

    source, images = open_for_show(url, storage_options=_storage(ctx))
    if not isinstance(source, str) and not images:
        from stoker.profile.fields import describe_samples

        with _open_loader(
            ctx, source, batch_size=GRID_CELLS, seed=seed, transform_kind=None, size=size
        ) as loader:
            samples = describe_samples(loader, GRID_CELLS)
        fields = ", ".join(source.index.fields)
        click.echo(
            f"{url} has no images (fields {fields}): no grid written; the fields of "
            f"{len(samples)} samples as the Loader's batches carry them:"
        )
        for lines in samples:
            click.echo("\n".join(lines))
        return
    with _open_loader(
        ctx, source, batch_size=GRID_CELLS, seed=seed, transform_kind=transform_kind, size=size
    ) as loader:
        path, shown = save_sample_grid(loader, out)
    click.echo(f"Wrote {path} ({shown} samples of {url}).")


@click.command("bench")
@click.argument("url")
@click.option(
    "--batch-size",
    type=click.IntRange(1),
    help=f"Samples per batch [default: {IMAGE_BATCH}; with --seq-len, {TOKEN_BATCH} sequences].",
)
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
@click.option(
    "--rtt-ms",
    type=FiniteFloat(0, 10_000),
    help="With --compare: put a proxy in front of the store that adds this round trip to "
    "every request (and 1 Gbit/s), so a server on this machine shows what a remote bucket "
    "costs. Needs --endpoint-url of a server on a loopback address.",
)
@click.option(
    "--seq-len",
    type=click.IntRange(1),
    help="URL is a token dataset: run the TokenLoader with sequences of this many tokens "
    "and report tokens/s, GETs and bytes read per byte of tokens delivered.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@handle_errors
def bench_command(
    ctx: click.Context,
    url: str,
    batch_size: int | None,
    batches: int | None,
    threads: int | None,
    prefetch: int | None,
    block_size: int | None,
    size: int,
    transform_kind: str,
    seed: int,
    cache_dir: str | None,
    compare: bool,
    limit: int,
    pack_to: str | None,
    keep_packed: bool,
    out: str,
    rtt_ms: float | None,
    seq_len: int | None,
    as_json: bool,
) -> None:
    """Run the loader over URL (one epoch, or --batches) and report its speed.

    Images per second, time to first batch, bytes and GET requests per sample, the share
    of time a consumer would wait, peak memory, and the shuffle's quality (how far apart
    neighbours are, shards per batch) with its cost in GETs per epoch.

    URL is a packed dataset, or a folder of class folders of images (a bucket prefix or a
    local directory) streamed as it is, one GET per image (`stoker pack` makes it faster).

    With --seq-len, URL is a token dataset (`stoker pack --tokens`): the TokenLoader cuts
    its stream into sequences of --seq-len + 1 tokens, and the report gives tokens/s (of
    input_ids), time to first batch, CPU seconds per billion tokens, GETs, and bytes read
    per byte of tokens delivered (1.00 when nothing is read twice), e.g.

        stoker bench s3://b/tokens --seq-len 2048 --batch-size 8

    With --compare, URL is a folder of small images instead, and the four usual ways to
    train on it are timed to the first batch and to the end of one epoch, with the same
    decoding: (a) download one by one, then train; (b) download in parallel, then train;
    (c) stream the small files, one GET each; (d) pack, then stream the shards. Prints a
    table and writes a bar chart (--out). With --rtt-ms, every request goes through a
    delaying proxy, as in `stoker demo`: a local server then shows what a bucket in
    another region or cloud costs, e.g.

        stoker --endpoint-url http://127.0.0.1:8333 bench --compare --rtt-ms 20 s3://b/images
    """
    if seq_len is not None:
        if compare or rtt_ms is not None or threads is not None:
            raise click.UsageError("--seq-len takes no --compare, --rtt-ms or --threads")
        for name in ("size", "transform_kind"):
            if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
                raise click.UsageError("--seq-len takes no --size or --transform: tokens")
        _bench_tokens(
            ctx,
            url,
            seq_len=seq_len,
            batch_size=batch_size or TOKEN_BATCH,
            batches=batches,
            seed=seed,
            prefetch=prefetch,
            block_size=block_size,
            cache_dir=cache_dir,
            as_json=as_json,
        )
        return
    batch_size = batch_size or IMAGE_BATCH
    if compare:
        fixed = (batches, cache_dir, prefetch, block_size)
        if any(v is not None for v in fixed) or transform_kind != "random-resized-crop":
            raise click.UsageError(
                "--compare takes no --batches, --cache-dir, --prefetch, --block-size or --transform"
            )
        from stoker.profile.compare import CompareConfig

        config = CompareConfig(
            limit=limit, batch_size=batch_size, size=size, threads=threads, seed=seed
        )
        run_compare(
            ctx,
            url,
            config,
            pack_to=pack_to,
            keep_packed=keep_packed,
            out=out,
            as_json=as_json,
            rtt_ms=rtt_ms,
        )
        return
    if rtt_ms is not None:
        raise click.UsageError("--rtt-ms goes with --compare")
    from stoker.pipeline.quality import shuffle_quality
    from stoker.profile.bench import bench_loader

    try:
        opened = _open_loader(
            ctx,
            url,
            batch_size=batch_size,
            seed=seed,
            transform_kind=transform_kind,
            size=size,
            threads=threads,
            prefetch=prefetch,
            block_size=block_size,
            cache_dir=cache_dir,
        )
    except ValueError as exc:
        if "is a token dataset" in str(exc):
            raise click.UsageError(f"{exc}; to bench it, give --seq-len") from exc
        raise
    with opened as loader:
        result = bench_loader(loader, max_batches=batches)
        shard_sizes, order = _order_model(loader)
        quality = shuffle_quality(shard_sizes, config=order, batch_size=batch_size)
    # One count of GETs: the run's (the order's model counts blocks, and reads merge
    # neighbouring blocks into one request).
    shuffle = quality.to_dict()
    shuffle.pop("requests_per_epoch")
    shuffle.pop("requests_per_sample")
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "shuffle": shuffle}, indent=2))
        return
    click.echo(
        f"{result.samples:,} samples in {result.seconds:.2f} s: {result.images_per_s:,.0f} "
        f"images/s; first batch after {result.first_batch_s:.2f} s; "
        f"{format_bytes(result.bytes_per_sample)} and {result.requests_per_sample:.3f} GETs "
        f"per sample; peak RSS {result.peak_rss_mb:,.0f} MB."
    )
    epoch = (
        f"{result.requests_per_epoch:,} GETs per epoch of {result.epoch_samples:,} samples"
        if result.whole_epoch
        else f"about {result.requests_per_epoch:,} GETs per epoch of "
        f"{result.epoch_samples:,} samples (at the rate of the samples fetched so far)"
    )
    click.echo(
        f"Shuffle: neighbours {quality.mean_neighbour_distance:.3f} of the dataset apart "
        f"(random: ~0.333), {quality.mean_shards_per_batch:.1f} shards per batch; {epoch}."
    )


def _bench_tokens(
    ctx: click.Context,
    url: str,
    *,
    seq_len: int,
    batch_size: int,
    batches: int | None,
    seed: int,
    prefetch: int | None,
    block_size: int | None,
    cache_dir: str | None,
    as_json: bool,
) -> None:
    """``bench --seq-len``: the TokenLoader over a token dataset."""
    from stoker.pipeline.config import CacheConfig
    from stoker.pipeline.order import OrderConfig
    from stoker.pipeline.token_loader import TokenLoader
    from stoker.profile.token_bench import bench_tokens, format_token_bench

    loader = TokenLoader(
        url,
        seq_len=seq_len,
        batch_size=batch_size,
        seed=seed,
        order=OrderConfig(block_size=block_size) if block_size is not None else None,
        prefetch=prefetch or "auto",
        cache=CacheConfig(dir=cache_dir),
        storage_options=_storage(ctx),
    )
    with loader:  # ``as`` would give the Loader type, and bench_tokens takes a TokenLoader
        result = bench_tokens(loader, max_batches=batches)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(format_token_bench(result))


@click.command("doctor")
@click.argument("url")
@click.option(
    "--step-ms",
    type=FiniteFloat(0, MAX_STEP_S * 1000),
    default=100.0,
    show_default=True,
    help="Your training step per batch, simulated by sleeping (as waiting on a GPU does).",
)
@click.option(
    "--seconds",
    type=FiniteFloat(0.1),
    default=15.0,
    show_default=True,
    help="Measure for about this long (epochs repeat as needed; --batches instead).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1),
    default=IMAGE_BATCH,
    show_default=True,
    help="Samples per batch.",
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
    prefetch: int | None,
    block_size: int | None,
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

    URL is a packed dataset, or a folder of class folders of images (a bucket prefix or a
    local directory) streamed as it is, one GET per image (`stoker pack` makes it faster).
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
        prefetch=prefetch,
        block_size=block_size,
        cache_dir=cache_dir,
    ) as loader:
        diagnosis = diagnose(
            loader,
            step_s=step_ms / 1000,
            max_batches=batches,
            seconds=None if batches else seconds,
            step="spin" if busy_step else "sleep",
            advice_for="cli",
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
