"""kpool_cli/arrays.py's `SameArrays`: the last answer again for the very same arrays,
by identity alone; `SameValues`, for arrays equal value for value; `ranges`."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from kpool_cli.arrays import (
    SameArrays,
    SameValues,
    all_set,
    any_set,
    ranges,
    same_referents,
)


def _counted():
    calls: list[int] = []

    def total(a: np.ndarray, b: np.ndarray, *, scale: int = 1) -> int:
        calls.append(1)
        return int(a.sum() + b.sum()) * scale

    return SameArrays(total), calls


def test_the_same_arrays_give_the_last_answer_without_a_call():
    f, calls = _counted()
    a, b = np.arange(4), np.ones(3, dtype=np.int64)
    assert f(a, b) == 9 and f(a, b) == 9
    assert len(calls) == 1
    assert f(a, b, scale=2) == 9  # `given` is not compared: the arrays determine it


def test_equal_arrays_that_are_other_objects_are_asked_again():
    f, calls = _counted()
    a, b = np.arange(4), np.ones(3, dtype=np.int64)
    f(a, b)
    assert f(np.arange(4), b) == 9 and len(calls) == 2
    assert f(b, a) == 9 and len(calls) == 3  # the order is part of the key
    assert f(a[:], b) == 9 and len(calls) == 4  # a view is another object


def test_fewer_or_more_arrays_are_asked_again():
    """The same first arrays with one array fewer or more are other arguments."""
    calls: list[int] = []

    def count(*arrays: np.ndarray) -> int:
        calls.append(1)
        return len(arrays)

    f = SameArrays(count)
    a, b = np.arange(4), np.ones(3, dtype=np.int64)
    assert f(a, b) == 2 and f(a) == 1 and f(a, b, a) == 3 and f(a, b, a) == 3
    assert len(calls) == 3


def test_the_last_arrays_are_held_until_the_next_call():
    """The key is held: an array the caller dropped stays alive in the memo, so no new
    array can take its address and match it; the next call's arrays replace it, and
    it is freed."""
    f, calls = _counted()
    a, b = np.arange(4), np.ones(3, dtype=np.int64)
    f(a, b)
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is not None  # held by the memo
    assert f(np.arange(5), b) == 13 and len(calls) == 2
    gc.collect()
    assert ref() is None


def test_same_referents_match_the_very_objects_alive():
    """`same_referents`: weak references match the very objects, one by one; another
    object, another count, or a reference whose object died matches nothing."""
    a, b = np.arange(4), np.ones(3, dtype=np.int64)
    refs = (weakref.ref(a), weakref.ref(b))
    assert same_referents(refs, (a, b))
    assert not same_referents(refs, (a, b.copy())) and not same_referents(refs, (a,))
    del a
    gc.collect()
    assert not same_referents(refs, (np.arange(4), b))


def test_same_values_give_the_last_answer_and_any_other_value_asks_again():
    """`SameValues`: equal values in new arrays give the last answer without a call; a
    changed element, a changed dtype or shape (the same numbers), or another count of
    arrays asks again."""
    calls: list[int] = []

    def total(*arrays: np.ndarray) -> int:
        calls.append(1)
        return sum(int(a.sum()) for a in arrays)

    f = SameValues(total)
    assert f(np.array([1, 2]), np.array([3])) == 6
    assert f(np.array([1, 2]), np.array([3])) == 6 and len(calls) == 1
    assert f(np.array([1, 4]), np.array([3])) == 8 and len(calls) == 2
    assert f(np.array([1, 4], dtype=np.int32), np.array([3])) == 8 and len(calls) == 3
    assert f(np.array([[1, 4]], dtype=np.int32), np.array([3])) == 8 and len(calls) == 4
    assert f(np.array([[1, 4]], dtype=np.int32)) == 5 and len(calls) == 5


def test_ranges_are_the_indices_of_each_range_end_to_end():
    """`ranges`, by hand: one range, one that is empty, several (empty ones among
    them), none, and more than `_FEW` (numpy's path); int64 whatever the input's
    dtype."""
    many = (list(range(0, 100, 10)), [1, 0, 2, 0, 0, 3, 1, 0, 0, 2])  # past `_FEW`
    cases = [(([3], [2]), [3, 4]), (([7], [0]), []), (([4, 8], [0, 1]), [8]),
             (([5, 0, 9], [2, 0, 3]), [5, 6, 9, 10, 11]), (([], []), []),
             (many, [0, 20, 21, 50, 51, 52, 60, 90, 91])]
    for (lo, sizes), want in cases:
        got = ranges(np.array(lo, dtype=np.int32), np.array(sizes, dtype=np.int32))
        assert got.tolist() == want and got.dtype == np.int64, (lo, sizes)


def test_any_set_and_all_set_are_numpys_any_and_all():
    """arrays.any_set / all_set: `a.any()`, `a.all()` of bool arrays, empty ones
    included (any: False; all: True), each a Python bool."""
    for bits in ([], [False], [True], [False, True, False], [True] * 70, [False] * 70):
        a = np.array(bits, dtype=bool)
        assert any_set(a) is bool(a.any()) and all_set(a) is bool(a.all())
