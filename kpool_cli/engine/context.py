"""The engine's facts of one step, as the rules (verdict/rules/) and the value backend
read them (ENGINE.md §8), built by the replay: `UbatchContext` once a ubatch,
`OpContext` once an op that is not a ubatch.

Owns: `UbatchContext`, `race_groups` (the scatter entries grouped by the row they
write; `RaceGroups` and `plan_groups`, the form a ubatch takes them in; computed
once a ubatch: the static checks, the value backend's scatter and KP001's value
evidence all read them here), `raced_writers` (the writers of the entries that write
a raced row, and their groups: what KP001 reads of a plan), `writers_of` (the pool
each entry scatters, `PAD_WRITER` for padding), `groups_entries` (the entries of
some groups, as a plan of their own) and `OpContext`. A core may compute
the race groups and the raced writers its own way (`Groups`, `RacedWriters`: the
compiled core's kernels), to the same arrays.

Invariants: a context is built by `UbatchContext.of` only, so its groups are those of
its plan; `plan` is None exactly when the engine aborted before its scatter plan
(`abort` then says why: KP005), and then there are no groups and the plan's checks
find nothing. A context is read, never changed: its layout and cache are the
replay's, as they stand after the ubatch's layout update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from ..arrays import SameArrays, ranges
from ..cache.kv import KvCache
from .layout import Layout, LayoutChange
from .scatter import ScatterPlan

PAD_WRITER = (-1, -1)  # the (seq, k) of a padding entry

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


def groups_entries(order: np.ndarray, starts: np.ndarray, groups: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The entries of race groups `groups` (of `order`, `starts`: `race_groups`'),
    group after group, each in entry order, and where each group's begin among them
    ([len(groups) + 1], the race groups of those entries as a plan of their own)."""
    sizes = starts[groups + 1] - starts[groups]
    sub = np.empty(sizes.size + 1, dtype=np.int64)
    sub[0] = 0
    np.cumsum(sizes, out=sub[1:])
    return order[ranges(starts[groups], sizes)], sub


def raced_writers(order: np.ndarray, starts: np.ndarray, entry_pool: np.ndarray,
                  layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Of the entries that write a raced row (a race group `order[starts[g]:starts[g +
    1]]` of two or more), in entry order: the [seq, k] of each (`writers_of`, its
    global pool `entry_pool[e]` in `layout`: PAD_WRITER for padding), and the race
    group of each."""
    sizes = np.diff(starts)
    group = np.empty(order.size, dtype=np.int64)
    group[order] = np.repeat(np.arange(sizes.size), sizes)
    entries = np.flatnonzero((sizes > 1)[group])
    return writers_of(layout, entry_pool[entries]), group[entries]


class RaceGroups(NamedTuple):
    """A plan's race groups as `race_groups` gives them (order, starts, rows), the
    raced ones (`raced`: the groups of two or more entries), and `raced_kept`: those
    are the raced groups the same `Groups` gave last, at the same indices, with the
    same entries' pools in the same order (so the same rows, counts and writers:
    what KP001 reads). False promises nothing."""

    order: np.ndarray
    starts: np.ndarray
    rows: np.ndarray
    raced: np.ndarray
    raced_kept: bool = False


Groups = Callable[[ScatterPlan, Layout], RaceGroups]
RacedWriters = Callable[[np.ndarray, np.ndarray, np.ndarray, Layout],
                        tuple[np.ndarray, np.ndarray]]


def groups_raced(starts: np.ndarray) -> np.ndarray:
    """The race groups of two or more entries, of groups that start at `starts`."""
    return np.flatnonzero(np.diff(starts) > 1)


# a plan that stands (scatter.py) hands on the last plan's groups
_raced = SameArrays(groups_raced)


def plan_groups(plan: ScatterPlan, layout: Layout) -> RaceGroups:
    """The race groups of `plan` (`race_groups` of its rep rows), as `Groups` gives
    them, promising nothing of the last ones."""
    order, starts, rows = race_groups(plan.entry_rep)
    return RaceGroups(order, starts, rows, _raced(starts))


@dataclass(frozen=True, slots=True)
class UbatchContext:
    """One ubatch as the checks see it: the cache and the layout after its update,
    what the update changed, the scatter plan (None when the engine aborted before it,
    `abort` saying why), the ubatch's tokens (their pos, their seq ids), and the race
    groups of the plan (as `race_groups` gives them) with `raced`, the groups of two
    or more entries (the rows KP001 names), `raced_kept` (`RaceGroups`: those are
    the last plan's raced groups, as they were), and how the core finds the writers
    of those (`raced_of`: `raced_writers`, or its equal twin)."""

    cache: KvCache
    layout: Layout
    change: LayoutChange
    plan: ScatterPlan | None
    abort: str | None
    token_pos: np.ndarray
    token_seqs: tuple[tuple[int, ...], ...]
    order: np.ndarray
    starts: np.ndarray
    rows: np.ndarray
    raced: np.ndarray
    raced_kept: bool
    raced_of: RacedWriters

    @classmethod
    def of(cls, cache: KvCache, layout: Layout, change: LayoutChange,
           plan: ScatterPlan | None, abort: str | None, token_pos: np.ndarray,
           token_seqs: tuple[tuple[int, ...], ...],
           groups: Groups | None = None, raced_of: RacedWriters | None = None
           ) -> UbatchContext:
        """`groups`, `raced_of`: how the race groups and the writers of the raced rows
        are computed (`plan_groups`, `raced_writers`, or a core's equal twins)."""
        assert (plan is None) == (abort is not None), "a plan, or the abort that stopped it"
        if plan is None:
            starts = np.zeros(1, dtype=np.int64)
            g = RaceGroups(_EMPTY, starts, _EMPTY, _raced(starts))
        else:
            g = (groups or plan_groups)(plan, layout)
        return cls(cache, layout, change, plan, abort, token_pos, token_seqs, *g,
                   raced_of or raced_writers)

    @property
    def sizes(self) -> np.ndarray:
        """[n_groups] the entries of each group."""
        return np.diff(self.starts)

    def raced_writers(self) -> tuple[np.ndarray, np.ndarray]:
        """Of the entries that write a raced row, in entry order: the [seq, k] of each
        and each one's race group (`raced_writers`)."""
        assert self.plan is not None
        return self.raced_of(self.order, self.starts, self.plan.entry_pool, self.layout)

    def group_writers(self, groups: np.ndarray) -> list[list[list[int]]]:
        """Per group of `groups` (indices into the groups): the [seq, k] of each of its
        entries, in entry order (`writers_of`: PAD_WRITER for padding). It looks up
        those entries alone: a cache-safe ubatch has an entry for every pool, and
        KP001 shows 64 groups, the scatter the few whose values differ."""
        assert self.plan is not None
        entries, sub = groups_entries(self.order, self.starts, groups)
        flat = writers_of(self.layout, self.plan.entry_pool[entries]).tolist()
        bounds = sub.tolist()
        return [flat[a:b] for a, b in pairwise(bounds)]


def writers_of(layout: Layout, entry_pool: np.ndarray) -> np.ndarray:
    """[n_entries, 2] the (seq, k) of each entry (its global pool `entry_pool`, -1 for
    padding); PAD_WRITER for padding."""
    out = np.full((entry_pool.size, 2), -1, dtype=np.int64)
    real = np.flatnonzero(entry_pool >= 0)
    if real.size:
        seq, k = layout.locate(entry_pool[real])
        out[real, 0], out[real, 1] = seq, k
    return out


@dataclass(frozen=True, slots=True)
class OpContext:
    """An op's outcome as the checks see it: an edit (applied, refused or aborted), or
    a decode refused before any ubatch ran. `seq` is the op's sequence (-1: none or
    every one). `aborted`: the GGML_ASSERT that stops the engine here (KP005);
    `refused`: why llama_decode refused the decode, or why the memory refused the
    edit (and then nothing changed). At most one of the two is set."""

    op: int
    kind: str
    seq: int = -1
    aborted: str | None = None
    refused: str | None = None
