"""Mixture schedules: the weights in force at each batch step, and what each step draws.

A :class:`~stoker.pipeline.mixing.MixConfig` with ``stages`` changes its weights at given
batch steps (or asks a callable for the weights of each step). Steps are a rank's batches
since the run began, counted over epochs: step ``s`` is every rank's ``s``-th batch, so every
rank sees a stage begin at the same optimizer step.

What a step draws is a pure function of the step, its weights, the batch size and the seed
(no carry from earlier steps, so a resume draws what an uninterrupted run would):
``batch_size * p_k`` units of source ``k`` (``p``: the weights normalised), rounded down,
and the units left over go to sources picked by systematic sampling of the fractions with an
offset that walks the golden-ratio sequence with the step. Each source's count is within one
of its quota in every batch, and over any run of steps within ``O(log steps)`` of it.
Inside a batch each source's units are spread evenly (:func:`arrange`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

#: ``step -> weights``: the weights in force at each batch step.
WeightsAt = Callable[[int], Sequence[float]]
#: ``((step, weights), ...)`` in increasing step order, or a callable ``step -> weights``.
Stages = tuple[tuple[int, tuple[float, ...]], ...] | WeightsAt

#: The golden ratio's fractional part: offsets ``frac(seed + s * GOLDEN)`` spread evenly.
GOLDEN = (math.sqrt(5) - 1) / 2


def check_weights(name: str, weights: object, sources: int | None = None) -> tuple[float, ...]:
    """``weights`` as a tuple of floats, if finite, non-negative, of positive sum and (when
    ``sources`` is given) one per source.

    Raises:
        TypeError: Not a sequence of numbers.
        ValueError: Any other of the above, naming ``name``.
    """
    try:
        values = tuple(float(w) for w in weights)  # type: ignore[attr-defined]  # checked
    except TypeError as error:
        raise TypeError(f"{name} must be a sequence of numbers, got {weights!r}") from error
    if not values or any(not math.isfinite(w) or w < 0 for w in values):
        raise ValueError(f"{name} must be finite and >= 0, got {weights}")
    if sum(values) <= 0:
        raise ValueError(f"at least one of {name} must be > 0, got {weights}")
    if sources is not None and len(values) != sources:
        raise ValueError(f"{name} has {len(values)} weights, but the mix has {sources} sources")
    return values


def check_stages(stages: object, sources: int) -> Stages:
    """``stages`` checked and frozen: a callable as it is, else ``(step, weights)`` pairs
    with steps ``>= 0`` in increasing order and one weight per source.

    Raises:
        TypeError: Neither a callable nor a sequence of pairs.
        ValueError: A step out of order or negative, or bad weights (naming the stage).
    """
    if callable(stages):
        return stages  # its weights are checked at each step they are asked for
    if isinstance(stages, str | bytes) or not isinstance(stages, Sequence):
        raise TypeError(f"stages must be ((step, weights), ...) or a callable, got {stages!r}")
    frozen: list[tuple[int, tuple[float, ...]]] = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, Sequence) or len(stage) != 2:
            raise TypeError(f"stages[{i}] must be a (step, weights) pair, got {stage!r}")
        step, weights = stage
        if not isinstance(step, int | np.integer) or isinstance(step, bool) or step < 0:
            raise ValueError(f"stages[{i}]: the step must be an int >= 0, got {step!r}")
        if frozen and step <= frozen[-1][0]:
            raise ValueError(
                f"stages[{i}] begins at step {step}, not after stages[{i - 1}] ({frozen[-1][0]})"
            )
        frozen.append((int(step), check_weights(f"stages[{i}] weights", weights, sources)))
    return tuple(frozen)


class Schedule:
    """The units of each source that each batch step draws.

    Args:
        weights: The weights before the first stage.
        stages: See :data:`Stages` (None: ``weights`` at every step).
        batch_size: Units a step draws on each rank.
        seed: Seeds the offsets that place the leftover units.
    """

    def __init__(
        self,
        weights: Sequence[float],
        stages: Stages | None,
        *,
        batch_size: int,
        seed: int,
    ) -> None:
        self.weights = tuple(float(w) for w in weights)
        self.stages = stages
        self.batch_size = batch_size
        self._offset = float(np.random.default_rng([seed, 0x5C4ED]).random())
        self._vectors: dict[tuple[float, ...], int] = {}
        self._floors: list[np.ndarray] = []
        self._bounds: list[np.ndarray] = []

    @property
    def sources(self) -> int:
        """Sources the weights are for."""
        return len(self.weights)

    def weights_at(self, step: int) -> tuple[float, ...]:
        """The weights in force at batch step ``step``.

        Raises:
            ValueError: A callable's weights for ``step`` are not valid (naming the step).
        """
        stages = self.stages
        if stages is None:
            return self.weights
        if callable(stages):
            return check_weights(f"stages({step})", stages(step), self.sources)
        found = self.weights
        for begins, weights in stages:
            if begins > step:
                break
            found = weights
        return found

    def counts(self, first: int, steps: int) -> np.ndarray:
        """Units of each source that steps ``first, ..., first + steps - 1`` draw:
        ``(steps, sources)`` int64, each row summing to the batch size."""
        numbers = np.arange(first, first + steps, dtype=np.int64)
        vectors = self._vector_numbers(numbers)
        floors = np.stack(self._floors)[vectors] if steps else np.zeros((0, self.sources))
        bounds = np.stack(self._bounds)[vectors] if steps else np.zeros((0, self.sources + 1))
        offsets = np.mod(self._offset + (numbers + 1) * GOLDEN, 1.0)[:, None]
        # Points offset, offset + 1, ... on the fractions laid end to end: each interval
        # (shorter than 1) holds at most one.
        extra = np.diff(np.ceil(bounds - offsets), axis=1)
        return np.asarray(floors + extra, dtype=np.int64)

    def _vector_numbers(self, numbers: np.ndarray) -> np.ndarray:
        """Which distinct weight vector each step uses (vectors kept once each)."""
        stages = self.stages
        if stages is None:
            return np.full(len(numbers), self._vector(self.weights), dtype=np.int64)
        if callable(stages):
            return np.asarray([self._vector(self.weights_at(int(s))) for s in numbers], np.int64)
        begins = np.asarray([b for b, _ in stages], dtype=np.int64)
        vectors = [self._vector(self.weights)] + [self._vector(w) for _, w in stages]
        return np.asarray(vectors, dtype=np.int64)[np.searchsorted(begins, numbers, "right")]

    def _vector(self, weights: tuple[float, ...]) -> int:
        number = self._vectors.get(weights)
        if number is None:
            # Weights as written (0.1 is 1/10), so quotas that are whole numbers stay whole.
            exact = [Fraction(repr(w)) for w in weights]
            quotas = [self.batch_size * w / sum(exact) for w in exact]
            floors = [math.floor(q) for q in quotas]
            fractions = np.cumsum(
                [0.0] + [float(q - f) for q, f in zip(quotas, floors, strict=True)]
            )
            fractions[-1] = self.batch_size - sum(floors)  # whole: no point falls past it
            number = self._vectors[weights] = len(self._floors)
            self._floors.append(np.asarray(floors, dtype=np.int64))
            self._bounds.append(fractions)
        return number


def arrange(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each source's units sit in a run of batches drawn with ``counts``.

    Args:
        counts: ``(steps, sources)``: units of each source in each batch.

    Returns:
        For each place of the run, in order: its source, and which of that source's units
        of the run it holds (0, 1, ... in the order the source gives them). Inside a batch a
        source's ``n`` units sit at its ``(j + 0.5) / n`` marks, merged over the sources.
    """
    steps, sources = counts.shape
    source_of: list[np.ndarray] = []
    unit_of: list[np.ndarray] = []
    step_of: list[np.ndarray] = []
    spot_of: list[np.ndarray] = []
    for k in range(sources):
        n = counts[:, k]
        total = int(n.sum())
        step = np.repeat(np.arange(steps, dtype=np.int64), n)
        starts = (np.cumsum(n) - n).astype(np.int64)
        within = np.arange(total, dtype=np.int64) - np.repeat(starts, n)
        source_of.append(np.full(total, k, dtype=np.int64))
        unit_of.append(np.arange(total, dtype=np.int64))
        step_of.append(step)
        spot_of.append((within + 0.5) / np.maximum(np.repeat(n, n), 1))
    if not sources:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    source = np.concatenate(source_of)
    placed = np.lexsort((source, np.concatenate(spot_of), np.concatenate(step_of)))
    return source[placed], np.concatenate(unit_of)[placed]
