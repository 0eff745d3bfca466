"""What the seed comparison (:func:`~stoker.profile.compare.compare_methods`) found: one
row of timings per method, and the table they print as."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareRow:
    """One method's timings.

    Attributes:
        method: What was done.
        setup_s: Work before the first batch can be made (download, pack), done once.
        first_batch_s: From the method's start (setup included) to its first batch.
        epoch_s: One epoch of batches after the setup.
        images: Samples in the epoch.
        requests_per_epoch: GET requests an epoch makes to the store (none from local disk).
        estimated: The setup time was scaled from a part of the files.
    """

    method: str
    setup_s: float
    first_batch_s: float
    epoch_s: float
    images: int
    requests_per_epoch: int = 0
    estimated: bool = False

    @property
    def total_s(self) -> float:
        """Setup plus one epoch: the first run's wall time."""
        return self.setup_s + self.epoch_s

    @property
    def images_per_s(self) -> float:
        """Samples per second during the epoch."""
        return self.images / self.epoch_s if self.epoch_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "method": self.method,
            "setup_s": round(self.setup_s, 3),
            "first_batch_s": round(self.first_batch_s, 3),
            "epoch_s": round(self.epoch_s, 3),
            "total_s": round(self.total_s, 3),
            "images": self.images,
            "requests_per_epoch": self.requests_per_epoch,
            "images_per_s": round(self.images_per_s, 1),
            "estimated": self.estimated,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """The comparison's result: the sample it ran on and one row per method.

    Attributes:
        url: The folder of small files.
        files: Files used.
        bytes: Their total size.
        batch_size: Samples per batch.
        threads: Decode threads.
        rows: One per method, in the order (a) to (d).
        packed: Where the packed dataset is (None once deleted).
    """

    url: str
    files: int
    bytes: int
    batch_size: int
    threads: int
    rows: list[CompareRow] = field(default_factory=list)
    packed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "url": self.url,
            "files": self.files,
            "bytes": self.bytes,
            "batch_size": self.batch_size,
            "threads": self.threads,
            "rows": [r.to_dict() for r in self.rows],
            "packed": self.packed,
        }


def format_comparison(comparison: Comparison) -> str:
    """The comparison as a text table."""
    lines = [
        f"{comparison.files:,} files ({comparison.bytes / 1e6:,.1f} MB) from {comparison.url}, "
        f"batches of {comparison.batch_size}, {comparison.threads} decode threads:",
        "",
        f"  {'method':<40}{'setup s':>9}{'first batch s':>15}{'epoch s':>9}{'images/s':>10}"
        f"{'GETs/epoch':>12}",
    ]
    for r in comparison.rows:
        setup = f"{r.setup_s:.2f}" + ("*" if r.estimated else "")
        lines.append(
            f"  {r.method:<40}{setup:>9}{r.first_batch_s:>15.2f}{r.epoch_s:>9.2f}"
            f"{r.images_per_s:>10,.0f}{r.requests_per_epoch:>12,}"
        )
    if any(r.estimated for r in comparison.rows):
        lines.append("  * scaled from the first files downloaded one by one")
    return "\n".join(lines)
