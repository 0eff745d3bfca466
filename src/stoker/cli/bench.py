"""``stoker bench``: the Loader's speed over a dataset, the TokenLoader's with --seq-len, and
with --compare the four ways to train on a folder of small images."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from stoker.cli.common import handle_errors
from stoker.cli.common import storage_options as _storage
from stoker.cli.compare import run_compare
from stoker.cli.loader_options import IMAGE_BATCH, TOKEN_BATCH, open_loader, with_loader_options
from stoker.cli.params import FiniteFloat
from stoker.core.units import format_bytes

if TYPE_CHECKING:
    from stoker.pipeline.loader import Loader


@click.command("bench")
@click.argument("url")
@click.option(
    "--batch-size",
    type=click.IntRange(1),
    help=f"Samples per batch [default: {IMAGE_BATCH}; with --seq-len, {TOKEN_BATCH} sequences].",
)
@with_loader_options
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
    "--port",
    type=click.IntRange(1, 65535),
    envvar="STOKER_BENCH_PORT",
    show_envvar=True,
    help="With --rtt-ms: the port of 127.0.0.1 the delaying proxy listens on, the endpoint "
    "every request goes to (default: a free one).",
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
    port: int | None,
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

    The proxy listens on a free port of 127.0.0.1, or on --port (or STOKER_BENCH_PORT).
    """
    _check_flags(ctx)
    run = _Run(
        url=url,
        batches=batches,
        seed=seed,
        prefetch=prefetch,
        block_size=block_size,
        cache_dir=cache_dir,
        as_json=as_json,
    )
    if seq_len is not None:
        _bench_tokens(ctx, run, seq_len=seq_len, batch_size=batch_size or TOKEN_BATCH)
    elif compare:
        _bench_compare(ctx, run, batch_size=batch_size or IMAGE_BATCH)
    else:
        _bench_images(
            ctx,
            run,
            batch_size=batch_size or IMAGE_BATCH,
            transform_kind=transform_kind,
            size=size,
            threads=threads,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Run:
    """What the Loader's and the TokenLoader's benches both take."""

    url: str
    batches: int | None
    seed: int
    prefetch: int | None
    block_size: int | None
    cache_dir: str | None
    as_json: bool


def _check_flags(ctx: click.Context) -> None:
    """Refuse options that the mode (--seq-len, --compare, or the Loader's) does not take."""
    given = ctx.params
    seq_len, compare, rtt_ms = given["seq_len"], given["compare"], given["rtt_ms"]
    if ctx.get_parameter_source("port") is ParameterSource.COMMANDLINE and rtt_ms is None:
        raise click.UsageError("--port is where the --rtt-ms proxy listens: give --rtt-ms too")
    if seq_len is not None:
        if compare or rtt_ms is not None or given["threads"] is not None:
            raise click.UsageError("--seq-len takes no --compare, --rtt-ms or --threads")
        for name in ("size", "transform_kind"):
            if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
                raise click.UsageError("--seq-len takes no --size or --transform: tokens")
    elif compare:
        fixed = (given[name] for name in ("batches", "cache_dir", "prefetch", "block_size"))
        if any(v is not None for v in fixed) or given["transform_kind"] != "random-resized-crop":
            raise click.UsageError(
                "--compare takes no --batches, --cache-dir, --prefetch, --block-size or --transform"
            )
    elif rtt_ms is not None:
        raise click.UsageError("--rtt-ms goes with --compare")


def _bench_compare(ctx: click.Context, run: _Run, *, batch_size: int) -> None:
    """``bench --compare``: the four ways to train on a folder of small images, with the
    options only it takes."""
    from stoker.profile.compare import CompareConfig

    given = ctx.params
    config = CompareConfig(
        limit=given["limit"],
        batch_size=batch_size,
        size=given["size"],
        threads=given["threads"],
        seed=run.seed,
    )
    run_compare(
        ctx,
        run.url,
        config,
        pack_to=given["pack_to"],
        keep_packed=given["keep_packed"],
        out=given["out"],
        as_json=run.as_json,
        rtt_ms=given["rtt_ms"],
        port=given["port"],
    )


def _bench_images(
    ctx: click.Context,
    run: _Run,
    *,
    batch_size: int,
    transform_kind: str,
    size: int,
    threads: int | None,
) -> None:
    """``bench``: the Loader over a packed dataset or an image folder, and its shuffle."""
    from stoker.pipeline.quality import shuffle_quality
    from stoker.profile.bench import bench_loader

    try:
        opened = open_loader(
            ctx,
            run.url,
            batch_size=batch_size,
            seed=run.seed,
            transform_kind=transform_kind,
            size=size,
            threads=threads,
            prefetch=run.prefetch,
            block_size=run.block_size,
            cache_dir=run.cache_dir,
        )
    except ValueError as exc:
        if "is a token dataset" in str(exc):
            raise click.UsageError(f"{exc}; to bench it, give --seq-len") from exc
        raise
    with opened as loader:
        result = bench_loader(loader, max_batches=run.batches)
        shard_sizes, order = _order_model(loader)
        quality = shuffle_quality(shard_sizes, config=order, batch_size=batch_size)
    # One count of GETs: the run's (the order's model counts blocks, and reads merge
    # neighbouring blocks into one request).
    shuffle = quality.to_dict()
    shuffle.pop("requests_per_epoch")
    shuffle.pop("requests_per_sample")
    if run.as_json:
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


def _bench_tokens(ctx: click.Context, run: _Run, *, seq_len: int, batch_size: int) -> None:
    """``bench --seq-len``: the TokenLoader over a token dataset."""
    from stoker.pipeline.config import CacheConfig
    from stoker.pipeline.order import OrderConfig
    from stoker.pipeline.token_loader import TokenLoader
    from stoker.profile.token_bench import bench_tokens, format_token_bench

    loader = TokenLoader(
        run.url,
        seq_len=seq_len,
        batch_size=batch_size,
        seed=run.seed,
        order=OrderConfig(block_size=run.block_size) if run.block_size is not None else None,
        prefetch=run.prefetch or "auto",
        cache=CacheConfig(dir=run.cache_dir),
        storage_options=_storage(ctx),
    )
    with loader:  # ``as`` would give the Loader type, and bench_tokens takes a TokenLoader
        result = bench_tokens(loader, max_batches=run.batches)
    if run.as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(format_token_bench(result))


def _order_model(loader: Loader) -> tuple[list[int], Any]:
    """The shard sizes and order settings the loader's epochs really follow."""
    from stoker.format.reader import ShardDataset
    from stoker.pipeline.folder import FolderSource

    source, dataset = loader.source, loader.dataset
    if source.one_get_per_unit:  # an unpacked folder: one object per read, blocks of one
        return [source.units()], FolderSource.order_for(loader.order_config)
    # The units in each block-bounding group of the source's own order: a Parquet table's
    # row groups, the clips of each shard; else the packed dataset's shards.
    sizes: list[int] = list(getattr(source, "shard_sizes", None) or [])
    if not sizes and isinstance(dataset, ShardDataset):
        sizes = [s.samples for s in dataset.shards]
    return sizes, loader.order_config
