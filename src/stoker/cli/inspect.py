"""``stoker inspect``: what a packed dataset holds, read from its index and first samples."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stoker.cli.common import handle_errors, printable
from stoker.cli.common import storage_options as _storage
from stoker.cli.parquet import inspect_parquet
from stoker.cli.tokens import inspect_tokens
from stoker.cli.videos import print_videos, video_summary
from stoker.core.units import format_bytes
from stoker.errors import SourceError
from stoker.format.foreign.parquet_summary import ParquetSummary, summarise_parquet
from stoker.format.reader import ShardDataset, open_dataset
from stoker.pack.token_summary import summarise_tokens
from stoker.pipeline.order import assign
from stoker.pipeline.plan import resolve_order
from stoker.pipeline.quality import LabelMix, ReadCost, label_mix, read_cost
from stoker.pipeline.sources import DatasetSource
from stoker.profile.fields import DEFAULT_SUMMARY_SAMPLES, FieldSummary, summarise_fields


@click.command("inspect")
@click.argument("url")
@click.option(
    "--field-samples",
    type=click.IntRange(0),
    default=DEFAULT_SUMMARY_SAMPLES,
    show_default=True,
    help="Decode the first N samples to summarise each field's values and sizes (0: none).",
)
@click.option(
    "--seq-len",
    type=click.IntRange(1),
    default=2048,
    show_default=True,
    help="For a token dataset: the sequence length to count sequences per epoch at.",
)
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
@click.pass_context
@handle_errors
def inspect_command(
    ctx: click.Context, url: str, field_samples: int, seq_len: int, as_json: bool
) -> None:
    """Summarise a packed dataset (samples, fields, classes, shards) or a Parquet table.

    Each field (member extension) is listed with how many samples have it, how the Loader
    decodes it and under which batch name, its mean size and what the first samples hold
    (str lengths, array dtypes and shapes, JSON keys). Two GETs for the index, one ranged
    GET for the first samples. A token dataset shows its tokens, documents (mean, min and
    max length), dtype, end-of-text id, shards and the sequences of --seq-len an epoch
    holds (tokens // (seq_len + 1)), from the index alone. A Parquet file, or a folder or
    prefix of them, shows its rows, row groups, files and each column's type, sample field,
    bytes stored and decoded and nulls, from the footers alone (one GET a file). A dataset
    of videos lists each one's codec, size, frames, frame rate, duration and keyframes
    from its seek index.
    """
    try:
        dataset = open_dataset(url, storage_options=_storage(ctx))
    except FileNotFoundError:
        parquet = _parquet_summary(url, _storage(ctx))
        if parquet is None:
            raise
        inspect_parquet(parquet, as_json=as_json)
        return
    if dataset.index.tokens is not None:
        inspect_tokens(
            summarise_tokens(dataset.url, dataset.index.tokens, dataset.index, seq_len=seq_len),
            as_json=as_json,
        )
        return
    fields = summarise_fields(dataset, samples=field_samples)
    index = dataset.index
    classes = _class_counts(dataset)
    total_bytes = sum(s.size for s in dataset.shards)
    mix, cost = _default_order_quality(dataset)
    summary = {
        "url": dataset.url,
        "samples": len(dataset),
        "shards": len(dataset.shards),
        "bytes": total_bytes,
        "fields": index.fields,
        "field_table": [f.to_dict() for f in fields],
        "classes": classes,
        "skipped": len(index.skipped),
        "packed_with": index.packed_with,
        "label_mix": mix.to_dict(),
        "read_cost": cost.to_dict(),
        "shard_table": [
            {"name": s.name, "samples": s.samples, "bytes": s.size, "sha256": s.sha256}
            for s in dataset.shards
        ],
    }
    videos = video_summary(dataset) if index.videos is not None else None
    if videos is not None:
        summary["videos"] = videos
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    console = Console()
    console.print(
        f"[bold]{_shown(dataset.url)}[/]: {len(dataset):,} samples in {len(dataset.shards)} "
        f"shards, {format_bytes(total_bytes)}; {len(index.skipped)} inputs skipped at "
        "pack time"
    )
    console.print(_field_table(fields, read=min(field_samples, len(dataset))))
    table = Table("class", "samples")
    for name, count in classes.items():
        table.add_row(_shown(name), f"{count:,}")
    console.print(table)
    _print_order(console, mix, cost)
    if videos is not None:
        print_videos(console, videos, _shown)
    shards = Table("shard", "samples", "bytes", "sha256")
    for entry in dataset.shards[:50]:
        shards.add_row(
            _shown(entry.name), f"{entry.samples:,}", format_bytes(entry.size), entry.sha256[:16]
        )
    console.print(shards)
    if len(dataset.shards) > 50:
        console.print(f"... and {len(dataset.shards) - 50} more shards (--json lists all)")


def _parquet_summary(url: str, options: dict[str, Any] | None) -> ParquetSummary | None:
    """The summary of the Parquet table at ``url``, or None where there is none."""
    try:
        return summarise_parquet(url, storage_options=options)
    except (SourceError, ImportError):
        return None


def _class_counts(dataset: ShardDataset) -> dict[str, int]:
    """Samples of each label, by class name (the label itself where it has none)."""
    counts: dict[int, int] = {}
    for label in dataset.index.label.tolist():
        counts[label] = counts.get(label, 0) + 1
    names = dataset.class_names
    return {(names[k] if 0 <= k < len(names) else str(k)): v for k, v in sorted(counts.items())}


def _print_order(console: Console, mix: LabelMix, cost: ReadCost) -> None:
    """How well the default order mixes labels, and what it reads."""
    if mix.batches:
        console.print(
            f"Label mix of the default order, batches of {LABEL_MIX_BATCH}: "
            f"{mix.mean_distinct_labels:.1f} distinct labels per batch, "
            f"{mix.distinct_ratio:.2f}x a uniform shuffle's {mix.uniform_distinct_labels:.1f}; "
            f"label histogram {mix.mean_tv_distance:.2f} from the dataset's "
            f"(a uniform shuffle: {mix.uniform_tv_distance:.2f}, total variation)"
        )
    console.print(
        f"Read cost of the default order, one rank: {cost.requests:,} ranged reads an epoch, "
        f"median {format_bytes(int(cost.median_read_bytes))}; mixed through "
        f"{cost.window_groups} read group(s) at once (about "
        f"{format_bytes(int(cost.window_bytes))} held)"
    )


def _field_table(fields: list[FieldSummary], *, read: int) -> Table:
    table = Table(
        "field",
        "samples",
        "decoded as",
        "in batch",
        "mean size",
        f"first {read} samples",
        title="Fields",
        title_justify="left",
    )
    for f in fields:
        values = f.values
        if f.failed:
            values += f"; {f.failed} of {f.read} fail: {f.problem}"
        elif f.read < read:
            values += f" ({f.read} of {read} have it)"
        table.add_row(
            _shown(f.field),
            "?" if f.samples is None else f"{f.samples:,}",
            f.decoded_as,
            _shown(f.batch_name),
            "-" if f.mean_bytes is None else format_bytes(round(f.mean_bytes)),
            _shown(values),
        )
    return table


def _shown(text: str) -> str:
    """``text`` from the dataset (a class name, a caption) as rich prints it literally:
    control characters escaped (they could drive the terminal), markup escaped."""
    return escape(printable(text))


#: Batch size at which `stoker inspect` measures the default order's label mix.
LABEL_MIX_BATCH = 256


def _default_order_quality(dataset: ShardDataset) -> tuple[LabelMix, ReadCost]:
    """How well the batches of the Loader's default order (epoch 0, one rank) mix labels,
    and what that order costs to read."""
    source = DatasetSource(dataset)
    config = resolve_order(
        None,
        seed=0,
        units=source.units(),
        unit_bytes=source.unit_bytes(),
        shuffled=source.shuffled(),
    )
    order = source.epoch_order(config, 0)
    stream = assign(order, rank=0, world_size=1).samples
    mix = label_mix(dataset.index.label, [stream], batch_size=LABEL_MIX_BATCH)
    index = dataset.index
    return mix, read_cost(index.length, source.shard_sizes, order=order, config=config)
