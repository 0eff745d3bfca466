"""What ``stoker show``, ``bench`` and ``doctor`` share: the Loader's options and opening it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from stoker.cli.common import storage_options as _storage
from stoker.cli.common import with_options

#: Batch sizes when --batch-size is not given: images, and token sequences (bench --seq-len).
IMAGE_BATCH = 256
TOKEN_BATCH = 8
#: What show, bench and doctor read of a dataset of videos: one clip of this many frames
#: from the start of each video.
CLIP_FRAMES = 16

if TYPE_CHECKING:
    from stoker.format.reader import ShardDataset
    from stoker.pipeline.loader import Loader


def _transform(kind: str, size: int) -> Any:
    from stoker.pipeline.transforms import CenterCrop, RandomResizedCrop

    if kind == "random-resized-crop":
        return RandomResizedCrop(size, flip=True)
    return CenterCrop(size, resize=round(size * 256 / 224))


#: --size, --transform and --seed: the transform ``show``, ``bench`` and ``doctor`` apply.
with_transform_options = with_options(
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
with_loader_options = with_options(
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
        with_transform_options,
        click.option(
            "--cache-dir",
            type=click.Path(file_okay=False),
            help="Read through a disk cache in this directory (a second run reads from it).",
        ),
    ]
)


def open_loader(
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
    """The Loader the command's options describe (``transform_kind`` None: no transform);
    over a dataset of videos, clips of :data:`CLIP_FRAMES` frames (a video shorter than
    that padded with its last frame)."""
    from stoker.pipeline.config import CacheConfig, DecodeConfig
    from stoker.pipeline.loader import Loader
    from stoker.pipeline.order import OrderConfig

    return Loader(
        _source_of(ctx, url),
        batch_size=batch_size,
        seed=seed,
        transform=_transform(transform_kind, size) if transform_kind else None,
        order=OrderConfig(block_size=block_size) if block_size is not None else None,
        decode=DecodeConfig(threads=threads or "cpus"),
        prefetch=prefetch or "auto",
        cache=CacheConfig(dir=cache_dir),
        storage_options=_storage(ctx),
    )


def _source_of(ctx: click.Context, url: str | ShardDataset) -> Any:
    """What the command's Loader reads of ``url``: its packed dataset, opened once here
    (the Loader takes it as it is, with no second read of the index), as clips where it
    holds videos; ``url`` itself where it has no index (Parquet, a folder of images)."""
    from stoker.format.reader import ShardDataset, open_dataset
    from stoker.pipeline.clips import VideoConfig
    from stoker.pipeline.config import SourceConfig

    try:
        dataset = (
            url
            if isinstance(url, ShardDataset)
            else open_dataset(url, storage_options=_storage(ctx))
        )
    except FileNotFoundError:  # Parquet, a folder of images: the Loader finds out
        return url
    if dataset.index.videos is None:
        return dataset
    return SourceConfig(dataset, video=VideoConfig(frames=CLIP_FRAMES, short="pad"))
