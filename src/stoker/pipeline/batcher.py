"""Batcher: what the Loader asks of the stage that turns a batch's raw units into a batch.

A source makes the batcher of its units (:meth:`~stoker.pipeline.source.Source.make_batcher`):
:class:`~stoker.pipeline.batching.BatchAssembler` decodes samples and windows on threads
or worker processes; :class:`~stoker.pipeline.token_batcher.TokenBatcher` casts token
sequences in the loader's thread. The Loader and
:class:`~stoker.pipeline.epoch_run.EpochRun` use only this protocol, never the classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stoker.core.metrics import Stages
from stoker.pipeline.config import DecodeConfig
from stoker.pipeline.pending import PendingBatch


@dataclass(frozen=True, slots=True, kw_only=True)
class BatcherSettings:
    """What a source needs to make the batcher of its units.

    Attributes:
        transform: The Loader's ``transform`` (None: none).
        seed: Seed of the augmentations.
        decode: Decode threads or processes and what an undecodable unit does.
        stages: Where the batcher's stages are timed.
        threads: Decode threads (or processes) to start with.
    """

    transform: Any
    seed: int
    decode: DecodeConfig
    stages: Stages
    threads: int


class DecodeWorkers(Protocol):
    """The threads (or worker processes) a batcher decodes on."""

    @property
    def threads(self) -> int:
        """Threads (or processes) decoding now."""
        ...

    @property
    def resizable(self) -> bool:
        """Whether :meth:`resize` changes the count (threads, not processes)."""
        ...

    def start_workers(self, *, batch_size: int, depth: int) -> None:
        """Start them unless running (``depth``: batches decoding at once)."""
        ...

    def resize(self, threads: int) -> None:
        """Decode on ``threads`` from the next batch on."""
        ...

    def close(self) -> None:
        """Stop them; :meth:`start_workers` starts them anew."""
        ...


class Batcher(Protocol):
    """Turns the raw units of a batch (a source's ``read_async``) into the batch dict."""

    @property
    def workers(self) -> DecodeWorkers | None:
        """What it decodes on; None where batches are assembled in the loader's thread
        (nothing to start, resize or stop)."""
        ...

    def start(self, ids: np.ndarray, raw: list[dict[str, Any]], epoch: int) -> PendingBatch:
        """Start a batch of units ``ids`` (their raw dicts ``raw``) of ``epoch``."""
        ...

    def finish(self, pending: PendingBatch, skipped: list[tuple[str, str]]) -> dict[str, Any]:
        """The batch of :meth:`start`, once ready; ``(key, reason)`` of each unit left out
        appended to ``skipped``."""
        ...
