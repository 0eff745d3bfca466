"""Loader: from a packed dataset to batches, with prefetch, parallel decode and resume.

The read path, for one rank (and one loader worker):

1. :func:`~stoker.pipeline.order.epoch_order` and :func:`~stoker.pipeline.order.assign`
   give this rank's samples for the epoch; they are cut into batches.
2. The stream is fetched in chunks of one read group (``block_size * group_blocks``
   samples, one coalesced ranged GET per block), ``prefetch`` chunks ahead, on the store's
   I/O engine, through an optional in-memory cache.
3. Each batch's samples are decoded and transformed by a thread pool (the decoders release
   the GIL) straight into a preallocated ``(N, H, W, 3)`` uint8 array
   (:class:`~stoker.pipeline.batching.BatchAssembler`).

Resume state is a few integers (:meth:`Loader.state_dict`); what is not restored is said
in :meth:`Loader.load_state_dict`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from stoker.core.metrics import Stages, StageTotals, TraceEvent, merge_snapshots
from stoker.core.units import format_bytes
from stoker.format.reader import ShardDataset
from stoker.pipeline.autotune import AutotuneConfig, Autotuner, default_threads
from stoker.pipeline.batching import BatchAssembler, PendingBatch
from stoker.pipeline.cache import SampleCache
from stoker.pipeline.decode import DEFAULT_MAX_PIXELS
from stoker.pipeline.mixing import MixConfig, SourceShare
from stoker.pipeline.order import EpochOrder, OrderConfig, Segment, assign, consumed
from stoker.pipeline.sources import (
    CACHE_PAGE_BYTES,
    MixedSource,
    Source,
    WindowSource,
    block_size_for,
    open_source,
)
from stoker.pipeline.stats import LoaderStats
from stoker.pipeline.windows import WindowConfig
from stoker.pipeline.workers import SampleDecoder
from stoker.pipeline.world import World
from stoker.storage.cached import CachedStore
from stoker.storage.engine import IOEngine
from stoker.storage.open import engine_for

logger = logging.getLogger(__name__)


#: Read groups an epoch should have at least, so that ranks and workers all get a share.
MIN_GROUPS = 16


def _default_order(source: Source) -> OrderConfig:
    """Blocks of about 1 MB, and groups small enough that the epoch has ``MIN_GROUPS``.

    Depends on the dataset only (never on the world size), so the order stays the same
    when a run resumes on a different number of ranks.
    """
    block_size = block_size_for(source.unit_bytes())
    blocks = -(-source.units() // block_size)
    default = OrderConfig().group_blocks
    return OrderConfig(
        block_size=block_size, group_blocks=max(1, min(default, blocks // MIN_GROUPS))
    )


def _chunks_covering(chunks: list[np.ndarray], ids: np.ndarray) -> int:
    """How many leading chunks hold all of ``ids``."""
    wanted = {int(i) for i in ids}
    for count, chunk in enumerate(chunks, 1):
        wanted.difference_update(int(i) for i in chunk)
        if not wanted:
            return count
    return len(chunks)


@dataclass(slots=True)
class _ReadAhead:
    """Fetches of an epoch's first chunks, started before that epoch was asked for."""

    epoch: int
    chunks: list[np.ndarray]
    futures: list[Future[dict[int, dict[str, Any]]]]

    def matches(self, epoch: int, chunks: list[np.ndarray]) -> bool:
        return (
            epoch == self.epoch
            and len(chunks) >= len(self.chunks)
            and all(np.array_equal(a, b) for a, b in zip(self.chunks, chunks, strict=False))
        )


class Loader:
    """Batches from a packed dataset, for any training loop.

    Args:
        source: Dataset URL (or an opened :class:`~stoker.format.reader.ShardDataset`);
            several, with ``mix``; or a prebuilt :mod:`~stoker.pipeline.sources` source
            (for windows with sequence boundaries, say).
        batch_size: Samples (or windows) per batch.
        mix: Proportions or per-source counts of several datasets in each epoch
            (:class:`~stoker.pipeline.mixing.MixConfig`); batches then carry ``source``,
            and :meth:`mix_shares` says what each source gives an epoch.
        window: Make each unit a window of consecutive records
            (:class:`~stoker.pipeline.windows.WindowConfig`): ``image`` is then
            ``(N, size, H, W, 3)`` (one augmentation per window), ``label`` ``(N, size)``,
            and ``records`` holds the record ids. ``WindowConfig(sequences="dirname")``
            keeps windows within the folder their records were packed from.
        side_tables: Arrays with one row per sample that live once in the store, as
            ``{name: URL of a .npy file}``; each batch gets ``batch[name]`` with its rows,
            read by ranged GETs (through the disk cache, if any).
        shuffle: Shuffle each epoch (block shuffle, see :class:`OrderConfig`).
        seed: Seed of the order and of the augmentations.
        transform: A built-in transform (``RandomResizedCrop``, ``CenterCrop``, ``Resize``:
            images come out as one ``(N, H, W, 3)`` uint8 array), any callable taking a
            ``PIL.Image`` (results stacked when they are equal-shape arrays), or None
            (full-size arrays, as a list).
        storage_options: See :func:`stoker.open_store`.
        cache_dir: A node-local directory for a disk cache of shard bytes, shared by every
            process that names it (ranks, loader workers, other jobs); epochs after the
            first, and restarts, read from it instead of the store.
        cache_bytes: Bound of the disk cache (default: the dataset's size plus 10 %, or
            80 % of the free space under ``cache_dir`` if that is less).
        memory_cache_bytes: In-memory cache of fetched samples; with at least the dataset's
            size, epochs after the first need no requests.
        rank: This rank (default 0).
        world_size: Number of ranks (default 1).
        drop_last: Drop the last incomplete batch, and even ranks out by dropping samples
            rather than padding with repeats.
        num_threads: Decode threads, or ``"auto"``: start at the CPU count and let the
            autotuner (:mod:`stoker.pipeline.autotune`) adjust them.
        prefetch: Read groups fetched ahead, or ``"auto"``: start with enough for two
            batches and deepen while the pipeline waits on the store, within the memory
            budget of ``autotune``.
        autotune: Budgets (most threads, most bytes held ahead) and pace of the autotuner.
        order: Shuffle details (block size, group size, mode); ``shuffle`` and ``seed`` set
            its mode and seed. By default blocks hold about 1 MB (4 to 64 samples).
        on_error: ``"raise"`` on an undecodable sample, or ``"skip"`` it (counted and
            listed in :meth:`stats`; its batch is one shorter).
        worker: This loader worker (torch DataLoader worker id).
        num_workers: Loader workers of this rank; worker ``w`` makes batches ``w``,
            ``w + num_workers``, ...
        log_every_s: Log a one-line summary (images/s, input-bound share, dominant
            stage, requests) at INFO this often while iterating.
        method: Decode in ``"thread"``s (the default; the decoders release the GIL) or in
            worker ``"process"``es, for transforms written in Python that hold the GIL.
            Processes start with spawn, so ``transform`` must be picklable (a module-level
            function or class); results come back through shared memory (see
            :mod:`stoker.pipeline.workers`). ``num_threads`` is then the process count.
        max_pixels: Refuse (raise, or skip with ``on_error="skip"``) images declaring more
            pixels than this, before decoding them: a guard against decompression bombs.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | ShardDataset | Sequence[str | os.PathLike[str]] | Source,
        *,
        batch_size: int,
        mix: MixConfig | None = None,
        window: WindowConfig | None = None,
        side_tables: Mapping[str, str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        transform: Any = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
        memory_cache_bytes: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        num_threads: int | Literal["auto"] | None = "auto",
        prefetch: int | Literal["auto"] | None = "auto",
        autotune: AutotuneConfig | None = None,
        order: OrderConfig | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        worker: int = 0,
        num_workers: int = 1,
        log_every_s: float | None = None,
        method: Literal["thread", "process"] = "thread",
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if method not in ("thread", "process"):
            raise ValueError(f"method must be 'thread' or 'process', got {method!r}")
        if max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1, got {max_pixels}")
        if cache_bytes is not None and cache_dir is None:
            raise ValueError("cache_bytes bounds the disk cache: give cache_dir too")
        self.stages = Stages()
        mode = (order.mode if order else "blocks") if shuffle else "none"
        with self.stages.time("index"):
            self.source = open_source(
                source,
                storage_options=storage_options,
                mix=mix,
                window=window,
                side_tables=side_tables,
                cache=None
                if cache_dir is None
                # Random order reads one sample per request: small pages keep a cold read small.
                else (
                    Path(cache_dir),
                    cache_bytes,
                    128 << 10 if mode == "random" else CACHE_PAGE_BYTES,
                ),
            )
        self.dataset = self.source.datasets[0]
        self._last_order: tuple[int, EpochOrder] | None = None
        base = order or _default_order(self.source)
        self.order_config = OrderConfig(
            mode=mode,
            seed=seed,
            block_size=base.block_size,
            group_blocks=base.group_blocks,
        )
        self.batch_size = batch_size
        self.transform = transform
        self.world = World(
            rank=rank or 0, world_size=world_size or 1, worker=worker, num_workers=num_workers
        )
        self.rank, self.world_size = self.world.rank, self.world.world_size
        self.worker, self.num_workers = self.world.worker, self.world.num_workers
        self.drop_last = drop_last
        self.num_threads = num_threads if isinstance(num_threads, int) else default_threads()
        # Read groups in flight: enough for two batches ahead, at least two.
        group = self.order_config.block_size * self.order_config.group_blocks
        self.prefetch = (
            max(1, prefetch) if isinstance(prefetch, int) else max(2, -(-2 * batch_size // group))
        )
        # Batches decoding at once: fixed, so process mode's shared-memory slots suffice.
        self._decode_depth = self.prefetch + 1
        self._tuner = Autotuner(
            threads=self.num_threads,
            prefetch=self.prefetch,
            group_bytes=group * self.source.unit_bytes(),
            tune_threads=num_threads in ("auto", None) and method == "thread",
            tune_prefetch=prefetch in ("auto", None),
            config=autotune,
        )
        self.on_error = on_error
        self.cache = SampleCache(memory_cache_bytes) if memory_cache_bytes else None
        self.epoch = 0
        self._position = 0  # batches of this rank's epoch already delivered
        self._segments: list[Segment] = []  # earlier world sizes in this epoch
        self._stats = LoaderStats()
        self._epochs_run = 0  # whole epochs this loader has delivered
        self._ahead: _ReadAhead | None = None
        self.log_every_s = log_every_s
        self.method = method
        self._batches = BatchAssembler(
            SampleDecoder(transform, seed, max_pixels),
            stages=self.stages,
            url=self.source.url,
            extra_fields=self.source.extra_fields,
            # A unit is one image, or a window of `size` frames.
            unit_shape=(
                (self.source.window.size,) if isinstance(self.source, WindowSource) else ()
            ),
            threads=self.num_threads,
            method=method,
            on_error=on_error,
        )
        self._last_log = (time.perf_counter(), 0)  # (when, samples then)
        groups = self._order().groups
        if groups < self.world_size * self.num_workers and self.rank == 0 and self.worker == 0:
            logger.warning(
                "%s: %d read group(s) for %d rank(s) x %d worker(s): some get none of their "
                "own and repeat others' samples (or, with drop_last, get no batch); use a smaller "
                "OrderConfig(block_size=..., group_blocks=...)",
                self.source.url,
                groups,
                self.world_size,
                self.num_workers,
            )

    # -- order -----------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at its beginning (unless a restored state is pending for it)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._position = 0
            self._segments = []

    def _order(self, epoch: int | None = None) -> EpochOrder:
        epoch = self.epoch if epoch is None else epoch
        # One epoch's order is asked for at start-up, per iteration, by stats() and by the
        # read-ahead: computed once (it is a pure function of the epoch).
        if self._last_order is None or self._last_order[0] != epoch:
            self._last_order = (epoch, self.source.epoch_order(self.order_config, epoch))
        return self._last_order[1]

    def _share(self, epoch: int | None = None) -> np.ndarray:
        """This rank's samples of the current epoch (or, from its start, of ``epoch``)."""
        if epoch is not None:
            order = self._order(epoch)
            return assign(
                order, rank=self.rank, world_size=self.world_size, drop_last=self.drop_last
            ).samples
        order = self._order()
        exclude = (
            consumed(order, self._segments, drop_last=self.drop_last) if self._segments else None
        )
        share = assign(
            order,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
            exclude=exclude,
        )
        if share.padded and self.rank == 0:
            logger.info(
                "epoch %d: %d samples repeated per rank to even out %d ranks",
                self.epoch,
                share.padded,
                self.world_size,
            )
        self._stats.padded += share.padded
        return share.samples

    def mix_shares(self) -> tuple[SourceShare, ...]:
        """What each source of a mix gives this epoch (samples, share, repeats).

        Raises:
            ValueError: The loader reads a single source.
        """
        if not isinstance(self.source, MixedSource):
            raise ValueError("mix_shares() needs a loader over several datasets with mix=")
        return self.source.mixed_order(self.order_config, self.epoch).shares

    def batches_per_epoch(self) -> int:
        """Batches this rank delivers in a full epoch (the same on every rank)."""
        n = len(
            assign(
                self._order(), rank=self.rank, world_size=self.world_size, drop_last=self.drop_last
            ).samples
        )
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch()

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the run is: a few integers (and one pair per earlier world size)."""
        return {
            "epoch": self.epoch,
            "batches": self._position,
            "batch_size": self.batch_size,
            "seed": self.order_config.seed,
            "world_size": self.world_size,
            "segments": [[s.world_size, s.consumed] for s in self._segments],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` stopped, with any number of threads or workers.

        With the same world size, the next batch is the one after the last delivered. With a
        different world size, the samples the old ranks consumed are removed from the epoch
        and the rest is partitioned over the new ranks: nothing repeated, nothing skipped.
        Not restored: samples fetched or decoded ahead but not delivered (they are fetched
        again) and the in-memory cache.

        Raises:
            ValueError: The state was made with another seed or batch size.
        """
        if int(state["seed"]) != self.order_config.seed:
            raise ValueError(f"state has seed {state['seed']}, loader {self.order_config.seed}")
        if int(state["batch_size"]) != self.batch_size:
            raise ValueError(
                f"state has batch_size {state['batch_size']}, loader {self.batch_size}"
            )
        self.epoch = int(state["epoch"])
        segments = [Segment(int(w), int(c)) for w, c in state.get("segments", [])]
        done = int(state["batches"]) * self.batch_size
        if int(state["world_size"]) == self.world_size and not segments:
            self._segments = []
            self._position = int(state["batches"])
        else:
            self._segments = [*segments, Segment(int(state["world_size"]), done)]
            self._position = 0
        logger.info(
            "resuming epoch %d at batch %d (%d earlier segments)",
            self.epoch,
            self._position,
            len(self._segments),
        )

    def trace(self, *, max_events: int = 200_000) -> None:
        """Keep a timeline of the last ``max_events`` stage runs from now on.

        :meth:`events` returns it; ``stoker doctor --trace`` writes it as a Chrome trace.
        """
        self.stages.start_tracing(max_events)

    def events(self) -> list[TraceEvent]:
        """The timeline kept since :meth:`trace` (empty if it was never called)."""
        return self.stages.events()

    def stats(self) -> LoaderStats:
        """A snapshot of the loader's counters."""
        snapshot = LoaderStats(**{k: getattr(self._stats, k) for k in LoaderStats.__slots__})
        snapshot.skipped = list(self._stats.skipped)
        snapshot.stages = self.stages.snapshot()
        snapshot.epoch_samples = self.batches_per_epoch() * self.batch_size
        snapshot.threads, snapshot.prefetch = self.num_threads, self.prefetch
        tuner = self._tuner
        tuning = tuner.tune_threads or tuner.tune_prefetch
        snapshot.autotune = ("settled" if tuner.settled else "tuning") if tuning else "fixed"
        snapshot.requests = merge_snapshots(
            d.store.counters.snapshot() for d in self.source.datasets
        )
        snapshot.cache_hits = self.cache.hits if self.cache else 0
        store = self.dataset.store
        if isinstance(store, CachedStore):
            snapshot.disk_cache = store.cache.counters.snapshot()  # one cache for all datasets
        return snapshot

    def _retune(self, now: float) -> None:
        tuner = self._tuner
        if tuner.settled:
            return
        waited = self.stages.snapshot().get("wait.fetch", StageTotals()).seconds
        tuner.observe(now, self._stats.samples, waited)
        self.prefetch = tuner.prefetch
        self.num_threads = tuner.threads
        self._batches.resize(tuner.threads)

    def _maybe_log(self, now: float) -> None:
        if self.log_every_s is None or now - self._last_log[0] < self.log_every_s:
            return
        when, samples_then = self._last_log
        self._last_log = (now, self._stats.samples)
        stats = self.stats()
        busiest = max(
            ("fetch", "decode", "transform", "collate"),
            key=lambda name: stats.stages.get(name, StageTotals()).seconds,
        )
        logger.info(
            "%.0f images/s; waiting for input %.0f%% of the time; busiest stage %s; "
            "%d GETs, %s read",
            (self._stats.samples - samples_then) / (now - when),
            100 * stats.wait_share,
            busiest,
            stats.requests.get("requests.get", 0),
            format_bytes(stats.requests.get("bytes.read", 0)),
        )

    # -- iteration -------------------------------------------------------------------------

    def _plan(self, samples: np.ndarray, position: int) -> tuple[list[np.ndarray], list[int]]:
        """The epoch's batches, and the numbers of this worker's from ``position`` on."""
        bounds = list(range(0, len(samples), self.batch_size))
        batches = [samples[b : b + self.batch_size] for b in bounds]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        mine = list(range(self.worker, len(batches), self.num_workers))
        return batches, [b for b in mine if b >= position]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        batches, mine = self._plan(self._share(), self._position)
        self._batches.start_workers(batch_size=self.batch_size, depth=self._decode_depth)
        return self._run(batches, mine)

    def _fetch_plan(self, batches: list[np.ndarray], mine: list[int]) -> list[np.ndarray]:
        # Chunks of whole read groups, so each block is requested once.
        chunk = self.order_config.block_size * self.order_config.group_blocks
        if self.num_workers > 1:
            return [batches[b] for b in mine]
        stream = np.concatenate([batches[b] for b in mine]) if mine else np.zeros(0, np.int64)
        return [stream[i : i + chunk] for i in range(0, len(stream), chunk)]

    def _run(
        self,
        batches: list[np.ndarray],
        mine: list[int],
    ) -> Iterator[dict[str, Any]]:
        engine = engine_for(self.dataset.store)
        chunks = self._fetch_plan(batches, mine)
        fetches: deque[Future[dict[int, dict[str, Any]]]] = deque()
        next_chunk = 0
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.matches(self.epoch, chunks):
            fetches.extend(ahead.futures)  # read at the end of the last epoch
            next_chunk = len(ahead.futures)
        fetched: dict[int, dict[str, Any]] = {}
        # Padding can repeat a sample: keep it until its last use in this stream.
        uses = Counter(int(i) for b in mine for i in batches[b])
        decodes: deque[tuple[int, PendingBatch]] = deque()

        # Until the first batch is out, fetch only the chunks it needs: requests in flight
        # share the link, so fetching further ahead would only delay it.
        first_need = _chunks_covering(chunks, batches[mine[0]]) if mine else 0
        delivering = False

        def top_up_fetches() -> None:
            nonlocal next_chunk
            limit = self.prefetch if delivering else max(1, first_need)
            while next_chunk < len(chunks) and len(fetches) < limit:
                fetches.append(engine.submit(self._fetch(chunks[next_chunk])))
                next_chunk += 1
            if next_chunk == len(chunks) and len(fetches) < limit and self._ahead is None:
                self._read_ahead(engine)

        def missing(ids: np.ndarray) -> bool:
            while fetches and fetches[0].done():
                fetched.update(fetches.popleft().result())
            return any(int(i) not in fetched for i in ids)

        pending = deque(mine)
        resumed = time.perf_counter()
        while pending or decodes:
            while pending and len(decodes) < self._decode_depth:
                number = pending[0]
                ids = batches[number]
                top_up_fetches()
                if missing(ids):
                    if decodes:
                        break  # a batch is decoding: deliver it rather than wait here
                    while missing(ids):
                        top_up_fetches()
                        if not fetches:
                            raise RuntimeError("internal error: batch samples were never fetched")
                        with self.stages.time("wait.fetch"):
                            fetched.update(fetches.popleft().result())
                top_up_fetches()
                raw = [fetched[int(i)] for i in ids]
                for i in ids:
                    uses[int(i)] -= 1
                    if uses[int(i)] == 0:
                        del fetched[int(i)]
                decodes.append((number, self._batches.start(ids, raw, self.epoch)))
                pending.popleft()
            number, pending_batch = decodes.popleft()
            batch = self._batches.finish(pending_batch, self._stats.skipped)
            self._stats.batches += 1
            self._stats.samples += len(batch["label"])
            self._position = number + 1
            now = time.perf_counter()
            self.stages.record(
                "consumer.wait", now - resumed, start_s=resumed, items=len(batch["label"])
            )
            self._maybe_log(now)
            self._retune(now)
            delivering = True
            yield batch
            resumed = time.perf_counter()
            self.stages.record("consumer.step", resumed - now, start_s=now, lane="consumer")
        # The epoch is over: the next iteration starts the next one unless told otherwise.
        self._position = 0
        self._segments = []
        self._epochs_run += 1

    def _read_ahead(self, engine: IOEngine) -> None:
        """Start reading the next epoch's first batch while this one ends.

        Only for a loader that has already run a whole epoch (so it is being reused across
        epochs); used if the next iteration is epoch + 1 from its start, else dropped.
        """
        if self._epochs_run < 1 or self._segments:
            return
        epoch = self.epoch + 1
        batches, mine = self._plan(self._share(epoch), 0)
        chunks = self._fetch_plan(batches, mine)
        if not mine or not chunks:
            return
        count = _chunks_covering(chunks, batches[mine[0]])
        futures = [engine.submit(self._fetch(chunk)) for chunk in chunks[:count]]
        self._ahead = _ReadAhead(epoch, chunks[:count], futures)

    async def _fetch(self, ids: np.ndarray) -> dict[int, dict[str, Any]]:
        started = time.perf_counter()
        nbytes = 0
        found: dict[int, dict[str, Any]] = {}
        missing = []
        for i in (int(x) for x in ids):
            cached = self.cache.get(i) if self.cache else None
            if cached is not None:
                found[i] = cached
            elif i not in found:
                missing.append(i)
        unique = list(dict.fromkeys(missing))
        if unique:
            for i, sample in zip(unique, await self.source.read_async(unique), strict=True):
                found[i] = sample
                if self.cache is not None and "error" not in sample:
                    self.cache.put(i, sample)
            nbytes = self.source.nbytes(unique)
        self.stages.record(
            "fetch",
            time.perf_counter() - started,
            start_s=started,
            items=len(unique),
            nbytes=nbytes,
            lane="io",
        )
        return found

    def close(self) -> None:
        """Stop the decode threads (or processes) and close the disk cache's files.

        Iterating again starts them anew.
        """
        self._ahead = None
        self._batches.close()
        for dataset in self.source.datasets:
            if isinstance(dataset.store, CachedStore):
                dataset.store.cache.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
