"""Array helpers every layer may use.

Owns `unique`: the sorted distinct values of an integer array, as `np.unique(a)`
returns them. numpy 2 imports `numpy.ma` (about 0.1 s) the first time `np.unique` is
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
