"""KP003 stale-read: a token sees a pool whose row differs from the pooling of its
current members.

Owns: the code (value-only: a model-only replay does not look for it), its
explanation and its `Check`, which reads the value backend's facts once it has
verified the pools (which pools read wrong, `bad`, and what the first bad pool's row
holds instead) and words them (`holds`).

Invariants: a token reads pools k < visible[i] of its first sequence; the finding
names every reading token, and for each reading sequence its bad pools up to the
furthest any of its tokens sees.
"""

from __future__ import annotations

import numpy as np

from ... import wording as words
from ...backend import facts as f
from ...backend.facts import RowContent, ValueFacts
from ...contracts.finding import Code, Finding, PoolIds, RowIds
from ...engine.context import UbatchContext
from ..rule import PLAN, Explanation, doc
from ..rule import Check as RuleCheck

CODE = Code("KP003", "stale-read", "error",
            "a token sees a pool whose row differs from the pooling of its current members",
            values_only=True)

EXPLANATION = Explanation(
    CODE,
    oneline="attention reads a pooled key that is not the pooling of the pool's "
            "members: silent corruption",
    what=doc("""
        Flags a ubatch in which a token sees (through pool_cells) a pool whose rep
        row holds something other than the pooling of that pool's current members
        with their current keys: another pool's value, a stale value, a zeroed
        slot. Needs a value backend (`--backend numba` or `numpy`)."""),
    why=doc("""
        Nothing crashes and nothing warns: the indexer scores the token against a
        wrong pooled key and picks the wrong blocks for sparse attention. Output
        quality degrades silently, only for the sequences whose rows were
        overwritten, which makes the bug look like a model problem."""),
    example=doc("""
        kpool_trace: 1
        name: kp003-stale-read
        cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..2}
          - decode: {seq: 1, pos: 0..2}
          - decode: {seq: [0, 1], pos: 2}
          - decode: {seq: [0, 1], pos: 3}
          - decode: {seq: 1, pos: 4}"""),
    engine="rep-once",
    fix=doc("""
        Re-pool (mark) every pool whose members or member keys changed since its row
        was written, before any token reads it: stale the sequences an edit
        regroups, and keep one pooled row per grouping (see KP002). The rep-once
        engine marks only the first pool on a shared rep; that is right only when
        the pools on it have the same members."""),
)


class Check(RuleCheck):
    reads = PLAN

    def with_values(self, ctx: UbatchContext, values: ValueFacts, found: list[Finding]
                    ) -> list[Finding]:
        finding = check(ctx, values)
        return found if finding is None else [*found, finding]


def check(ctx: UbatchContext, values: ValueFacts) -> Finding | None:
    """The tokens of the ubatch that see a bad pool (`values.bad[s]` [n_pools of s]
    bool: pool k of s reads wrong)."""
    assert ctx.plan is not None  # the backend runs on a plan
    if not values.first_bad:  # no sequence has a bad pool: no token reads one
        return None
    layout, visible, token_seqs, bad = ctx.layout, ctx.plan.visible, ctx.token_seqs, values.bad
    first_bad = {s: k for s, (k, _row, _c) in values.first_bad.items()}
    readers: list[int] = []
    reach: dict[int, int] = {}
    for i, ss in enumerate(token_seqs):
        s = ss[0]
        fb = first_bad.get(s, -1)
        if 0 <= fb < int(visible[i]):
            readers.append(i)
            reach[s] = max(reach.get(s, 0), int(visible[i]))
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
    k0, row0, content = values.first_bad[s0]
    said = holds(content, s0, k0)
    tokens = tuple((int(ctx.token_pos[i]), token_seqs[i][0]) for i in readers)
    more = ""
    if len(readers) > 1 or len(pools) > 1:
        more = (f" ({words.counted(len(readers), 'token', number=str)} "
                f"{'reads' if len(readers) == 1 else 'read'} "
                f"{words.counted(len(pools), 'bad pool', number=str)})")
    message = (f"token (pos {tokens[0][0]}, seq {s0}) reads pool {s0}:{k0} at row {row0}, "
               f"which holds {said} instead of the pooling of its members" + more)
    return Finding(CODE, message, rows=RowIds(sorted(set(rows))),
                   seqs=tuple(sorted(reach)), tokens=tokens, pools=PoolIds(pools),
                   evidence={"reader": list(tokens[0]), "pool": [s0, k0], "row": row0,
                             "holds": said})


def holds(c: RowContent, s: int, k: int) -> str:
    """What a row holds (`c`), said for a reader of pool s:k."""
    when = c.ubatch
    if c.racers:
        other = next((w for w in c.racers if w != (s, k)), c.racers[0])
        who = "a padding entry" if other == (-1, -1) else f"pool {words.writer(other)}"
        names = ", ".join(words.writer(w) for w in c.racers)
        return (f"{who}'s value when that entry wins the race of ubatch {when} "
                f"(entries of {names}: no defined winner)")
    if c.kind == f.POOLED:
        what = ("its own value from before its members changed" if (c.a, c.b) == (s, k)
                else f"pool {c.a}:{c.b}'s value")
        return f"{what} (written at ubatch {when})"
    return {
        f.PADDING: f"a padding entry's value (written at ubatch {when})",
        f.DECODE_ZERO: f"a slot zeroed by the decode at ubatch {when}",
        f.DROP_ZERO: f"a slot zeroed by a state_drop before ubatch {when}",
        f.RESTORED: f"a slot restored from snapshot {c.snapshot!r} before ubatch {when}",
        f.COPIED: f"a slot copied from stream {c.a} before ubatch {when}",
        f.CLEARED: f"a slot zeroed by clear before ubatch {when}",
    }.get(c.kind, "a never-written slot")
