"""The Loader's settings, as frozen values: what to read, how to decode, where to cache.

Each object groups the settings of one concern and checks them when it is made, so a
mistake fails at construction with the field's name. The Loader's other settings live
beside the code they steer: :class:`~stoker.pipeline.order.OrderConfig` (shuffle, seed,
block sizes), :class:`~stoker.pipeline.world.World` (rank and worker),
:class:`~stoker.pipeline.autotune.AutotuneConfig` (budgets of the autotuner),
:class:`~stoker.pipeline.mixing.MixConfig` and :class:`~stoker.pipeline.windows.WindowConfig`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, TypeVar

from stoker.core.checks import check_choice, check_instance, check_int, shown
from stoker.format.reader import ShardDataset
from stoker.format.spec import DEFAULT_MAX_PIXELS
from stoker.pipeline.autotune import AutotuneConfig
from stoker.pipeline.clips import VideoConfig
from stoker.pipeline.fields import FieldsConfig
from stoker.pipeline.mixing import MixConfig
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.token_batcher import TokenConfig
from stoker.pipeline.transforms import PlannedTransform
from stoker.pipeline.windows import WindowConfig
from stoker.pipeline.world import World

#: Page of the disk cache when the order reads whole blocks: a quarter of a default block
#: (4 MB), so a cold block fetches at most a page on either side of its bytes.
BLOCK_PAGE_BYTES = 1 << 20
#: Page of the disk cache for ``OrderConfig(mode="random")``, which reads one sample per
#: request: small pages keep a cold read small.
SAMPLE_PAGE_BYTES = 128 << 10

C = TypeVar("C")


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeConfig:
    """How samples are decoded and transformed.

    Attributes:
        threads: Decode threads (or processes, with ``method="process"``); ``"cpus"``
            (the default): one per CPU; ``"auto"``: start there and let the autotuner
            (:mod:`stoker.pipeline.autotune`) measure other counts. Not the default: on a
            2-core machine its windows measured 1,169 to 2,298 images/s for a pipeline that
            runs 1,500-1,590 at any fixed count near the CPU count (queues filled under
            one count drain under the next), and one epoch of set a ran 0.90-0.95x the
            fixed count's speed while it searched.
        method: Decode in ``"thread"``s (the decoders release the GIL) or in worker
            ``"process"``es, for transforms written in Python that hold the GIL. Processes
            start with spawn, so the transform must be picklable (a module-level function
            or class); results come back through shared memory (see
            :mod:`stoker.pipeline.workers`).
        max_pixels: Refuse images declaring more pixels than this, before decoding them: a
            guard against decompression bombs.
        on_error: ``"raise"`` on an undecodable sample, or ``"skip"`` it (counted and
            listed in :meth:`stoker.Loader.stats`; its batch is one shorter).
        fields: Which fields of a record the batches carry besides ``image``, how each is
            decoded, and what a missing one does (:class:`~stoker.pipeline.fields.FieldsConfig`);
            by default every member of every sample, decoded by its extension (``txt`` to
            ``str``, ``json`` to objects, ``npy`` to arrays, the rest as ``bytes``).
        max_skipped: The failure budget: how many samples one rank may skip in one epoch
            (``on_error="skip"``, or ``FieldsConfig(missing="skip")``) before the loader
            stops with :class:`~stoker.errors.SkipBudgetError`, whose message gives the
            count, the budget and the first keys with their reasons, and whose
            ``skipped`` lists them all. An int is a count (0: none); a float in (0, 1) is
            a share of the rank's epoch, ``floor(max_skipped * samples)`` of its
            ``stats().epoch_samples``. The count restarts with each epoch, is part of
            :meth:`stoker.Loader.state_dict` (a resumed run goes on counting), and with
            ``TorchLoader(num_workers=k)`` covers every worker of the rank. None: no
            budget.
        skipped_file: A file each skipped sample is appended to as one JSON line
            (``{"key", "shard", "reason", "epoch", "url"}``), one write per line, as its
            batch is handed out (by ``TorchLoader``'s training process, for all its
            workers; in a DataLoader of your own, by each worker as it makes the batch).
    """

    threads: int | Literal["cpus", "auto"] = "cpus"
    method: Literal["thread", "process"] = "thread"
    max_pixels: int = DEFAULT_MAX_PIXELS
    on_error: Literal["raise", "skip"] = "raise"
    fields: FieldsConfig = field(default_factory=FieldsConfig)
    max_skipped: int | float | None = None
    skipped_file: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        if self.threads not in ("cpus", "auto"):
            check_int("threads", self.threads, minimum=1, kind="an int, 'cpus' or 'auto'")
        check_choice("method", self.method, ("thread", "process"))
        check_int("max_pixels", self.max_pixels, minimum=1)
        check_choice("on_error", self.on_error, ("raise", "skip"))
        example = "FieldsConfig(select={'caption': 'txt'})"
        check_instance("fields", self.fields, FieldsConfig, example)
        if self.fields is None:
            object.__setattr__(self, "fields", FieldsConfig())
        self._check_budget()

    def _check_budget(self) -> None:
        budget, path = self.max_skipped, self.skipped_file
        if path is not None and not isinstance(path, str | os.PathLike):
            raise TypeError(f"skipped_file must be a path (str or os.PathLike), got {shown(path)}")
        if budget is None:
            return
        if isinstance(budget, float):
            if not 0 < budget < 1:
                raise ValueError(
                    f"max_skipped as a float is a share of the epoch in (0, 1), got {budget} "
                    "(an int is a count; None: no budget)"
                )
        else:
            kind = "an int count, a float share in (0, 1), or None"
            check_int("max_skipped", budget, minimum=0, kind=kind)
        if self.on_error != "skip" and self.fields.missing != "skip":
            raise ValueError(
                f"max_skipped={budget} bounds the samples skipped, but none are: give "
                "on_error='skip' (or FieldsConfig(missing='skip'))"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """Caches between the store and the decoder.

    Attributes:
        dir: A node-local directory for a disk cache of shard bytes, shared by every
            process that names it (ranks, loader workers, other jobs); epochs after the
            first, and restarts, read from it instead of the store.
        max_bytes: Bound of the disk cache (default: the dataset's size plus 10 %, or 80 %
            of the free space under ``dir`` if that is less).
        memory_bytes: In-memory cache of fetched samples, per loader; with at least the
            dataset's size, epochs after the first need no requests.
        page_bytes: Unit in which the disk cache reads and keeps objects (default:
            :data:`BLOCK_PAGE_BYTES`, or :data:`SAMPLE_PAGE_BYTES` when the order reads
            one sample per request).
    """

    dir: str | os.PathLike[str] | None = None
    max_bytes: int | None = None
    memory_bytes: int | None = None
    page_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.dir is not None and not isinstance(self.dir, str | os.PathLike):
            raise TypeError(f"dir must be a path (str or os.PathLike), got {self.dir!r}")
        for name in ("max_bytes", "memory_bytes", "page_bytes"):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value, minimum=1, kind="an int number of bytes (1 GB: 10**9)")
        if self.dir is None and (self.max_bytes is not None or self.page_bytes is not None):
            raise ValueError("max_bytes and page_bytes are the disk cache's: give dir too")


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """What a Loader reads, when it is more than one dataset's samples.

    ``Loader(url, ...)`` reads the samples of one packed dataset. A ``SourceConfig`` in
    place of the URL mixes several datasets, makes each unit a window of records, or
    attaches per-sample arrays::

        Loader(SourceConfig(["s3://b/web", "s3://b/books"], mix=MixConfig(weights=(3, 1))),
               batch_size=64)
        Loader(SourceConfig("s3://b/clips", window=WindowConfig(size=8)), batch_size=4)

    Attributes:
        location: A dataset URL, a local path or an opened
            :class:`~stoker.format.reader.ShardDataset`; or several of them, with ``mix``.
        mix: Proportions or per-source counts of several datasets in each epoch
            (:class:`~stoker.pipeline.mixing.MixConfig`); batches then carry ``source``,
            and :meth:`stoker.Loader.mix_shares` says what each source gives an epoch.
        window: Make each unit a window of consecutive records
            (:class:`~stoker.pipeline.windows.WindowConfig`): ``image`` is then
            ``(N, size, H, W, 3)`` (one augmentation per window), ``label`` ``(N, size)``,
            and ``records`` holds the record ids. ``WindowConfig(sequences="dirname")``
            keeps windows within the folder their records were packed from.
        side_tables: Arrays with one row per sample that live once in the store, as
            ``{name: URL of a .npy file}``; each batch gets ``batch[name]`` with its rows,
            read by ranged GETs (through the disk cache, if any).
        tokens: Read token datasets as sequences of ``tokens.seq_len + 1`` tokens (what
            :class:`~stoker.TokenLoader` passes on); a token dataset needs it.
        video: Make each unit a clip of a packed dataset's videos
            (:class:`~stoker.pipeline.clips.VideoConfig`): ``image`` is then
            ``(N, T, H, W, 3)`` uint8 (one augmentation per clip), with ``first_frame``
            and ``timestamps`` (seconds) of each clip; only the bytes from the keyframe
            before a clip to its last frame are fetched (:mod:`stoker.pipeline.video_source`).
        columns: For Parquet read in place (a ``.parquet`` file, or a folder or prefix of
            them: :mod:`stoker.pipeline.parquet_source`), read only these columns: the
            others' chunks are never fetched. None reads every column.
    """

    location: (
        str | os.PathLike[str] | ShardDataset | Sequence[str | os.PathLike[str] | ShardDataset]
    )
    mix: MixConfig | None = None
    window: WindowConfig | None = None
    side_tables: Mapping[str, str] | None = None
    tokens: TokenConfig | None = None
    columns: Sequence[str] | None = None
    video: VideoConfig | None = None

    def __post_init__(self) -> None:
        location = self.location
        extras = self.mix, self.window, self.side_tables, self.tokens
        if self.video is not None and any(extra for extra in extras[1:]):
            raise ValueError("video clips take no window, side tables or tokens")
        if self.columns is not None and any(extra for extra in (*extras, self.video)):
            raise ValueError("columns go with one Parquet location alone (no mix, window, ...)")
        count = 1 if isinstance(location, str | os.PathLike | ShardDataset) else len(location)
        if count > 1 and self.mix is None:
            raise ValueError(
                f"{count} datasets given: say how to mix them, with "
                "SourceConfig([...], mix=MixConfig(...))"
            )
        if self.mix is not None and self.window is not None:
            raise ValueError("windows over a mix are not supported: give one of mix and window")
        if self.side_tables and count > 1:
            raise ValueError("side tables go with a single dataset")


def check_loader_arguments(
    *, batch_size: object, prefetch: object, transform: object = None
) -> None:
    """Refuse a Loader's ``batch_size``, ``prefetch`` or ``transform`` that cannot work,
    naming it.

    Raises:
        TypeError: Not an integer (``prefetch`` may also be ``"auto"``), or a transform
            that is none of the built-in ones and not callable.
        ValueError: Less than 1.
    """
    check_int("batch_size", batch_size, minimum=1)
    if prefetch != "auto":
        check_int("prefetch", prefetch, minimum=1, kind="an int or 'auto'")
    if not (transform is None or callable(transform) or isinstance(transform, PlannedTransform)):
        raise TypeError(
            "transform must be a built-in transform (e.g. RandomResizedCrop(224)), a callable "
            f"taking a PIL.Image, or None; got {shown(transform)}"
        )


def config_or_default(name: str, value: C | None, kind: type[C]) -> C:
    """``value``, or ``kind()`` if it is None, for the Loader's config argument ``name``.

    Raises:
        TypeError: ``value`` is something else than a ``kind`` (``order="random"``); the
            message shows the call that was probably meant.
    """
    check_instance(name, value, kind, _EXAMPLES[name])
    return kind() if value is None else value


#: How each config argument of the Loader is made, for the error of a wrong one.
_EXAMPLES = {
    "order": "OrderConfig(mode='random')",
    "world": "World(rank=0, world_size=2)",
    "decode": "DecodeConfig(method='process')",
    "autotune": "AutotuneConfig(max_threads=8)",
    "cache": "CacheConfig(dir='/local/cache')",
}


class LoaderOptions(TypedDict, total=False):
    """The :class:`stoker.Loader` arguments that the framework adapters pass through, typed,
    so that a misspelt or stale option fails type checking and, at run time, the Loader's
    own keyword check. See :class:`stoker.Loader` for each."""

    transform: Any
    seed: int | None
    drop_last: bool | Literal["ranks"]
    order: OrderConfig | None
    world: World | None
    decode: DecodeConfig | None
    prefetch: int | Literal["auto"]
    autotune: AutotuneConfig | None
    cache: CacheConfig | None
    storage_options: Mapping[str, Any] | None


class AdapterOptions(LoaderOptions, total=False):
    """What the framework adapters take besides their own settings: the Loader's
    (:class:`LoaderOptions`) and :class:`~stoker.TokenLoader`'s sequence settings. With
    ``seq_len`` the source is read as token sequences of that length (``documents``:
    add document boundaries; ``dtype``: of ``input_ids``, ``labels`` and ``targets``;
    ``packing``, ``pad_id`` and ``packing_window``: best-fit packing), as
    :class:`~stoker.pipeline.token_batcher.TokenConfig` says."""

    seq_len: int
    documents: bool
    dtype: str
    packing: str | None
    pad_id: int | None
    packing_window: int
