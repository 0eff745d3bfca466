"""``stoker show`` and ``doctor``: running the Loader over a dataset.

``stoker bench`` is :mod:`stoker.cli.bench`, and the options the three share are
:mod:`stoker.cli.loader_options` (their names are importable from here too).
"""

from __future__ import annotations

import json

import click

from stoker.cli.bench import bench_command
from stoker.cli.common import handle_errors, printable
from stoker.cli.common import storage_options as _storage
from stoker.cli.loader_options import (
    IMAGE_BATCH,
    TOKEN_BATCH,
    open_loader,
    with_loader_options,
    with_transform_options,
)
from stoker.cli.params import FiniteFloat
from stoker.profile.doctor import MAX_STEP_S

__all__ = ["IMAGE_BATCH", "TOKEN_BATCH", "bench_command", "doctor_command", "show_command"]


@click.command("show")
@click.argument("url")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default="grid.png",
    show_default=True,
    help="PNG file to write.",
)
@with_transform_options
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

        with open_loader(
            ctx, source, batch_size=GRID_CELLS, seed=seed, transform_kind=None, size=size
        ) as loader:
            samples = describe_samples(loader, GRID_CELLS)
        fields = ", ".join(source.index.fields)
        click.echo(
            printable(
                f"{url} has no images (fields {fields}): no grid written; the fields of "
                f"{len(samples)} samples as the Loader's batches carry them:"
            )
        )
        for lines in samples:  # keys, class names and captions may hold control characters
            click.echo("\n".join(printable(line) for line in lines))
        return
    with open_loader(
        ctx, source, batch_size=GRID_CELLS, seed=seed, transform_kind=transform_kind, size=size
    ) as loader:
        path, shown = save_sample_grid(loader, out)
    click.echo(f"Wrote {path} ({shown} samples of {url}).")


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
@with_loader_options
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

    with open_loader(
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
