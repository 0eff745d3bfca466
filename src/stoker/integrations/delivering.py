"""What the in-process framework adapters share: a Loader handed over batch by batch.

:class:`~stoker.integrations.jax.JaxLoader` wraps a :class:`stoker.Loader` and converts
its batches (arrays placed on devices). What such an adapter needs is here: epochs,
``len()``, counters, closing, and ``state_dict()`` taken at each delivery, so that a batch
converted one ahead (its copy under way while the caller uses the last one) is not counted
as delivered before the caller has it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Self

from stoker.core.metrics import TraceEvent
from stoker.pipeline.loader import Loader
from stoker.pipeline.stats import LoaderStats

Batch = dict[str, Any]


class Delivering:
    """The shared half of an adapter; a subclass sets :attr:`loader` and iterates with
    :meth:`_delivered`.

    Attributes:
        loader: The Loader making the batches.
    """

    loader: Loader
    _state: dict[str, Any] | None = None  # the loader's state at the last delivery

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on."""
        self._state = None
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """Where the run is (see :meth:`stoker.Loader.state_dict`): a few integers, counting
        the batches handed to the caller."""
        return dict(self._state) if self._state is not None else self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the last batch ``state`` counted, on any world size (see
        :meth:`stoker.Loader.load_state_dict`)."""
        self._state = None
        self.loader.load_state_dict(state)

    def _delivered(self, convert: Callable[[Batch], Batch], *, ahead: bool) -> Iterator[Batch]:
        """The loader's batches through ``convert``; with ``ahead``, each is converted
        before the previous one is handed over (an asynchronous copy then overlaps the
        caller's step)."""
        if not ahead:
            for batch in self.loader:
                self._state = self.loader.state_dict()
                yield convert(batch)
        else:
            upcoming: tuple[Batch, dict[str, Any]] | None = None
            for batch in self.loader:
                ready = (convert(batch), self.loader.state_dict())
                if upcoming is not None:
                    converted, self._state = upcoming
                    yield converted
                upcoming = ready
            if upcoming is not None:
                converted, self._state = upcoming
                yield converted
        self._state = None

    def stats(self) -> LoaderStats:
        """The loader's counters (see :meth:`stoker.Loader.stats`)."""
        return self.loader.stats()

    def trace(self, *, max_events: int = 200_000) -> None:
        """Keep a timeline of the loader's stages (see :meth:`stoker.Loader.trace`)."""
        self.loader.trace(max_events=max_events)

    def events(self) -> list[TraceEvent]:
        """The timeline kept since :meth:`trace`."""
        return self.loader.events()

    def close(self) -> None:
        """Stop the loader's decode threads and close its disk cache's files."""
        self.loader.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
