"""The failure budget: samples skipped in an epoch, counted, written down and bounded.

With ``DecodeConfig(on_error="skip")`` an undecodable sample leaves its batch and is
listed in :meth:`stoker.Loader.stats`. :class:`SkipBudget` also counts the skips of the
epoch under way on this rank (the count a resumed run restores from its state), appends
each to ``DecodeConfig.skipped_file`` as a JSON line (:func:`append_skipped`) and stops
with :class:`~stoker.errors.SkipBudgetError` once the count passes
``DecodeConfig.max_skipped``. ``TorchLoader`` keeps one in the training process and feeds
it what each DataLoader worker skipped (:meth:`SkipBudget.worker_reported`), so the budget
holds over every worker of the rank.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stoker.errors import SkipBudgetError
from stoker.pipeline.config import DecodeConfig

#: Skipped samples named in the message of a :class:`~stoker.errors.SkipBudgetError`.
SHOWN_IN_ERROR = 5


def budget_limit(max_skipped: int | float, epoch_samples: int) -> int:
    """The most samples an epoch of ``epoch_samples`` may skip under ``max_skipped`` (a
    count, or a share in (0, 1) rounded down)."""
    if isinstance(max_skipped, float):
        return math.floor(max_skipped * epoch_samples)
    return int(max_skipped)


def skipped_ids(ids: np.ndarray, delivered: np.ndarray) -> list[int]:
    """The ids of a batch's units (in order) that its delivered ``index`` lacks: the skipped
    ones (a unit repeated to pad a rank counts once per appearance)."""
    left = Counter(np.asarray(delivered).tolist())
    missing = []
    for unit in np.asarray(ids).tolist():
        if left[unit]:
            left[unit] -= 1
        else:
            missing.append(int(unit))
    return missing


def append_skipped(path: str | os.PathLike[str], records: Sequence[dict[str, Any]]) -> None:
    """Append each record to ``path`` as one JSON line, each in one ``write`` to a file
    opened for appending (lines of several processes do not interleave)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for record in records:
            os.write(fd, (json.dumps(record, ensure_ascii=False) + "\n").encode())
    finally:
        os.close(fd)


class SkipBudget:
    """The skips of the epoch under way on one rank, held to ``max_skipped``.

    Args:
        decode: Its ``max_skipped`` (a count, a share of the epoch in (0, 1), or None:
            only counted) and ``skipped_file`` (where each skip is appended, or None).
        source: What the loader reads (its ``url`` for messages; ``shard_of`` each skip's
            shard).
        epoch_samples: The rank's samples in the epoch under way (asked for a share's
            limit by :meth:`took`; :meth:`worker_reported` reads them from the stats).
    """

    def __init__(
        self,
        decode: DecodeConfig,
        *,
        source: Any,
        epoch_samples: Callable[[], int] | None = None,
    ) -> None:
        self.url: str = source.url
        self.source = source
        self.max_skipped = decode.max_skipped
        self.skipped_file = decode.skipped_file
        self.epoch_samples = epoch_samples or (lambda: 0)
        self.epoch = 0  # the epoch counted
        self.count = 0  # skipped in it, those before a resume point included
        self.restored = 0  # of those, counted before the resume point
        self.listed: list[tuple[str, str]] = []  # this epoch's seen here, in order
        #: This epoch's skips seen here, as the skipped file's records, in order.
        self.records: list[dict[str, Any]] = []
        self._workers: dict[int, int] = {}  # each worker's count in its last state

    def count_in(self, epoch: int) -> int:
        """Samples skipped in ``epoch`` so far (0 for one not begun)."""
        return self.count if epoch == self.epoch else 0

    def restart(self, epoch: int, count: int = 0) -> None:
        """Count ``epoch`` from ``count`` samples skipped already (a resumed state's)."""
        self.epoch, self.count, self.restored = epoch, count, count
        self.listed, self.records = [], []
        self._workers = {}

    def took(
        self,
        skipped: Sequence[tuple[str, str]],
        ids: np.ndarray,
        batch: dict[str, Any],
        epoch: int,
    ) -> None:
        """Count the skips of a batch, write them down, and stop past the budget (the
        batch is then not counted: the state stays the one before it).

        Args:
            skipped: Their ``(key, reason)``, in order.
            ids: The batch's unit ids, as planned.
            batch: The batch as assembled (its ``index`` lacks the skipped ones).
            epoch: The epoch.

        Raises:
            SkipBudgetError: More skipped this epoch than the budget allows.
        """
        if epoch != self.epoch:
            self.restart(epoch)
        if not skipped:
            return
        units: list[int | None] = list(skipped_ids(ids, batch["index"]))
        units += [None] * (len(skipped) - len(units))  # one id per skip; else unnamed
        records = [
            {
                "key": key,
                "shard": None if unit is None else self.source.shard_of(unit),
                "reason": reason,
                "epoch": epoch,
                "url": self.url,
            }
            for (key, reason), unit in zip(skipped, units[: len(skipped)], strict=True)
        ]
        self._add(len(skipped), records, epoch, self.epoch_samples)

    def worker_reported(
        self,
        worker: int,
        count: int,
        records: Sequence[dict[str, Any]],
        *,
        epoch: int,
        epoch_samples: int,
    ) -> None:
        """Take what a DataLoader worker sent with a batch: ``count``, skipped this epoch by
        its loader (the resumed count included; its state's ``skipped``), and ``records``,
        those of the batch (its loader's ``records`` since its last batch), written to the
        skipped file here; ``epoch_samples``: the rank's (its stats').

        Raises:
            SkipBudgetError: More skipped this epoch, over every worker, than the budget
                allows.
        """
        if epoch != self.epoch:
            self.restart(epoch)
        new = count - self._workers.get(worker, self.restored)
        if new > 0:
            self._add(new, records, epoch, lambda: epoch_samples)
        self._workers[worker] = count

    def _add(
        self,
        new: int,
        records: Sequence[dict[str, Any]],
        epoch: int,
        epoch_samples: Callable[[], int],
    ) -> None:
        """Write down ``new`` skips (``records``), and count them unless that is past the
        budget.

        Raises:
            SkipBudgetError: Naming the count, the budget and the first skipped samples.
        """
        if self.skipped_file is not None and records:
            append_skipped(self.skipped_file, records)
        count, pairs = self.count + new, [(r["key"], r["reason"]) for r in records]
        self._check(count, pairs, epoch, epoch_samples)
        self.count = count
        self.listed += pairs
        self.records += records

    def _check(
        self,
        count: int,
        new: list[tuple[str, str]],
        epoch: int,
        epoch_samples: Callable[[], int],
    ) -> None:
        budget = self.max_skipped
        if budget is None:
            return
        samples = epoch_samples() if isinstance(budget, float) else 0
        limit = budget_limit(budget, samples)
        if count <= limit:
            return
        listed = [*self.listed, *new]
        allowed = (
            f"max_skipped={budget}, {limit} of the rank's {samples} samples"
            if isinstance(budget, float)
            else f"max_skipped={budget}"
        )
        shown = "; ".join(f"{key!r}: {reason}" for key, reason in listed[:SHOWN_IN_ERROR])
        more = len(listed) - SHOWN_IN_ERROR
        before = (
            f" ({self.restored} of them before the resume point, counted but not listed)"
            if self.restored
            else ""
        )
        where = f"; every one in {os.fspath(self.skipped_file)}" if self.skipped_file else ""
        raise SkipBudgetError(
            f"{self.url}: epoch {epoch}: {count} samples skipped{before}, more than "
            f"{allowed} allows; stopping. The first: {shown}"
            + (f"; and {more} more" if more > 0 else "")
            + f" (all of them in the error's .skipped{where})",
            listed,
        )
