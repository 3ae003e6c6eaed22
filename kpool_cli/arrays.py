"""Array helpers every layer may use.

Owns `unique`: the sorted distinct values of an integer array, as `np.unique(a)`
returns them; and `rows_equal`, `rows_max`: per row of a narrow 2-D array (a pool's
kpool members), what `np.all(a == b, axis=1)` and `a.max(axis=1)` give, a column at
a time (numpy's reductions along a short axis cost 5-8x as much: 224 us against 47
for 8192 x 4). numpy 2 imports `numpy.ma` (about 0.1 s) the first time `np.unique` is
called without `return_index`, `return_inverse` or `return_counts`, to ask whether
its argument is masked: kpool never hands it a masked array, and a replay with the
numpy backend or none should not pay that import (numba's `typeof` imports numpy.ma
itself, so a numba replay still does).
"""

from __future__ import annotations

import numpy as np


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
