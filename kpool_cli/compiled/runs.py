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


def _spans(kernel, n: int, *columns: np.ndarray) -> np.ndarray:
    """The spans `kernel` writes over `columns` (n entries): none below two entries,
    without a call (most decodes list one pool or none)."""
    if n < 2:
        return NO_SPANS
    out = np.empty((n // 2, 2), dtype=np.int64)  # a span holds two entries or more
    m = kernel(*(np.ascontiguousarray(c) for c in columns),
               np.empty(n - 1, dtype=np.bool_), out)
    return out[:m]


def pool_spans(p: Pools) -> np.ndarray:
    """contracts/runs.py `pool_spans`."""
    return _spans(k.pool_spans, len(p), p.seq, p.k, p.first_pos, p.last_pos, p.cells, p.rep,
                  p.new)


def scatter_spans(rows: np.ndarray, rep: np.ndarray, pad: np.ndarray) -> np.ndarray:
    """contracts/runs.py `scatter_spans`."""
    return _spans(k.scatter_spans, int(rep.size), rows, rep, pad)
