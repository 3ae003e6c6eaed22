"""The compiled core's run form: contracts/runs.py's `pool_spans` and
`scatter_spans`, each one pass of a kernel (compiled/kernels.py) over the record's
columns instead of a chain of numpy calls.

Owns: `pool_spans`, `scatter_spans`, each the numpy function's spans for the same
columns, which the tests hold equal.
"""

from __future__ import annotations

import numpy as np

from ..contracts.records import Pools
from ..contracts.runs import NO_SPANS
from . import kernels as k


def _c(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a)


def pool_spans(p: Pools) -> np.ndarray:
    """contracts/runs.py `pool_spans`."""
    n = len(p)
    if n < 2:  # no run (most decodes): no kernel call
        return NO_SPANS
    out = np.empty((n // 2, 2), dtype=np.int64)
    m = k.pool_spans(_c(p.seq), _c(p.k), _c(p.first_pos), _c(p.last_pos), _c(p.cells),
                     _c(p.rep), _c(p.new), np.empty(n - 1, dtype=np.bool_), out)
    return out[:m]


def scatter_spans(rows: np.ndarray, rep: np.ndarray, pad: np.ndarray) -> np.ndarray:
    """contracts/runs.py `scatter_spans`."""
    n = int(rep.size)
    if n < 2:
        return NO_SPANS
    out = np.empty((n // 2, 2), dtype=np.int64)
    m = k.scatter_spans(_c(rows), _c(rep), _c(pad), np.empty(n - 1, dtype=np.bool_),
                        out)
    return out[:m]
