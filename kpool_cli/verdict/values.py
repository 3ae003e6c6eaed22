"""Verdicts that need values (ENGINE.md §8): KP001 with value evidence, KP003.

Owns: pure functions from a layout, a scatter plan and arrays the value backend
computed to findings (the value KP001 enriches `static.scatter_race`'s).

Racing writes have no defined winner (set_rows splits entries across threads), so
no verdict here depends on which racing entry the backend stored: a raced row is
judged by every racing entry's value.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..engine.layout import Layout
from ..engine.scatter import ScatterPlan
from .codes import EVIDENCE_ROWS, Finding

PAD_WRITER = (-1, -1)  # the (seq, k) of a padding entry in KP001 evidence


def race_groups(rep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scatter entries grouped by the row they write.

    Returns (order, starts, rows): `order` sorts the entries by row, stably (so
    within a row, in entry order); group g is `order[starts[g]:starts[g + 1]]` and
    writes `rows[g]`. `starts` has one more element than `rows`."""
    order = np.argsort(rep, kind="stable")
    srep = rep[order]
    head = np.flatnonzero(np.concatenate(([True], srep[1:] != srep[:-1]))) if srep.size else \
        np.empty(0, dtype=np.int64)
    starts = np.concatenate((head, [srep.size])).astype(np.int64)
    return order, starts, srep[head]


def writers_of(layout: Layout, entry_pool: np.ndarray) -> np.ndarray:
    """[n_entries, 2] the (seq, k) of each entry; PAD_WRITER for padding."""
    out = np.full((entry_pool.size, 2), -1, dtype=np.int64)
    real = np.flatnonzero(entry_pool >= 0)
    if real.size:
        seq, k = layout.locate(entry_pool[real])
        out[real, 0], out[real, 1] = seq, k
    return out


def groups_equal(bits: np.ndarray, members: np.ndarray, order: np.ndarray,
                 starts: np.ndarray) -> np.ndarray:
    """[n_groups] bool: every entry of the group has the same value bits (`bits`
    [n_entries, n_embd] uint32; groups as race_groups gives them). An entry with the
    same member rows (`members` [n_entries, kpool]) as its group's first has the same
    value (a pooling is a function of its members' rows), so only the others' bits are
    compared."""
    if starts.size < 2:
        return np.ones(0, dtype=bool)
    head = order[np.repeat(starts[:-1], np.diff(starts))]
    same = np.all(members[order] == members[head], axis=1)
    todo = np.flatnonzero(~same)
    if todo.size:
        same[todo] = np.all(bits[order[todo]] == bits[head[todo]], axis=1)
    return np.logical_and.reduceat(same, starts[:-1])


def _who(w: tuple[int, int]) -> str:
    return "padding" if w == PAD_WRITER else f"{w[0]}:{w[1]}"


def race_with_values(race: Finding, layout: Layout, plan: ScatterPlan, values: np.ndarray
                     ) -> Finding:
    """KP001 (the static finding `race`, same rows/seqs/pools) with value evidence.

    `values` [n_new_g, n_embd] float32: the pooled value of every scatter entry.
    Evidence: {row: {"equal": bool, "writers": [[seq, k], ...]}} (padding is
    [-1, -1]) for the first EVIDENCE_ROWS raced rows (and the first row whose values
    differ), `values_not_listed` counting the rest. The sequences that may lose
    their value are those of every writer of a row whose writers' values are not
    all equal."""
    order, starts, rows = race_groups(plan.entry_rep)
    writers = writers_of(layout, plan.entry_pool)[order]
    equal = groups_equal(values.view(np.uint32), plan.entry_rows, order, starts)
    raced = np.flatnonzero(np.isin(rows, np.asarray(race.rows, dtype=np.int64)))
    unequal = raced[~equal[raced]]
    shown = raced[:EVIDENCE_ROWS]
    if unequal.size and unequal[0] not in shown:
        shown = np.append(shown, unequal[0])
    evidence: dict[int, dict] = {
        int(rows[g]): {"equal": bool(equal[g]),
                       "writers": writers[starts[g]:starts[g + 1]].tolist()}
        for g in shown.tolist()}
    extra = {"values_not_listed": int(raced.size - shown.size)} if raced.size > shown.size \
        else {}
    if not unequal.size:
        verdict = "values equal: every racing entry writes the same value"
    else:
        in_unequal = np.repeat(~equal, np.diff(starts))  # per sorted entry
        losers = sorted(set(writers[in_unequal, 0].tolist()) - {-1})
        who = (f"seqs {', '.join(map(str, losers))} may lose their value"
               if losers else "padding entries may lose their value")
        first = int(rows[unequal[0]])
        verdict = (f"values differ on {unequal.size} row(s) (row {first}: "
                   f"{', '.join(_who(tuple(w)) for w in evidence[first]['writers'])}): {who}")
    return Finding(race.code, f"{race.message}; {verdict}", rows=race.rows, seqs=race.seqs,
                   tokens=race.tokens, pools=race.pools,
                   evidence={**race.evidence, "values": evidence, **extra})


def stale_reads(layout: Layout, plan: ScatterPlan, token_seqs: tuple[tuple[int, ...], ...],
                token_pos: np.ndarray, bad: list[np.ndarray], holds: Callable[[int, int, int], str]
                ) -> Finding | None:
    """KP003: the tokens of the ubatch that see a bad pool.

    `bad[s]` [n_pools of s] bool: pool k of s reads wrong (its row, or any racing
    writer's value, differs from the pooling of its current members). A token
    reads pools k < visible[i] of its first seq. `holds(row, s, k)` describes what
    row `row` holds instead of pool s:k's value."""
    first_bad = [int(np.argmax(b)) if b.size and b.any() else -1 for b in bad]
    readers: list[int] = []
    reach: dict[int, int] = {}
    for i, ss in enumerate(token_seqs):
        s = ss[0]
        fb = first_bad[s]
        if 0 <= fb < int(plan.visible[i]):
            readers.append(i)
            reach[s] = max(reach.get(s, 0), int(plan.visible[i]))
    if not readers:
        return None
    pools: list[tuple[int, int]] = []
    rows: list[int] = []
    for s in sorted(reach):
        ks = np.flatnonzero(bad[s][: reach[s]])
        rr = layout.seqs[s].rep_rows.view[ks]
        pools += [(s, k) for k in ks.tolist()]
        rows += rr.tolist()
    i0 = readers[0]
    s0 = token_seqs[i0][0]
    k0 = first_bad[s0]
    row0 = int(layout.seqs[s0].rep_rows.view[k0])
    tokens = tuple((int(token_pos[i]), token_seqs[i][0]) for i in readers)
    more = ""
    if len(readers) > 1 or len(pools) > 1:
        more = f" ({len(readers)} token(s) read {len(pools)} bad pool(s))"
    message = (f"token (pos {tokens[0][0]}, seq {s0}) reads pool {s0}:{k0} at row {row0}, "
               f"which holds {holds(row0, s0, k0)} instead of the pooling of its members"
               + more)
    return Finding("KP003", message, rows=tuple(sorted(set(rows))),
                   seqs=tuple(sorted(reach)), tokens=tokens, pools=tuple(pools),
                   evidence={"reader": list(tokens[0]), "pool": [s0, k0], "row": row0,
                             "holds": holds(row0, s0, k0)})
