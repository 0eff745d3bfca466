"""Who is reading: this process's rank among ranks, and this worker among loader workers."""

from __future__ import annotations

from dataclasses import dataclass

from stoker.core.checks import check_int


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    """A reader's place in a distributed job.

    Frameworks are detected in ``stoker.integrations``; the pipeline only sees this.

    Attributes:
        rank: This process's rank, ``0 <= rank < world_size``.
        world_size: Number of ranks that share each epoch.
        worker: This loader worker, ``0 <= worker < num_workers``.
        num_workers: Loader workers inside this rank (torch DataLoader workers).
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        for name in ("rank", "world_size", "worker", "num_workers"):
            check_int(name, getattr(self, name))
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must be in 0..{self.world_size - 1} (world_size={self.world_size}), "
                f"got {self.rank}"
            )
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if not 0 <= self.worker < self.num_workers:
            raise ValueError(
                f"worker must be in 0..{self.num_workers - 1} (num_workers={self.num_workers}), "
                f"got {self.worker}"
            )
