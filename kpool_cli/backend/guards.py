"""Kernel safety, the checks: what an index array must be before a kernel sees it.

Owns: `PlanError` (the error every check raises), `checked_index` (an index array as
int64, C-contiguous, after checking its dtype, its shape, its range and, where one
writer per element is assumed, that no element repeats), `checked_rows` (the same
for global rows: each in [0, n_rows)), `is_rows` (an array of rows of a given dtype and
width, by its strides) and `group_refusal` (the error of a pass over a scatter's
race groups, `OUTSIDE` or `NOT_RACE_GROUPS`: the kernels check those as they read
them). Pure functions: no state, nothing of the backend imported.

Why (the kernel-safety contract of the value backend): the kernels never check an
index (numba does not, unless NUMBA_BOUNDSCHECK=1), so nothing reaches them
unchecked. The rows the replay hands in (a decode's rows, the plan's entries, the
layout's rep and member rows) are checked where they come in (`checked_rows`:
integers, the right shape, each in [0, n_rows), distinct where one writer per row
is assumed: `store.py`, `verify.py`), and every kernel runs through a method of
`guarded.py` that checks what it is handed against the arrays it will read and
write (`checked_index`: slots in use, sources within the values, shapes that
agree; `SlotTable.check_tables`: the arrays themselves). A bad index raises
`PlanError` naming the array, the element and the row or slot, before any kernel
runs: a bug in a plan is an error with a message, never a write outside an array.

Cost: the checks are a min and a max per array (in Python for the few elements of
a decode's arrays; a sort where rows must be distinct): about 8 us of CPU a
one-token ubatch, under 2% of the backend benchmark's replay.
"""

from __future__ import annotations

import numpy as np


class PlanError(Exception):
    """Indices a value kernel would be handed that are not inside its arrays (or that
    break its one-writer-per-row contract): a bug in kpool's engine or backend (the
    plan, the layout, the slot map), raised before any kernel runs. `where` is the
    step or kernel, `name` the index array at fault."""

    def __init__(self, message: str, where: str, name: str) -> None:
        super().__init__(message, where, name)  # every argument: it pickles (diff -j)
        self.where, self.name = where, name

    def __str__(self) -> str:
        return str(self.args[0])


# arrays up to this size are checked in Python (tolist, min, max, set): a numpy
# reduction costs about a microsecond even on one element, and most arrays of a
# decode's ubatch have a handful. Timed in a loop: a range check of 48 elements
# 2.3 us either way; of distinct rows (numpy sorts), 64 of them 3.8 us in Python
# against 6.1 us, 128 7.6 against 6.3 us (a step of 64 parallel slots)
_SMALL = 48
_SMALL_DISTINCT = 96
I64 = np.dtype(np.int64)
ANY = None  # the `shape` of a 1-D index array of any length


def is_rows(a: np.ndarray, width: int, dtype: type = np.float32) -> bool:
    """`a` is a C-contiguous array of `dtype` rows `width` wide (by its strides)."""
    size = np.dtype(dtype).itemsize
    return (type(a) is np.ndarray and a.dtype == dtype and a.ndim == 2
            and a.shape[1] == width and a.strides == (size * width, size))


def checked_index(a, lo: int | None, hi: int, shape: tuple[int | None, ...] | None,
                  distinct: bool, where: str, name: str, unit: str) -> np.ndarray:
    """`a` as int64, C-contiguous, after checking it: integers of shape `shape` (ANY:
    1-D, any length; a first size None: any), every element in [lo, hi) (lo None:
    any value), and no element twice when `distinct` (1-D). Raises PlanError naming
    the element at fault; `where` is the step, `name` the array, `unit` what an
    element is ("row", "slot", "entry"). Positional, and the common case first: it
    runs about ten times a ubatch."""
    if type(a) is not np.ndarray or a.dtype is not I64:
        a = _as_int64(a, where, name, unit)
    got = a.shape
    if (len(got) != 1 if shape is None else got != shape and (
            shape[0] is not None or len(got) != len(shape) or got[1:] != shape[1:])):
        raise _shape_error(got, shape, where, name)
    a = np.ascontiguousarray(a)  # `a` itself when it already is
    if lo is None:
        return a
    n = a.size
    if n <= (_SMALL_DISTINCT if distinct else _SMALL):
        if n == 0:
            return a
        values = a.tolist() if len(got) == 1 else a.ravel().tolist()
        if (min(values) >= lo and max(values) < hi
                and (not distinct or n == 1 or len(set(values)) == n)):
            return a
    elif ((int(a.view(np.uint64).max()) < hi if lo == 0  # one pass: a negative is huge
           else int(a.min()) >= lo and int(a.max()) < hi)
          and (not distinct or _distinct(a))):
        return a
    raise _index_error(a, lo, hi, where, name, unit)


def checked_rows(rows, n_rows: int, shape: tuple[int | None, ...] | None, distinct: bool,
                 where: str, name: str) -> np.ndarray:
    """Rows handed in by the replay, checked (`checked_index`): every one in
    [0, n_rows)."""
    return checked_index(rows, 0, n_rows, shape, distinct, where, name, "row")


# what a pass over a scatter's race groups (`fresh_groups`, both twins) found wrong
# with the first group it refuses; NO_SLOT: `scatter_singles` met a group whose row
# has no slot yet, and wrote nothing (not an error: the caller hands slots out first)
OUTSIDE, NOT_RACE_GROUPS, NO_SLOT = 1, 2, 3

# what `write_rows` (both twins) did: wrote, or wrote nothing because the slot arrays
# lack the room, or a row, a row's slot or a free slot is outside its array
WROTE, NO_ROOM, ROW_OUTSIDE, SLOT_OUTSIDE, FREE_OUTSIDE = range(5)
# ... or, `one_step`'s write alone, that the rows are not distinct (`checked_rows` says
# which, on the general way)
NOT_DISTINCT = 5

# how far `one_step` (both twins) went: each stage's writes stand, none of the next
# one's were made (the caller runs the rest the general way)
WROTE_NOTHING, ROWS_WRITTEN, SCATTERED, RECHECKED = range(4)
# `one_step` (both twins) takes no more rows than this (it asks them distinct pair by
# pair)
ONE_STEP_MAX_ROWS = 64


def group_refusal(g: int, why: int) -> Exception:
    """The error of a pass over race groups refusing group `g` for `why`: IndexError
    (OUTSIDE: an entry, row or slot outside its array) or ValueError
    (NOT_RACE_GROUPS: the groups are not race groups of the entries' rep rows:
    non-empty, end to end over the entries, rows ascending, each entry writing its
    group's row)."""
    if why == OUTSIDE:
        return IndexError(f"race group {g}: an entry, row or slot outside the arrays")
    return ValueError(f"race group {g}: not a race group of the entries' rep rows")


def _shape_error(got: tuple[int, ...], shape: tuple[int | None, ...] | None, where: str,
                 name: str) -> PlanError:
    sizes = ["n" if w is None else str(w) for w in shape or (None,)]
    want = f"({sizes[0]},)" if len(sizes) == 1 else f"({', '.join(sizes)})"
    return PlanError(f"{where}: {name} has shape {got}, expected shape {want}", where, name)


def _as_int64(a, where: str, name: str, unit: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise PlanError(f"{where}: {name} holds {a.dtype} values, not {unit} numbers",
                        where, name)
    return a.astype(np.int64)  # an unsigned value past int64 turns negative: refused


def _distinct(a: np.ndarray) -> bool:
    srt = np.sort(a, axis=None)
    return not np.any(srt[1:] == srt[:-1])


def outside_error(a: np.ndarray, bad: int, lo: int, hi: int, where: str, name: str,
                  unit: str) -> PlanError:
    """The PlanError of index array `a`'s element `bad` (flat), outside [lo, hi)."""
    at = ", ".join(str(int(i)) for i in np.unravel_index(bad, a.shape))
    units = unit[:-1] + "ies" if unit.endswith("y") else unit + "s"
    valid = f"{units} {lo}..{hi - 1}" if hi > lo else f"no {unit} at all"
    return PlanError(f"{where}: {name}[{at}] is {unit} {int(a.flat[bad])}, but it may "
                     f"only name {valid} (a bug in kpool: no kernel was run)", where, name)


def _index_error(a: np.ndarray, lo: int, hi: int, where: str, name: str, unit: str
                 ) -> PlanError:
    """The PlanError of an index array `checked_index` refused: its first element out
    of [lo, hi), else its first repeated element."""
    flat = a.ravel()
    out = np.flatnonzero((flat < lo) | (flat >= hi))
    if out.size:
        return outside_error(a, int(out[0]), lo, hi, where, name, unit)
    srt = np.sort(flat)
    dup = int(srt[np.flatnonzero(srt[1:] == srt[:-1])[0]])
    return PlanError(f"{where}: {unit} {dup} is in {name} more than once (the kernel "
                     f"takes one writer per {unit})", where, name)
