"""What every per-ubatch check reads (ENGINE.md §8), built once a ubatch by the replay.

Owns: `UbatchContext` and `race_groups`. The scatter entries grouped by the row they
write (the race groups) are computed here, once a ubatch: the static checks (KP001,
KP004), the value backend's scatter and KP001's value evidence all read them from
the context.

Invariants: a context is built by `UbatchContext.of` only, so its groups are those of
its plan; `plan` is None when the engine aborted before its scatter plan (KP005),
and then there are no groups and the plan's checks find nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.layout import Layout, LayoutChange
from ..engine.scatter import ScatterPlan

_EMPTY = np.empty(0, dtype=np.int64)
_EMPTY.flags.writeable = False


def race_groups(rep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scatter entries grouped by the row they write.

    Returns (order, starts, rows): `order` sorts the entries by row, stably (so
    within a row, in entry order); group g is `order[starts[g]:starts[g + 1]]` and
    writes `rows[g]` (rows ascending). `starts` has one more element than `rows`."""
    order = np.argsort(rep, kind="stable")
    srep = rep[order]
    head = np.flatnonzero(np.concatenate(([True], srep[1:] != srep[:-1]))) if srep.size else \
        _EMPTY
    starts = np.concatenate((head, [srep.size])).astype(np.int64)
    return order, starts, srep[head]


@dataclass(frozen=True, slots=True)
class UbatchContext:
    """One ubatch as the checks see it: the layout after its update, what the update
    changed, the scatter plan, the ubatch's tokens (their pos, their seq ids), and the
    race groups of the plan (as `race_groups` gives them) with `raced`, the groups of
    two or more entries (the rows KP001 names)."""

    layout: Layout
    change: LayoutChange
    plan: ScatterPlan | None
    token_pos: np.ndarray
    token_seqs: tuple[tuple[int, ...], ...]
    order: np.ndarray
    starts: np.ndarray
    rows: np.ndarray
    raced: np.ndarray

    @classmethod
    def of(cls, layout: Layout, change: LayoutChange, plan: ScatterPlan | None,
           token_pos: np.ndarray, token_seqs: tuple[tuple[int, ...], ...]) -> UbatchContext:
        if plan is None:
            order, starts, rows = _EMPTY, np.zeros(1, dtype=np.int64), _EMPTY
        else:
            order, starts, rows = race_groups(plan.entry_rep)
        raced = np.flatnonzero(np.diff(starts) > 1)
        return cls(layout, change, plan, token_pos, token_seqs, order, starts, rows, raced)

    @property
    def sizes(self) -> np.ndarray:
        """[n_groups] the entries of each group."""
        return np.diff(self.starts)

    def raced_entries(self) -> np.ndarray:
        """The entries (in entry order) that write a raced row."""
        sizes = self.sizes
        hit = np.zeros(self.order.size, dtype=bool)
        hit[self.order[np.repeat(sizes > 1, sizes)]] = True
        return np.flatnonzero(hit)
