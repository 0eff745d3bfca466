"""The best-fit packing plan: every document token in exactly one sequence, documents whole
unless longer than a sequence (then cut in order), no sequence over its capacity, less
padding than first-fit; properties over random lengths, capacities and windows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.pipeline.token_packing import (
    FITS,
    PackPlan,
    best_fit,
    first_fit,
    pack_documents,
    split_documents,
)


def _check_plan(
    plan: PackPlan, doc_starts: np.ndarray, capacity: int, *, ordered: bool = True
) -> None:
    """Every token of the stream in exactly one piece, each piece inside one document, a
    document no longer than ``capacity`` whole in one sequence, a longer one cut into
    pieces of ``capacity`` in sequences of increasing number (``ordered``: not first-fit in
    arrival order, which may put a remainder in an earlier sequence), none over capacity."""
    assert plan.capacity == capacity
    real = plan.real_tokens
    assert len(real) == plan.sequences
    assert (real >= 1).all()
    assert (real <= capacity).all()
    assert plan.padding_tokens == plan.sequences * capacity - int(doc_starts[-1])
    assert int(plan.window_sequences.sum()) == plan.sequences
    sequence = np.repeat(np.arange(plan.sequences), np.diff(plan.sequence_starts))
    order = np.argsort(plan.starts, kind="stable")
    starts, lengths, owner = plan.starts[order], plan.lengths[order], sequence[order]
    # The pieces tile the stream: no gap, no overlap.
    assert starts[0] == 0 if len(starts) else doc_starts[-1] == 0
    assert np.array_equal(starts[1:], (starts + lengths)[:-1])
    assert int((starts + lengths)[-1]) == int(doc_starts[-1])
    document = np.searchsorted(doc_starts, starts, side="right") - 1
    assert ((starts + lengths) <= doc_starts[document + 1]).all()  # inside one document
    for doc in np.unique(document).tolist():
        mine = np.flatnonzero(document == doc)
        size = int(doc_starts[doc + 1] - doc_starts[doc])
        assert len(mine) == -(-size // capacity)
        assert (lengths[mine[:-1]] == capacity).all()  # cut at the capacity, in order
        if ordered:
            assert (np.diff(owner[mine]) > 0).all()  # in sequences of increasing number


def _bounds(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def test_a_small_plan_by_hand() -> None:
    # Capacity 10: 7 and 3 fill one sequence, 6 and 4 another; 12 is cut into 10 and 2,
    # and the 2 goes with 5 (best-fit: the fullest sequence it fits).
    doc_starts = _bounds([7, 6, 12, 4, 3, 5])
    plan = pack_documents(doc_starts, capacity=10, window=6)
    _check_plan(plan, doc_starts, 10)
    contents = [
        plan.lengths[a:b].tolist()
        for a, b in zip(plan.sequence_starts[:-1], plan.sequence_starts[1:], strict=True)
    ]
    assert contents == [[10], [7, 3], [6, 4], [2, 5]]
    assert plan.padding_tokens == 3


def test_windows_pack_apart_and_their_sequences_follow_in_order() -> None:
    doc_starts = _bounds([5, 5, 5, 5, 5])
    plan = pack_documents(doc_starts, capacity=10, window=2)
    _check_plan(plan, doc_starts, 10)
    assert plan.window_sequences.tolist() == [1, 1, 1]
    assert plan.starts.tolist() == [0, 5, 10, 15, 20]  # no window reaches into another


def test_split_documents_cuts_at_the_capacity() -> None:
    starts, lengths = split_documents(_bounds([3, 25, 10]), 10)
    assert starts.tolist() == [0, 3, 13, 23, 28]
    assert lengths.tolist() == [3, 10, 10, 5, 10]


def test_empty_documents_have_no_piece() -> None:
    doc_starts = _bounds([4, 0, 4])
    plan = pack_documents(doc_starts, capacity=10, window=8)
    assert plan.lengths.tolist() == [4, 4]
    assert plan.sequences == 1


@pytest.mark.parametrize("name", sorted(FITS))
def test_every_fit_places_each_piece_once_within_capacity(name: str) -> None:
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 65, 400)
    bins = FITS[name](lengths, 64)
    filled = np.bincount(bins, weights=lengths)
    assert (filled <= 64).all()
    assert set(np.unique(bins).tolist()) == set(range(int(bins.max()) + 1))


def test_best_fit_pads_less_than_first_fit_on_heavy_tailed_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, 20_000), 1, None).astype(np.int64)
    doc_starts = _bounds(lengths.tolist())
    best = pack_documents(doc_starts, capacity=1025, window=512, fit=best_fit)
    first = pack_documents(doc_starts, capacity=1025, window=512, fit=first_fit)
    _check_plan(best, doc_starts, 1025)
    _check_plan(first, doc_starts, 1025, ordered=False)
    assert best.padding_tokens <= 0.75 * first.padding_tokens


def test_the_plan_is_a_pure_function_of_its_inputs() -> None:
    rng = np.random.default_rng(2)
    doc_starts = _bounds(rng.integers(1, 300, 2_000).tolist())
    one = pack_documents(doc_starts, capacity=129, window=100)
    two = pack_documents(doc_starts.copy(), capacity=129, window=100)
    for field in ("starts", "lengths", "sequence_starts", "window_sequences"):
        assert np.array_equal(getattr(one, field), getattr(two, field))


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=120),
    capacity=st.integers(min_value=1, max_value=64),
    window=st.integers(min_value=1, max_value=50),
    fit=st.sampled_from(sorted(FITS)),
)
def test_property_every_token_once_documents_whole_or_cut_in_order(
    lengths: list[int], capacity: int, window: int, fit: str
) -> None:
    doc_starts = _bounds(lengths)
    if doc_starts[-1] == 0:
        plan = pack_documents(doc_starts, capacity=capacity, window=window, fit=FITS[fit])
        assert plan.sequences == 0
        return
    plan = pack_documents(doc_starts, capacity=capacity, window=window, fit=FITS[fit])
    _check_plan(plan, doc_starts, capacity, ordered=fit != "first-fit")
    # A window's sequences hold only its own documents.
    sequence_window = np.repeat(np.arange(len(plan.window_sequences)), plan.window_sequences)
    piece_sequence = np.repeat(np.arange(plan.sequences), np.diff(plan.sequence_starts))
    document = np.searchsorted(doc_starts, plan.starts, side="right") - 1
    window_of_document = np.arange(len(lengths)) // window  # empty windows have none
    assert np.array_equal(sequence_window[piece_sequence], window_of_document[document])
