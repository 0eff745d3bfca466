"""Each source of a scheduled mix as an endless stream of its own epochs, and where it is.

Source ``k`` of size ``n`` has its own epochs, each a permutation of its units (its own
block shuffle, seeded by the run's seed and the source's URL, so that it names the same
units whatever the mix around it). Laid end to end they make the source's stream:
*position* ``p`` is unit ``own_order(p // n)[p % n]``. A mix consumes each stream in
order, so where a source is comes down to a position, plus, after ranks stopped at
different places of it, a few stretches still *owed* (:class:`Stream`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from stoker.pipeline.order import OrderConfig, epoch_order
from stoker.pipeline.plan import group_blocks_for

#: Own epochs' orders kept per source (a draw rarely spans more than two).
_KEPT_ORDERS = 4


@dataclass(frozen=True, slots=True)
class Stream:
    """Where a source's stream goes on: the ``owed`` stretches of positions first (each
    ``(start, stop)``, in the order they come), then every position from ``next`` on."""

    owed: tuple[tuple[int, int], ...] = ()
    next: int = 0

    def __post_init__(self) -> None:
        if self.next < 0 or any(not 0 <= a < b for a, b in self.owed):
            raise ValueError(f"a stream's positions must be >= 0 and stretches non-empty: {self}")

    @property
    def first(self) -> int:
        """The position it gives first."""
        return self.owed[0][0] if self.owed else self.next

    def stretches(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The positions of its units ``start, ..., stop - 1`` (counted from its first), as
        stretches in order."""
        out: list[tuple[int, int]] = []
        seen = 0
        for a, b in self.owed:
            lo, hi = max(start, seen), min(stop, seen + b - a)
            if lo < hi:
                out.append((a + lo - seen, a + hi - seen))
            seen += b - a
        lo = max(start, seen)
        if lo < stop:
            out.append((self.next + lo - seen, self.next + stop - seen))
        return out

    def take(self, count: int) -> np.ndarray:
        """The positions of its first ``count`` units."""
        parts = [np.arange(a, b, dtype=np.int64) for a, b in self.stretches(0, count)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def after(self, count: int) -> Stream:
        """The stream once its first ``count`` units are given."""
        owed = sum(b - a for a, b in self.owed)
        if count >= owed:
            return Stream((), self.next + count - owed)
        return Stream(tuple(self.stretches(count, owed)), self.next)

    def cut(self, world_size: int, per_rank: int, taken: int) -> Stream:
        """The stream once ``world_size`` ranks, each given the next ``per_rank`` units in
        turn (rank ``r`` units ``r * per_rank, ...``), delivered the first ``taken`` of
        theirs: the rest of each rank's units are owed, in rank order."""
        if not 0 <= taken <= per_rank:
            raise ValueError(f"taken must be in [0, {per_rank}], got {taken}")
        left: list[tuple[int, int]] = []
        for r in range(world_size):
            left += self.stretches(r * per_rank + taken, (r + 1) * per_rank)
        rest = self.after(world_size * per_rank)
        return Stream(_merged([*left, *rest.owed]), rest.next)

    def count_below(self, limit: int) -> int:
        """Its units at positions below ``limit``."""
        owed = sum(max(0, min(b, limit) - a) for a, b in self.owed)
        return owed + max(0, limit - self.next)

    def to_state(self) -> dict[str, object]:
        """As JSON: ``{"next": p, "owed": [[start, stop], ...]}``."""
        return {"next": self.next, "owed": [list(s) for s in self.owed]}


def _merged(stretches: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for a, b in stretches:
        if a >= b:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


def url_seed(seed: int, url: str) -> int:
    """The seed of a source's own order: the run's seed and the source's URL."""
    digest = hashlib.sha256(url.encode()).digest()
    words = [seed & 0xFFFFFFFF, seed >> 32, *np.frombuffer(digest[:16], dtype=np.uint32).tolist()]
    state = np.random.SeedSequence(words).generate_state(2, np.uint32)
    return int(state[0]) | int(state[1]) << 32


class OwnOrder:
    """A source's own epochs, and the units at positions of its stream.

    Args:
        shard_sizes: Units in each of its shards.
        config: The loader's order settings (mode and seed taken from it).
        url: The source's URL (seeds its order).
        block_size: Its units per block; its blocks per group follow from its own size and
            ``unit_bytes``, so its order never depends on the mix.
        unit_bytes: Mean bytes of its units.
    """

    def __init__(
        self,
        shard_sizes: Sequence[int],
        config: OrderConfig,
        *,
        url: str,
        block_size: int,
        unit_bytes: float,
    ) -> None:
        self.shard_sizes = [int(s) for s in shard_sizes]
        self.size = sum(self.shard_sizes)
        groups = group_blocks_for(block_size, units=self.size, unit_bytes=unit_bytes)
        self.config = replace(
            config,
            seed=url_seed(config.seed_value, url),
            block_size=block_size,
            group_blocks=groups,
            window=None,
            window_start=None,
        )
        self._orders: dict[int, np.ndarray] = {}

    def order(self, own_epoch: int) -> np.ndarray:
        """Units of own epoch ``own_epoch``, in order."""
        found = self._orders.get(own_epoch)
        if found is None:
            found = epoch_order(self.shard_sizes, config=self.config, epoch=own_epoch).samples
            if len(self._orders) >= _KEPT_ORDERS:
                self._orders.pop(next(iter(self._orders)))
            self._orders[own_epoch] = found
        return found

    def units(self, positions: np.ndarray) -> np.ndarray:
        """The unit at each position of the stream."""
        if not self.size:
            if len(positions):
                raise ValueError("an empty source has no units to give")
            return np.zeros(0, dtype=np.int64)
        epochs, within = np.divmod(positions, self.size)
        out = np.empty(len(positions), dtype=np.int64)
        for own in np.unique(epochs).tolist():
            where = epochs == own
            out[where] = self.order(int(own))[within[where]]
        return out
