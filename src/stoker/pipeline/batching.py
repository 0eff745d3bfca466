"""From fetched samples to a batch: parallel decode and transform, then collate.

:class:`BatchAssembler` is the Loader's decode side. :meth:`~BatchAssembler.start` cuts a
batch into one slice per decode thread (or worker process) and submits them;
:meth:`~BatchAssembler.finish` waits for them and assembles the batch dict, raising on an
undecodable sample or skipping it. Batches with a fixed output size are decoded straight
into one preallocated ``(N, *unit, H, W, 3)`` uint8 array, recycled once nothing else
refers to it (:class:`~stoker.pipeline.batch_arrays.BatchArrays`). It is the
:class:`~stoker.pipeline.batcher.Batcher` of samples and windows; token sequences have
:class:`~stoker.pipeline.token_batcher.TokenBatcher`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from stoker.core.metrics import Stage, Stages
from stoker.errors import StokerError
from stoker.pipeline.batch_arrays import BatchArrays
from stoker.pipeline.batcher import BatcherSettings
from stoker.pipeline.fields import MissingField, collate
from stoker.pipeline.pending import PendingBatch
from stoker.pipeline.source import Source, field_counts, stores_images
from stoker.pipeline.workers import (
    DEFAULT_SAMPLE_BYTES,
    ProcessDecoder,
    SampleDecoder,
    TransformTimer,
    slice_batch,
)

logger = logging.getLogger(__name__)

#: Samples failing in a row (every one skipped) after which the loader stops with an error.
MAX_SKIPPED_IN_A_ROW = 1000


class BatchAssembler:
    """Decodes batches on a thread pool (or worker processes) and collates them.

    Args:
        decoder: Decodes and transforms one sample.
        stages: Where decode, transform, collate and the wait for decoding are timed.
        url: The dataset, for error messages.
        extra_fields: Fields copied from the samples into the batch (side tables, ...).
        unit_shape: ``()`` for images, ``(size,)`` for windows of ``size`` records.
        threads: Decode threads (or processes).
        method: ``"thread"`` or ``"process"``.
        on_error: ``"raise"`` on an undecodable sample, or ``"skip"`` it.
    """

    def __init__(
        self,
        decoder: SampleDecoder,
        *,
        stages: Stages,
        url: str,
        extra_fields: tuple[str, ...],
        unit_shape: tuple[int, ...],
        threads: int,
        method: Literal["thread", "process"],
        on_error: Literal["raise", "skip"],
    ) -> None:
        self.decoder = decoder
        self.stages = stages
        self.url = url
        self.extra_fields = extra_fields
        self.unit_shape = unit_shape
        self.threads = threads
        self.method = method
        self.on_error = on_error
        self._fixed = (
            decoder.transform.output_size if decoder.planned and decoder.image_names else None
        )
        self._skipped_in_a_row = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pools_made = 0
        self._processes: ProcessDecoder | None = None
        self._workers_pid = os.getpid()  # the process whose threads (or processes) decode
        self._depth = 1  # batches decoding at once (start_workers says)
        self.arrays = BatchArrays(keep=4)

    @classmethod
    def for_source(
        cls,
        source: Source,
        settings: BatcherSettings,
        *,
        unit_shape: tuple[int, ...] = (),
        images: bool | None = None,
    ) -> BatchAssembler:
        """The assembler of a Loader's batches over ``source``'s samples (or windows of
        ``unit_shape`` records): an image through the transform where the samples have one
        (:func:`stores_images`, unless ``images`` says: a video clip's frames), every other
        field as ``settings.decode.fields`` says.

        Raises:
            ValueError: A transform for samples without images.
        """
        transform, decode = settings.transform, settings.decode
        stored = stores_images(source) if images is None else images
        if transform is not None and not stored:
            raise ValueError(
                f"{source.url}: a transform was given, but the samples have no image "
                f"(fields {sorted(field_counts(source) or {})}); leave transform=None"
            )
        # An image where the samples have one, unless a selection leaves it out (a
        # transform asks for it).
        fields = decode.fields
        chosen = fields.chosen()
        image = transform is not None or (stored if chosen is None else "image" in chosen)
        decoder = SampleDecoder(
            transform, settings.seed, decode.max_pixels, fields=fields, image=image
        )
        return cls(
            decoder,
            stages=settings.stages,
            url=source.url,
            extra_fields=source.extra_fields,
            unit_shape=unit_shape,
            threads=settings.threads,
            method=decode.method,
            on_error=decode.on_error,
        )

    @property
    def workers(self) -> BatchAssembler:
        """Its own threads (or processes): it starts, resizes and stops them."""
        return self

    @property
    def resizable(self) -> bool:
        """Whether :meth:`resize` changes the count (threads; processes keep theirs)."""
        return self.method == "thread"

    def start_workers(self, *, batch_size: int, depth: int) -> None:
        """Start the thread pool unless running (worker processes start with the first
        batch, which sizes their shared memory).

        Args:
            batch_size: Most samples per batch.
            depth: Batches decoding at once (process mode sizes its shared memory by it).
        """
        self._leave_a_parents_workers()
        if self._pool is None:
            self._pool = self._new_pool()
        # Every batch decoding, the one the consumer holds, and one more.
        self.arrays.keep = depth + 2
        self._depth = depth

    def _leave_a_parents_workers(self) -> None:
        # A process forked after the workers started: the parent's threads are not here (a
        # task given to its pool would never run) and its processes are not ours. Leave
        # them to the parent, untouched; this process starts its own.
        if self._workers_pid != os.getpid():
            self._pool, self._processes = None, None
            self._workers_pid = os.getpid()

    def _start_processes(self, ids: np.ndarray, raw: list[dict[str, Any]], epoch: int) -> None:
        """Start the worker processes, their shared memory sized by the first real batch:
        its length (an epoch of fewer samples than ``batch_size`` needs less), and each
        sample's output size (the transform's, or else the first sample's, decoded here)."""
        frames = math.prod(self.unit_shape)
        fixed = self._fixed
        sample_bytes = frames * fixed[0] * fixed[1] * 3 if fixed else DEFAULT_SAMPLE_BYTES
        if not fixed and raw:
            try:
                value, _ = self.decoder(int(ids[0]), epoch, raw[0])
            except Exception:  # the workers decode it again and report it, traceback and all
                value = None
            if isinstance(value, np.ndarray):
                sample_bytes = max(value.nbytes, 1)
        self._processes = ProcessDecoder(
            self.decoder,
            processes=self.threads,
            slots=self._depth + 1,
            batch_size=max(len(raw), 1),
            sample_bytes=sample_bytes,
            queue_depth=(self._depth + 1) * self.threads,
        )

    def resize(self, threads: int) -> None:
        """Decode with ``threads`` threads from the next batch on (thread mode)."""
        if threads == self.threads:
            return
        self.threads = threads
        if self._pool is not None:
            # A new pool of the new size; the old one finishes its tasks and goes.
            old, self._pool = self._pool, self._new_pool()
            old.shutdown(wait=False)

    def _new_pool(self) -> ThreadPoolExecutor:
        # Each pool its own thread names, so a timeline never mixes two pools' threads.
        self._pools_made += 1
        suffix = "" if self._pools_made == 1 else f"-{self._pools_made}"
        return ThreadPoolExecutor(self.threads, thread_name_prefix=f"stoker-decode{suffix}")

    def start(self, ids: np.ndarray, raw: list[dict[str, Any]], epoch: int) -> PendingBatch:
        """Submit a batch's decoding: one task per thread (or process), each a slice."""
        fixed = self._fixed
        out = self.arrays.take((len(raw), *self.unit_shape, *fixed, 3)) if fixed else None
        slices = slice_batch(len(raw), self.threads)
        if self.method == "process" and self._processes is None:
            self._start_processes(ids, raw, epoch)
        if self._processes is not None:
            slot = self._processes.acquire_slot()
            numbers = [
                self._processes.submit(slot, epoch, [(n, int(ids[n]), raw[n]) for n in part])
                for part in slices
            ]
            return PendingBatch(ids, raw, out, [], slot, numbers)
        pool = self._pool
        if pool is None:
            raise RuntimeError("internal error: decoding before start_workers()")
        tasks = [
            pool.submit(self._decode_slice, ids, epoch, raw, out, part.start, part.stop)
            for part in slices
        ]
        return PendingBatch(ids, raw, out, tasks)

    def finish(self, pending: PendingBatch, skipped: list[tuple[str, str]]) -> dict[str, Any]:
        """Wait for a batch's decoding and assemble it.

        Args:
            pending: From :meth:`start`.
            skipped: Where ``(key, reason)`` of each skipped sample is appended.

        Raises:
            ValueError: An undecodable sample, with ``on_error="raise"`` (a
                :class:`~stoker.errors.StokerError` subclass keeps its kind).
        """
        raw = pending.raw
        keep: list[int] = []
        images: list[Any] = []
        others: list[dict[str, Any]] = []
        with self.stages.time(Stage.WAIT_DECODE, items=len(raw)):
            done = self._collect(pending)
        started = time.perf_counter()
        skip_missing = self.decoder.fields.missing == "skip"
        for results in done:
            for n, result in results:
                if isinstance(result, ValueError):
                    if self.on_error == "raise" and not (
                        skip_missing and isinstance(result, MissingField)
                    ):
                        key = raw[n]["key"]
                        # Keep the error's kind (CorruptShardError, ...) for callers' except.
                        kind = type(result) if isinstance(result, StokerError) else ValueError
                        raise kind(f"{self.url}: sample {key!r}: {result}") from result
                    skipped.append((raw[n]["key"], str(result)))
                    continue
                images.append(result[0])
                others.append(result[1])
                keep.append(n)
        self._check_skips(len(raw), len(keep), skipped)
        batch: dict[str, Any] = {
            "label": np.array([raw[n]["label"] for n in keep], dtype=np.int64),
            "key": [raw[n]["key"] for n in keep],
            "index": np.asarray(pending.ids, dtype=np.int64)[keep],
        }
        for name in self.extra_fields:
            values = [raw[n][name] for n in keep]
            batch[name] = np.stack(values) if values else np.zeros(0)
        if self.decoder.image_names:
            batch["image"] = self._images(pending.out, images, keep, len(raw))
        pad = self.decoder.fields.pad
        for name in dict.fromkeys(name for fields in others for name in fields):
            values = [fields.get(name) for fields in others]
            try:
                batch.update(collate(name, values, pad=pad.get(name)))
            except ValueError as exc:
                raise ValueError(f"{self.url}: {exc}") from None
        self.stages.record(
            Stage.COLLATE, time.perf_counter() - started, start_s=started, items=len(keep)
        )
        return batch

    @staticmethod
    def _images(out: np.ndarray | None, images: list[Any], keep: list[int], count: int) -> Any:
        if any(image is None for image in images):  # missing="none": a list with its gaps
            return [
                None if image is None else out[n] if out is not None else image
                for n, image in zip(keep, images, strict=True)
            ]
        if out is not None:
            return out if len(keep) == count else out[keep]
        if images and all(isinstance(x, np.ndarray) and x.shape == images[0].shape for x in images):
            return np.stack(images)
        return images

    def _check_skips(self, count: int, kept: int, skipped: list[tuple[str, str]]) -> None:
        """Warn when a whole batch was skipped; stop after MAX_SKIPPED_IN_A_ROW samples in a
        row failed (a dataset that fails everywhere is not worth a silent epoch)."""
        if kept:
            self._skipped_in_a_row = 0
            return
        if not count:
            return
        self._skipped_in_a_row += count
        key, reason = skipped[-1]
        if self._skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise StokerError(
                f"{self.url}: the last {self._skipped_in_a_row} samples all failed and were "
                f"skipped; stopping. The last one, {key!r}: {reason}"
            )
        logger.warning(
            "%s: every sample of a batch of %d was skipped (the last, %r: %s)",
            self.url,
            count,
            key,
            reason,
        )

    def _collect(self, pending: PendingBatch) -> list[list[tuple[int, Any]]]:
        if self._processes is None or pending.slot is None:
            return [task.result() for task in pending.tasks]
        done = []
        try:
            for number in pending.process_tasks:
                results, decode_s, transform_s = self._processes.collect(number, pending.slot)
                items = len(results)
                self.stages.record(Stage.DECODE, decode_s, items=items, lane="processes")
                if transform_s:
                    self.stages.record(Stage.TRANSFORM, transform_s, items=items, lane="processes")
                if pending.out is not None:
                    for n, value in results:
                        if not isinstance(value, ValueError) and isinstance(value[0], np.ndarray):
                            pending.out[n] = value[0]
                done.append(results)
        finally:
            self._processes.release_slot(pending.slot)
        return done

    def _decode_slice(
        self,
        ids: np.ndarray,
        epoch: int,
        raw: list[dict[str, Any]],
        out: np.ndarray | None,
        first: int,
        stop: int,
    ) -> list[tuple[int, Any]]:
        started, cpu_started = time.perf_counter(), time.thread_time()
        results: list[tuple[int, Any]] = []
        # Only a user's callable is timed apart; a built-in transform is part of decoding.
        timer = None if self.decoder.planned else TransformTimer()
        decode = self.decoder
        for n in range(first, stop):
            try:
                value = decode(int(ids[n]), epoch, raw[n], None if out is None else out[n], timer)
                results.append((n, value))
            except ValueError as exc:
                results.append((n, exc))
        seconds = time.perf_counter() - started
        spent = timer.seconds if timer is not None else 0.0
        # Decoding in CPU seconds: a Python transform holding the GIL in another thread
        # stretches this thread's wall time, and must not be billed to the decoder.
        decode_cpu = time.thread_time() - cpu_started
        decode_cpu -= timer.cpu_seconds if timer is not None else 0.0
        self.stages.record(Stage.DECODE, decode_cpu, start_s=started, items=stop - first)
        if spent:  # drawn after the slice's decodes on a timeline
            self.stages.record(
                Stage.TRANSFORM, spent, start_s=started + seconds - spent, items=stop - first
            )
        return results

    def close(self) -> None:
        """Stop the decode threads (or processes); :meth:`start_workers` starts them anew."""
        self._leave_a_parents_workers()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._processes is not None:
            self._processes.close()
            self._processes = None
