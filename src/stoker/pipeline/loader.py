"""Loader: from a packed dataset to batches, with prefetch, parallel decode and resume.

The read path, for one rank (and one loader worker), each step in its own module:

1. **plan** (:mod:`~stoker.pipeline.plan`, :mod:`~stoker.pipeline.order`): the epoch's
   order, this rank's share, cut into batches and the chunks they are fetched in; pure.
2. **prefetch** (:mod:`~stoker.pipeline.prefetch`): chunks of one read group (one ranged
   GET per block) in the order they are first needed, ``prefetch`` chunks ahead, on the
   store's I/O engine, through an optional in-memory cache.
3. **decode**: the source's :class:`~stoker.pipeline.batcher.Batcher` makes each batch
   (images decoded on a thread pool into a preallocated array; token rows cast).
4. **deliver**: the batch to the caller; skips held to a budget (:mod:`.skips`), counters.

Resume state is a few integers (:meth:`Loader.state_dict`); what is not restored is said
in :meth:`Loader.load_state_dict`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from stoker.core.metrics import Stage, Stages, TraceEvent
from stoker.pipeline.autotune import AutotuneConfig, Autotuner, default_threads
from stoker.pipeline.batcher import BatcherSettings
from stoker.pipeline.config import (
    BLOCK_PAGE_BYTES,
    SAMPLE_PAGE_BYTES,
    CacheConfig,
    DecodeConfig,
    check_loader_arguments,
    config_or_default,
)
from stoker.pipeline.epoch_run import EpochRun
from stoker.pipeline.loader_resume import resume_at
from stoker.pipeline.mixed_source import bind_mix, mix_state
from stoker.pipeline.mixing import SourceShare
from stoker.pipeline.order import EpochOrder, OrderConfig, Segment
from stoker.pipeline.plan import (
    DropLast,
    EpochPlan,
    Partition,
    loader_drop_last,
    log_padding,
    resolve_order,
    warn_if_small,
)
from stoker.pipeline.prefetch import Prefetcher
from stoker.pipeline.run_starter import Place, RunStarter
from stoker.pipeline.skips import SkipBudget
from stoker.pipeline.sources import SourceLike, mixed_order, open_source
from stoker.pipeline.stats import LoaderStats, ProgressLog
from stoker.pipeline.tokens import first_batch_apart
from stoker.pipeline.world import World

logger = logging.getLogger(__name__)


class Loader:
    """Batches from a packed dataset, for any training loop.

    The common call is short; each group of finer settings is one frozen config object::

        loader = Loader("s3://bucket/train", batch_size=256, transform=RandomResizedCrop(224),
                        seed=0)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                ...  # batch["image"]: (256, 224, 224, 3) uint8; batch["label"]: (256,) int64

    Args:
        source: Dataset URL or local path (or an opened
            :class:`~stoker.format.reader.ShardDataset`); a
            :class:`~stoker.pipeline.config.SourceConfig` to mix datasets, read windows of
            records, attach side tables or cut token sequences; or a prebuilt
            :mod:`~stoker.pipeline.sources` source.
        batch_size: Samples (or windows) per batch.
        transform: A built-in transform (``RandomResizedCrop``, ``CenterCrop``, ``Resize``:
            images come out as one ``(N, H, W, 3)`` uint8 array), any callable taking a
            ``PIL.Image`` (results stacked when they are equal-shape arrays), or None
            (full-size arrays, as a list).
        seed: Seed of the order and of the augmentations (0 if neither this nor
            ``order.seed`` is given; giving both, different, is an error).
        drop_last: Drop the last incomplete batch, and even ranks out by dropping samples
            rather than padding with repeats; ``"ranks"``: only the latter.
        order: Shuffle settings (:class:`~stoker.pipeline.order.OrderConfig`): mode
            (``"none"`` for no shuffle), seed, block, group and window sizes; unset ones
            are derived from the data (:func:`~stoker.pipeline.plan.resolve_order`).
            ``exact=True``: every unit once over the ranks, and each batch has a ``real``
            field (docs/evaluation.md).
        world: This rank and loader worker (:class:`~stoker.pipeline.world.World`);
            default rank 0 of 1. Worker ``w`` of ``num_workers`` makes batches
            ``w, w + num_workers, ...`` of its rank's epoch (counted from the resume point);
            one of several decodes the next epoch's batches only when asked for them.
        decode: Decode threads or processes, the decompression-bomb guard, what an undecodable
            sample does, its budget (:class:`~stoker.pipeline.config.DecodeConfig`).
        prefetch: Read groups held ahead (in flight, or in and not yet decoding), or
            ``"auto"``: start with enough for two batches and deepen while the pipeline
            waits on the store, within the memory budget of ``autotune``.
        autotune: Budgets (most threads, most bytes held ahead) and pace of the autotuner
            (:class:`~stoker.pipeline.autotune.AutotuneConfig`).
        cache: A node-local disk cache and an in-memory cache
            (:class:`~stoker.pipeline.config.CacheConfig`).
        storage_options: See :func:`stoker.open_store`.

    Attributes:
        read_ahead: Whether an epoch's end starts the next epoch (true): its first read
            groups read and first batches decoded, so iterating again (``set_epoch`` or not)
            does not stall. A loader run once reads that in vain: set it false where one
            epoch's reads are counted.
        skips: The samples skipped in the epoch under way, held to ``decode``'s failure
            budget (:class:`~stoker.pipeline.skips.SkipBudget`).

    Raises:
        TypeError: A setting of the wrong type (``order="random"``, ``drop_last="no"``).
        ValueError: A setting out of range, or two that contradict each other.
    """

    def __init__(
        self,
        source: SourceLike,
        *,
        batch_size: int,
        transform: Any = None,
        seed: int | None = None,
        drop_last: DropLast = False,
        order: OrderConfig | None = None,
        world: World | None = None,
        decode: DecodeConfig | None = None,
        prefetch: int | Literal["auto"] = "auto",
        autotune: AutotuneConfig | None = None,
        cache: CacheConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        check_loader_arguments(batch_size=batch_size, prefetch=prefetch, transform=transform)
        order = config_or_default("order", order, OrderConfig)
        decode = config_or_default("decode", decode, DecodeConfig)
        cache = config_or_default("cache", cache, CacheConfig)
        autotune = config_or_default("autotune", autotune, AutotuneConfig)
        self.stages = Stages()
        page = SAMPLE_PAGE_BYTES if order.mode == "random" else BLOCK_PAGE_BYTES
        with self.stages.time(Stage.INDEX):
            self.source = open_source(
                source, storage_options=storage_options, cache=cache, page_bytes=page
            )
        self.dataset = self.source.datasets[0]
        units, unit_bytes = self.source.units(), self.source.unit_bytes()
        order = self.source.order_defaults(order, units=units, unit_bytes=unit_bytes)
        self.order_config = resolve_order(
            order, seed=seed, units=units, unit_bytes=unit_bytes, shuffled=self.source.shuffled()
        )
        self.batch_size = batch_size
        self.transform = transform
        self.world = config_or_default("world", world, World)
        self.rank, self.world_size = self.world.rank, self.world.world_size
        self.drop_last = loader_drop_last(self.order_config, drop_last)
        self._partition = Partition(self.order_config, self.world, batch_size, self.drop_last)
        bind_mix(self.source, self.world.world_size, batch_size)  # a schedule counts steps
        warn_if_small(units, world=self.world, batch_size=batch_size, url=self.source.url)
        self.num_threads = decode.threads if isinstance(decode.threads, int) else default_threads()
        # Read groups ahead: enough for two batches, at least two (past the window's `hold`).
        group, hold = self.order_config.group_samples, self.order_config.window or 1
        self.prefetch = int(prefetch) if prefetch != "auto" else max(2, -(-2 * batch_size // group))
        # Batches decoding at once: fixed, so process mode's shared-memory slots suffice.
        self._decode_depth = self.prefetch + 1
        self._tuner = Autotuner(
            threads=self.num_threads,
            prefetch=self.prefetch,
            group_bytes=group * unit_bytes,
            tune_threads=decode.threads == "auto" and decode.method == "thread",
            tune_prefetch=prefetch == "auto",
            config=autotune,
            in_flight=self._decode_depth,
        )
        self._prefetcher = Prefetcher(
            self.source, stages=self.stages, memory_bytes=cache.memory_bytes, hold=hold
        )
        self._batches = self.source.make_batcher(
            BatcherSettings(
                transform=transform,
                seed=self.order_config.seed_value,
                decode=decode,
                stages=self.stages,
                threads=self.num_threads,
            )
        )
        self.epoch = 0
        self._position = 0  # batches of this rank's epoch already delivered
        self._segments: list[Segment] = []  # earlier world sizes in this epoch
        self._orders: dict[int, EpochOrder] = {}  # this epoch's and the next (read-ahead)
        self._stats = LoaderStats()
        self.skips = SkipBudget(decode, source=self.source, epoch_samples=self._epoch_samples)
        self.read_ahead = True
        self._progress = ProgressLog(logger)
        self._runs = self._run_starter()

    def _run_starter(self) -> RunStarter:
        """Which run an iteration takes: the read-ahead's, start()'s, or a new one."""
        return RunStarter(
            plan=self._plan,
            prefetcher=self._prefetcher,
            batches=self._batches,
            batch_size=self.batch_size,
            depth=self._decode_depth,
            on_drained=self._read_ahead,
        )

    # -- plan ------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at its beginning (unless a restored state is pending for it);
        a completed epoch moves on to the next by itself."""
        if epoch != self.epoch:
            self.epoch, self._position, self._segments = epoch, 0, []

    def _order(self, epoch: int | None = None) -> EpochOrder:
        epoch = self.epoch if epoch is None else epoch
        if epoch not in self._orders:  # asked for by iteration, stats() and the read-ahead
            self._orders = {e: o for e, o in self._orders.items() if e >= self.epoch}
            self._orders[epoch] = self.source.epoch_order(self.order_config, epoch)
        return self._orders[epoch]

    def _plan(self, epoch: int, position: int = 0, segments: Sequence[Segment] = ()) -> EpochPlan:
        plan = self._partition.plan(self._order(epoch), position, segments)
        return first_batch_apart(plan) if self.source.cut_first_batch else plan

    def mix_shares(self) -> tuple[SourceShare, ...]:
        """What each source of a mix gives this epoch (samples, share, repeats).

        Raises:
            ValueError: The loader reads a single source.
        """
        return mixed_order(self.source, self.order_config, self.epoch).shares

    def batches_per_epoch(self) -> int:
        """Batches this rank delivers in a full epoch (the same on every rank; with
        ``OrderConfig(exact=True)``, within one)."""
        return self._partition.batches(self._order())

    def __len__(self) -> int:
        return self.batches_per_epoch()

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the run is: a few integers (``skipped``: the epoch's so far), segments, and
        for a mix each source's place (``mix``, see :meth:`load_state_dict`)."""
        return {
            "epoch": self.epoch,
            "batches": self._position,
            "batch_size": self.batch_size,
            "seed": self.order_config.seed,
            "world_size": self.world.world_size,
            "segments": [[s.world_size, s.consumed] for s in self._segments],
            "skipped": self.skips.count_in(self.epoch),
            **mix_state(self.source, self.order_config, self.epoch, self._position, self._segments),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` stopped, with any number of threads or workers.

        With the same world size, the next batch is the one after the last delivered. With a
        different world size, the samples the old ranks consumed are removed from the epoch
        and the rest is partitioned over the new ranks: nothing repeated, nothing skipped.
        A mix's state also holds each source's place (``mix``), so that a loader with other
        weights, stages or sources goes on from them (:mod:`stoker.pipeline.mix_resume`).
        Not restored: samples fetched or decoded ahead but not delivered (they are fetched
        again) and the in-memory cache.

        Raises:
            TypeError: A field of the wrong type.
            ValueError: A field missing, unknown, out of range or past the epoch's end,
                another seed or batch size than the loader's, or a mix's place that cannot
                be honoured (a source whose size changed, named).
        """
        point = resume_at(self.source, state, self._partition, self._order, self._replanned)
        self.epoch, self._position, self._segments = point.epoch, point.position, point.segments
        self.skips.restart(point.epoch, int(state.get("skipped", 0)))  # its count goes on
        logger.info("resuming epoch %d at batch %d", point.epoch, point.position)

    def _replanned(self) -> None:
        """A resumed mix changed its orders: nothing planned or made ahead holds."""
        self._orders = {}
        self._runs.close()

    # -- observe ---------------------------------------------------------------------------

    def trace(self, *, max_events: int = 200_000) -> None:
        """Keep a timeline of the last ``max_events`` stage runs (:meth:`events`)."""
        self.stages.start_tracing(max_events)

    def events(self) -> list[TraceEvent]:
        """The timeline kept since :meth:`trace` (empty if it was never called)."""
        return self.stages.events()

    def log_every(self, seconds: float | None) -> None:
        """Log a one-line summary at INFO every ``seconds`` while iterating; None stops it."""
        if seconds is not None and seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        self._progress.every_s = seconds

    def stats(self) -> LoaderStats:
        """A snapshot of the loader's counters."""
        cache = self._prefetcher.cache
        return self._stats.snapshot(
            stages=self.stages.snapshot(),
            epoch_samples=self._epoch_samples(),
            settings=(self.num_threads, self.prefetch, self._tuner.state),
            stores=[dataset.store for dataset in self.source.datasets],
            memory_cache_hits=cache.hits if cache is not None else 0,
        )

    def _epoch_samples(self) -> int:
        return self._partition.units(self._order())

    # -- iterate: plan -> prefetch -> decode -> deliver --------------------------------------

    def start(self) -> None:
        """Make the next iteration's first batch now, on a thread, then fetch ``prefetch``
        read groups ahead, while the caller goes on (loads a model); iterating takes them.
        After :meth:`load_state_dict`, or on a fresh loader; again, a no-op. Order, batches
        and state are those without it; :meth:`ready` says when the first batch is made."""
        self._runs.start(self._place(), self.prefetch, self._stats.skipped, self.skips)

    def ready(self, timeout_s: float | None = 0.0) -> bool:
        """Whether :meth:`start`'s first batch is made (or failed: iterating raises why),
        waiting at most ``timeout_s`` seconds (None: until it is); False without start."""
        return self._runs.ready(self._place(), timeout_s)

    def _place(self) -> Place:
        return Place(self.epoch, self._position, tuple(self._segments))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        run = self._runs.take(self._place())
        log_padding(run.plan, self.epoch, self.world)
        self._stats.padded += run.plan.padded
        return self._run(run)

    def _run(self, run: EpochRun) -> Iterator[dict[str, Any]]:
        resumed = time.perf_counter()
        while run.left:
            run.stream.depth = self.prefetch
            skipped, budget = self._stats.skipped, self.skips
            number, batch = run.next_batch(self._batches, self._decode_depth, skipped, budget)
            now = self._delivered(number, batch, resumed)
            run.stream.delivering = True
            run.start_ready(self._batches, self._decode_depth)  # busy while the caller steps
            if not run.pending and self.world.num_workers == 1:  # the next epoch's decodes
                self._runs.start_next(self._decode_depth - len(run.decodes))
            yield batch
            run.check_here()  # a forked child would wait forever for the parent's decodes
            resumed = time.perf_counter()
            self.stages.record(Stage.CONSUMER_STEP, resumed - now, start_s=now, lane="consumer")
        # The epoch is over: the next iteration, and a state saved now, start the next one.
        self.epoch, self._position, self._segments = self.epoch + 1, 0, []

    def lead_next_epoch(self, threads: int) -> None:
        """Decode the next iteration's first batch alone, on ``threads`` threads."""
        self._runs.lead = threads

    def _read_ahead(self) -> None:
        """Every read of this epoch is under way: start the next one (``read_ahead``)."""
        if self.read_ahead and not self._segments:
            self._runs.read_ahead(self.epoch + 1)  # this epoch's number until it ends

    def _delivered(self, number: int, batch: dict[str, Any], resumed: float) -> float:
        """Count batch ``number`` as delivered; let the tuner and the log see it."""
        items = len(batch["index"])
        self._stats.batches += 1
        self._stats.samples += items
        self._position = number + 1
        now = time.perf_counter()
        self.stages.record(Stage.CONSUMER_WAIT, now - resumed, start_s=resumed, items=items)
        self._progress.maybe_log(now, self._stats.samples, self.stats)
        tuner = self._tuner
        if not tuner.settled:
            tuner.observe(now, self._stats.samples, self.stages.seconds(Stage.WAIT_FETCH))
            self.prefetch, self.num_threads = tuner.prefetch, tuner.threads
            if (workers := self._batches.workers) is not None:
                workers.resize(tuner.threads)
        return now

    def close(self) -> None:
        """Stop the decode threads (or processes) and close the disk cache's files."""
        self._prefetcher.drop_read_ahead()
        self._runs.close()
        if (workers := self._batches.workers) is not None:
            workers.close()
        for dataset in self.source.datasets:
            if dataset.store.cache is not None:
                dataset.store.cache.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
