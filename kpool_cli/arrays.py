"""Array helpers every layer may use.

Owns `SameArrays`: a pure function of arrays that gives its last answer again when
called with the very same array objects (by identity, O(1): `same_objects`, or
`same_referents` through weak references), and
`SameValues`, the same for arrays equal value for value (O(n)); `unique`: the sorted
distinct values of an integer array, as `np.unique(a)` returns them; and
`any_set`, `all_set`: `a.any()`, `a.all()` of a small bool array at a fifth of
numpy's cost; `rows_equal`, `rows_max`: per row of a narrow 2-D array (a pool's
kpool members), what `np.all(a == b, axis=1)` and `a.max(axis=1)` give, a column at
a time (numpy's reductions along a short axis cost 5-8x as much: 224 us against 47
for 8192 x 4).
numpy 2 imports `numpy.ma` (about 0.1 s) the first time `np.unique` is called
without `return_index`, `return_inverse` or `return_counts`, to ask whether its
argument is masked: kpool never hands it a masked array, and a replay with the numpy
backend or none should not pay that import (numba's `typeof` imports numpy.ma
itself, so a numba replay still does).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


class SameArrays(Generic[T]):
    """`fn`, a pure function of its array arguments, that keeps its last answer and
    gives it again when called with the very same array objects: O(1), where `fn`
    reads every element. It serves inputs that are handed on unchanged, such as the
    layout's whole-layout columns, one array each until its pools change
    (`Layout.every_pool`): a re-pool-all ubatch's plan, race groups and listing are
    the last one's while the pools stand. Nothing may write an array it was given.

    The last call's arguments are held (one ubatch's arrays, until the next call: a
    module's instance keeps the last replay's until its next one, or the process's
    end): an array held cannot die, so no new array takes its address and matches it
    (weak references cost 1.5-2 us a ubatch to make, a decode's JSON listing
    alone). The last call is one tuple, replaced whole, so threads that share an
    instance at worst recompute."""

    __slots__ = ("_fn", "_last")

    def __init__(self, fn: Callable[..., T]) -> None:
        self._fn = fn
        self._last: tuple[tuple[np.ndarray, ...], T] | None = None

    def __call__(self, *arrays: np.ndarray, **given: object) -> T:
        """`fn(*arrays, **given)`; `given` is not compared: it must be what the arrays
        determine (the object they were read from, say)."""
        last = self._last
        if last is not None and same_objects(last[0], arrays):
            return last[1]
        out = self._fn(*arrays, **given)
        self._last = (arrays, out)
        return out


class SameValues(Generic[T]):
    """`fn`, a pure function of its array arguments, that keeps its last answer and
    gives it again when called with arrays equal to the last ones, value for value
    (shape and dtype too): O(n) compares where `fn` costs more. It serves values that
    are built afresh from arrays that changed elsewhere: the rows KP001 names are the
    same while a cache-safe plan gains a pool that no other pool shares. The last
    arguments are held (not copied): nothing may write an array it was given."""

    __slots__ = ("_fn", "_last")

    def __init__(self, fn: Callable[..., T]) -> None:
        self._fn = fn
        self._last: tuple[tuple[np.ndarray, ...], T] | None = None

    def __call__(self, *arrays: np.ndarray, **given: object) -> T:
        """`fn(*arrays, **given)`; `given` is not compared: it must be what the arrays
        determine."""
        last = self._last
        if last is not None and len(last[0]) == len(arrays) and all(
                a is b or (a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b))
                for a, b in zip(last[0], arrays, strict=True)):
            # the new arrays are kept in place of the equal old ones: handed on again
            # (the same objects), they match by identity, without a compare
            self._last = (arrays, last[1])
            return last[1]
        out = self._fn(*arrays, **given)
        self._last = (arrays, out)
        return out


def same_referents(refs: tuple[weakref.ref, ...], objects: tuple[object, ...]) -> bool:
    """Whether `objects` are, one by one, the very objects `refs` refer to (a dead
    reference matches nothing): `same_objects` for a holder that must not keep them,
    in a loop of its own (a tuple of the referents first costs a ubatch 1 us)."""
    if len(refs) != len(objects):
        return False
    for r, o in zip(refs, objects, strict=True):  # noqa: SIM110 - the loop is the point
        if r() is not o:
            return False
    return True


def same_objects(held: tuple[object, ...], objects: tuple[object, ...]) -> bool:
    """Whether `objects` are, one by one, the very objects `held` (held by the caller,
    so alive: no other object has their addresses). A loop, not `all` over a
    generator: a ubatch asks this some ten times, at a third of the cost."""
    if len(held) != len(objects):
        return False
    for a, b in zip(held, objects, strict=True):  # noqa: SIM110 - the loop is the point
        if a is not b:
            return False
    return True


def ranges(lo: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The indices of ranges lo[i] .. lo[i] + sizes[i] - 1, end to end (int64): a
    few groups' entries, a few sequences' pools, without a loop over them. Up to
    `_FEW` ranges are aranges (most calls: one group, or a few sequences of which one
    grew: 0.6-1.5 us against 4)."""
    if lo.size <= _FEW:
        parts = [(a, n) for a, n in zip(lo.tolist(), sizes.tolist(), strict=True) if n]
        if len(parts) == 1:
            a, n = parts[0]
            return np.arange(a, a + n, dtype=np.int64)
        return (np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in parts])
                if parts else np.empty(0, dtype=np.int64))
    ends = np.cumsum(sizes)
    n = int(ends[-1]) if ends.size else 0
    return np.repeat(lo - (ends - sizes), sizes) + np.arange(n, dtype=np.int64)


_FEW = 8  # `ranges`: up to this many, one arange each


def unique(a: np.ndarray) -> np.ndarray:
    """`np.unique(a)` for an integer array (of any shape): its distinct values, sorted,
    flat, of `a`'s dtype."""
    out = np.sort(np.asarray(a), axis=None)
    if out.size > 1:
        keep = np.empty(out.size, dtype=bool)
        keep[0] = True
        np.not_equal(out[1:], out[:-1], out=keep[1:])
        out = out[keep]
    return out


def union(parts: list[np.ndarray]) -> np.ndarray:
    """The ascending distinct union of `parts`, int64 arrays each ascending and
    distinct (one part: itself)."""
    if len(parts) == 1:
        return parts[0]
    return unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)


def any_set(a: np.ndarray) -> bool:
    """`a.any()` for a bool array: numpy's method goes through a Python-level wrapper
    to a reduction (0.9 us however small the array, and a decode asks a few each
    step); `count_nonzero` takes a C path (0.2 us)."""
    return bool(np.count_nonzero(a))


def all_set(a: np.ndarray) -> bool:
    """`a.all()` for a bool array, as `any_set` says."""
    return int(np.count_nonzero(a)) == a.size


def rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`np.all(a == b, axis=1)` for 2-D arrays of one shape."""
    out = np.ones(a.shape[0], dtype=bool)
    for j in range(a.shape[1]):
        out &= a[:, j] == b[:, j]
    return out


def rows_max(a: np.ndarray) -> np.ndarray:
    """`a.max(axis=1)` for a 2-D array of at least one column."""
    out = a[:, 0].copy()
    for j in range(1, a.shape[1]):
        np.maximum(out, a[:, j], out=out)
    return out
