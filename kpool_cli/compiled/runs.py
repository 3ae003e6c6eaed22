"""The compiled core's run form: contracts/runs.py's `pool_spans` and
`scatter_spans`, each one pass of a kernel (compiled/kernels.py) over the record's
columns instead of a chain of numpy calls; and the spans of a re-pool-all plan's
listings, found from the last ones' where the pools only grew.

Owns: `pool_spans`, `scatter_spans`, each the numpy function's spans for the same
columns, and `EverySpans`, the two functions' spans of every pool and of the plan's
entries; the tests hold each equal to the numpy functions'.
"""

from __future__ import annotations

import numpy as np

from ..contracts.records import Pools
from ..contracts.runs import NO_SPANS
from ..engine.layout import PoolGrowth
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
    """contracts/runs.py `scatter_spans`: a run holds real entries alone, so none forms
    below two (a decode step's pool and its padding: no call)."""
    if rep.size - int(np.count_nonzero(pad)) < 2:
        return NO_SPANS
    return _spans(k.scatter_spans, int(rep.size), rows, rep, pad)


def _grown(pools: bool, p: Pools, pad: np.ndarray, old: np.ndarray, growth: PoolGrowth
           ) -> np.ndarray:
    """`kernels.grown_spans` of the listing `p` (the pool listing's spans when `pools`,
    else its entries' as a plan's, with padding `pad`) from the last listing's
    spans `old`, by `growth`."""
    n = len(p)
    if n < 2:
        return NO_SPANS
    out = np.empty((n // 2, 2), dtype=np.int64)
    m = k.grown_spans(pools, p.seq, p.k, p.first_pos, p.last_pos, p.cells, p.rep, p.new, pad,
                      old if old.flags.writeable else old.copy(), growth.start,
                      growth.before, growth.kept, np.empty(2, dtype=np.int64), out)
    return out[:m]


class EverySpans:
    """The spans of a re-pool-all plan's two listings, one per replay: every pool of the
    layout (`pool_spans`) and the plan's entries (`scatter_spans`: the same pools,
    in order, unpadded). When the layout's pools only changed past what each
    sequence kept since the last such listing (`Layout.every_growth`, naming that
    listing's member rows: the very array kept here), they are found from that
    listing's spans, asking again only the links about a sequence that changed
    (`kernels.grown_spans`): a cache-safe slot closing one pool costs a few links,
    not two passes over every pool. Else both are found whole."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        # the last listing's member rows and its two listings' spans
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __call__(self, p: Pools, members: np.ndarray, pad: np.ndarray, growth: PoolGrowth | None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(pool spans, scatter spans) of the listing `p` of every pool, whose cells are
        `members`, the plan's entry rows (the layout's `pool_members`), and whose reps
        its rep rows (`pad`: its entries' padding, none)."""
        last = self._last
        if growth is not None and last is not None and growth.old_members is last[0]:
            # the kernel reads what these bound: the listing now, the old one's spans
            assert growth.start[-1] == len(p) and growth.before[-1] == last[0].shape[0]
            spans = (_grown(True, p, pad, last[1], growth), _grown(False, p, pad, last[2],
                                                                   growth))
        else:
            spans = (pool_spans(p), scatter_spans(p.cells, p.rep, pad))
        self._last = (members, *spans)
        return spans
