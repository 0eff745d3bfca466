"""PendingBatch: a batch between the start of its assembly and its delivery."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class PendingBatch:
    """A batch whose decoding was submitted."""

    ids: np.ndarray
    raw: list[dict[str, Any]]
    out: np.ndarray | None
    tasks: list[Future[list[tuple[int, Any]]]]
    slot: int | None = None  # process mode: the batch's arena slot
    process_tasks: list[int] = field(default_factory=list)
