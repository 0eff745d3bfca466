"""The token side of ``stoker pack`` and ``inspect``: ``pack --tokens`` and its options, and
the summary of a token dataset."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from stoker.cli.common import printable, with_options
from stoker.cli.common import storage_options as _storage
from stoker.cli.progress import pack_bar
from stoker.core.units import format_bytes
from stoker.pack.token_sources import BIN_DTYPES
from stoker.pack.tokens import TokenPackConfig, TokenSummary, pack_tokens

#: The options of ``stoker pack --tokens``, in the order ``--help`` lists them.
with_token_pack_options = with_options(
    [
        click.option(
            "--tokens",
            is_flag=True,
            help="Pack tokenized documents (.npy/.bin files, or one file with --offsets) or "
            "JSONL/Parquet text with --tokenizer into token shards for TokenLoader.",
        ),
        click.option(
            "--offsets",
            metavar="FILE.npy",
            help="With --tokens: each document's start in SRC (one file of concatenated tokens), "
            "and the end.",
        ),
        click.option(
            "--bin-dtype",
            type=click.Choice(BIN_DTYPES),
            help="With --tokens: the dtype of raw .bin token files.",
        ),
        click.option(
            "--text-field",
            default="text",
            show_default=True,
            help="With --tokens: the JSONL field or Parquet column holding the text.",
        ),
        click.option(
            "--tokenizer",
            metavar="TOKENIZER.json",
            help="With --tokens: a Hugging Face tokenizers file for JSONL/Parquet text (needs "
            "pip install tokenizers); its special tokens are not added.",
        ),
        click.option(
            "--vocab-size",
            type=click.IntRange(1, 1 << 32),
            help="With --tokens: ids at or above it are out of range; uint16 when it is at most "
            "65536 (default: the tokenizer's, else the largest id found decides).",
        ),
        click.option(
            "--eos-id",
            type=click.IntRange(0, (1 << 32) - 1),
            help="With --tokens: the end-of-text id appended after every document.",
        ),
    ]
)


#: Options of one kind of pack only, by parameter name, with their flags.
_TOKEN_OPTIONS = {
    "offsets": "--offsets",
    "bin_dtype": "--bin-dtype",
    "text_field": "--text-field",
    "tokenizer": "--tokenizer",
    "vocab_size": "--vocab-size",
    "eos_id": "--eos-id",
}
_IMAGE_OPTIONS = {
    "source_format": "--format",
    "samples_per_shard": "--samples-per-shard",
    "resize_shorter": "--resize",
    "max_side": "--max-side",
    "quality": "--quality",
    "max_pixels": "--max-pixels",
    "engine": "--engine",
    "prefixes": "--prefixes",
    "class_names": "--class-name",
    "allow_outside_list": "--allow-outside-list",
}


def check_pack_options(ctx: click.Context, tokens: bool) -> None:
    """Refuse options of the other kind of pack (``tokens``: a token pack), so that none is
    silently ignored."""
    for name, flag in (_IMAGE_OPTIONS if tokens else _TOKEN_OPTIONS).items():
        if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT):
            raise click.UsageError(
                f"{flag} does not apply to a token pack"
                if tokens
                else f"{flag} applies to token packs only (add --tokens)"
            )


def pack_tokens_command(
    ctx: click.Context, src: str, dst_url: str, on_error: str, as_json: bool, no_progress: bool
) -> None:
    """``stoker pack --tokens``: pack with the options in ``ctx.params`` and print the report."""
    params = ctx.params
    config = TokenPackConfig(
        eos_id=params["eos_id"],
        vocab_size=params["vocab_size"],
        bin_dtype=params["bin_dtype"],
        text_field=params["text_field"],
        max_shard_bytes=params["shard_size"],
        shuffle_seed=None if params["keep_order"] else params["shuffle_seed"],
        on_error=on_error,  # type: ignore[arg-type]
        workers=params["workers"],
    )
    show = not no_progress and not as_json and sys.stderr.isatty()
    bar, progress = pack_bar("documents", enabled=show)
    with bar:
        report = pack_tokens(
            src,
            dst_url,
            config=config,
            tokenizer=params["tokenizer"],
            offsets=params["offsets"],
            storage_options=_storage(ctx),
            progress=progress,
        )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    stats = report.tokens
    if stats is None:  # pack_tokens always sets it
        raise RuntimeError("a token pack reported no tokens")
    using = f" with {stats.tokenizer}" if stats.tokenizer else ""
    click.echo(f"Read {report.source}{using}.")
    order = (
        "in the input's order"
        if stats.shuffle_seed is None
        else f"shuffled by seed {stats.shuffle_seed}"
    )
    eos = "" if stats.eos_id is None else f", end-of-text id {stats.eos_id} after each"
    reused = (
        f"; {_count(report.shards_reused, 'shard')} reused from an earlier run"
        if report.shards_reused
        else ""
    )
    click.echo(
        f"Packed {report.samples:,} documents, {stats.tokens:,} tokens ({stats.dtype}"
        f"{eos}; largest id {stats.max_id:,}) into {_count(report.shards, 'shard')} at "
        f"{report.destination} in {report.seconds:.1f} s, documents {order}; "
        f"read {format_bytes(report.bytes_in)}, wrote {format_bytes(report.bytes_out)}"
        f"{reused}."
    )
    if report.skipped:
        click.echo(f"Skipped {len(report.skipped)} documents (listed in index.json):", err=True)
        for item in report.skipped[:20]:
            click.echo(f"  {printable(item['source'])}: {printable(item['reason'])}", err=True)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def inspect_tokens(summary: TokenSummary, *, as_json: bool) -> None:
    """``stoker inspect`` of a token dataset: its summary as text, or as JSON."""
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
        return
    console = Console()
    lengths = summary.document_tokens
    eos = "none" if summary.eos_id is None else f"{summary.eos_id} (after each document)"
    console.print(
        f"[bold]{printable(summary.url)}[/]: token dataset, {summary.tokens:,} tokens in "
        f"{summary.documents:,} documents, {_count(len(summary.shards), 'shard')}, "
        f"{format_bytes(summary.bytes)}; {summary.skipped} inputs skipped at pack time",
        highlight=False,
    )
    console.print(
        f"dtype {summary.dtype}, largest id {summary.max_id:,}, end-of-text id {eos}\n"
        f"tokens per document{' (eos included)' if summary.eos_id is not None else ''}: "
        f"mean {lengths['mean']:,.1f}, min {lengths['min']:,}, max {lengths['max']:,}\n"
        f"sequences per epoch at --seq-len {summary.seq_len:,}: {summary.sequences:,} "
        f"(tokens // {summary.seq_len + 1:,}, one rank)",
        highlight=False,
    )
    shards = Table("shard", "documents", "tokens", "bytes")
    for entry in summary.shards[:50]:
        shards.add_row(
            entry["name"],
            f"{entry['documents']:,}",
            f"{entry['tokens']:,}",
            format_bytes(entry["bytes"]),
        )
    console.print(shards)
    if len(summary.shards) > 50:
        console.print(f"... and {len(summary.shards) - 50} more shards (--json lists all)")
