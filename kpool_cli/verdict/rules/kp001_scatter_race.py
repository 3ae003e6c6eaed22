"""KP001 scatter-race: two or more scatter entries of one ubatch write one row.

Owns: the code, its explanation and its `Check`: at a ubatch, `race_key` (all the
rule reads of the plan: the raced rows, their counts, their writers in entry order
and each writer's group; kept while the plan and groups are the same arrays, and
read unlooked when the context's race groups say the raced ones are the last
plan's, `UbatchContext.raced_kept`) and
`race` (the rows written by two or more entries, from that key; kept while the key's
values are the same); with values, `with_values` (the same finding with the value
backend's evidence: whether each raced row's entries carry equal values, and which
sequences may lose theirs; kept while the key, the groups' equality (or, when every
group writes equal values, `ValueFacts.all_equal`, that alone) and the raced groups
are the same arrays, and then while the key and the raced groups' equality have the
same values).

Invariants: the rows are the context's raced groups, ascending; the pools are the
real entries that write them, in entry order; `with_values` changes neither, only
the message and the evidence.
"""

from __future__ import annotations

import numpy as np

from ... import wording as words
from ...arrays import SameArrays, SameValues
from ...backend.facts import ValueFacts
from ...contracts.finding import EVIDENCE_ROWS, Code, Finding, PoolIds, RowIds
from ...engine.context import UbatchContext
from ..rule import PLAN, Explanation, doc
from ..rule import Check as RuleCheck

CODE = Code("KP001", "scatter-race", "error",
            "two or more scatter entries of one ubatch write one row")

EXPLANATION = Explanation(
    CODE,
    oneline="set_rows splits entries across threads: the row keeps an undefined "
            "writer's value",
    what=doc("""
        Flags a ubatch whose scatter plan has two or more entries that write the same
        row (ggml_set_rows into the pooled slots). With a value backend the finding
        says whether the racing entries carry equal values or not, and which
        sequences may lose theirs."""),
    why=doc("""
        The CPU backend splits set_rows across threads, so the rows two entries write
        are written concurrently: a data race. When the values are equal it is
        "only" undefined behaviour; when they differ, the row ends with one writer's
        pooled key and every other sequence reading it attends with a wrong key.
        This is the race that llama.cpp PR #29994 fixed: before it (cache-safe),
        shared cells made the engine re-pool every pool, and the pools a seq_cp
        shares between sequences were scattered once per sequence."""),
    example=doc("""
        kpool_trace: 1
        name: kp001-scatter-race
        cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - seq_cp: {src: 0, dst: 1}
          - decode:
              tokens:
                - {pos: 4, seq: [0]}
                - {pos: 4, seq: [1]}"""),
    engine="cache-safe",
    fix=doc("""
        Give every row at most one scatter entry per ubatch: mark each rep row once
        (PR #29994's per-row generation array, `rep-once`), so the sequences sharing
        a rep read the one pooled row through pool_cells. Where two pools on one row
        would need different values, that is KP002: fix that first."""),
)


class Check(RuleCheck):
    reads = PLAN

    def __init__(self) -> None:
        # a plan that stands (engine/scatter.py) hands on the last plan's entries and
        # race groups, and the layout's pool_start (what `locate` reads): its race is
        # the last one's (`SameArrays`). A new plan whose raced rows, their writers (in
        # entry order) and those writers' groups are the last one's (a cache-safe slot
        # closing a pool no other slot shares) finds the same race, and the same valued
        # race when the groups' equality of values is the same (`SameValues`): the
        # very findings of the last one
        self._key = SameArrays(race_key)
        self._race = SameValues(race)
        self._valued = SameValues(_valued)
        # and while the key, the groups' equality (every group equal, the backend
        # says: one key, `_EVERY_GROUP_EQUAL`, whatever the count of groups) and the
        # raced groups are the very same arrays, the last valued findings without a
        # look at their values
        self._valued_kept = SameArrays(self._valued_all)
        # the key of the last plan with a raced row: a plan whose raced groups are the
        # last plan's (`UbatchContext.raced_kept`: a cache-safe slot closing a pool no
        # other slot shares, grown from the last plan) reads the same, unlooked
        self._kept_key: tuple[np.ndarray, ...] | None = None

    def _key_of(self, ctx: UbatchContext) -> tuple[np.ndarray, ...]:
        assert ctx.plan is not None
        key = self._kept_key
        if not ctx.raced_kept or key is None:
            key = self._kept_key = self._key(ctx.plan.entry_pool, ctx.order, ctx.starts,
                                             ctx.rows, ctx.layout.pool_start(), ctx=ctx)
        return key

    def at_ubatch(self, ctx: UbatchContext) -> list[Finding]:
        if ctx.plan is None or ctx.raced.size == 0:
            return []
        return [self._race(*self._key_of(ctx)[:3])]

    def with_values(self, ctx: UbatchContext, values: ValueFacts, found: list[Finding]
                    ) -> list[Finding]:
        if not found:
            return found
        # every group writing equal values (a plan that stands, or grew by pools no
        # other writes) is one key, whatever the count of groups
        equal = _EVERY_GROUP_EQUAL if values.all_equal else values.equal
        return self._valued_kept(*self._key_of(ctx), equal, ctx.raced, found=found,
                                 ctx=ctx, equal=values.equal)

    def _valued_all(self, *arrays: np.ndarray, found: list[Finding], ctx: UbatchContext,
                    equal: np.ndarray) -> list[Finding]:
        """`with_values` of `found` by `_valued`: `arrays` are `race_key`'s values, then
        the groups' equality (or `_EVERY_GROUP_EQUAL`) and the raced groups (which
        decide it, `found` being what the key found); `equal`, the equality."""
        *key, _, raced = arrays
        return [self._valued(*key, equal[raced], found=f, ctx=ctx, equal=equal)
                for f in found]


# `with_values`' key for "every group writes equal values" (never read)
_EVERY_GROUP_EQUAL = np.ones(0, dtype=bool)


def race_key(*_kept_by: np.ndarray, ctx: UbatchContext
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What KP001 reads of the plan of `ctx` (which has a raced row): (rows, counts,
    writers, group), the raced rows (ascending), each one's count of entries, the
    [seq, k] of the entries that write them in entry order (PAD_WRITER for padding),
    and the race group of each of those entries (`UbatchContext.raced_writers`).
    (`_kept_by`: the arrays `Check` keeps it by.)"""
    writers, group = ctx.raced_writers()
    return ctx.rows[ctx.raced], ctx.sizes[ctx.raced], writers, group


def race(rows: np.ndarray, counts: np.ndarray, writers: np.ndarray) -> Finding:
    """The rows written by two or more scatter entries of a ubatch (`race_key`'s
    values). set_rows splits entries across threads, so the row's final value has no
    defined writer. Evidence: the entries per row of the first EVIDENCE_ROWS rows."""
    n_rows = int(rows.size)
    real = writers[:, 0] >= 0
    seq, k = writers[real, 0], writers[real, 1]
    pools = PoolIds.of(seq, k)
    seqs = tuple(np.flatnonzero(np.bincount(seq)).tolist())  # ascending seq ids
    n_pad = int(real.size - np.count_nonzero(real))
    who = words.seqs(seqs) if seqs else "padding entries"
    if n_pad and seqs:
        who += " and padding"
    per_row = dict(zip(rows[:EVIDENCE_ROWS].tolist(), counts[:EVIDENCE_ROWS].tolist(),
                       strict=True))
    more = ({"entries_per_row_not_listed": n_rows - EVIDENCE_ROWS}
            if n_rows > EVIDENCE_ROWS else {})
    return Finding(
        CODE,
        f"{words.counted(n_rows, 'row', number=str)} written by more than one scatter "
        f"entry ({who}): "
        f"{words.folded(rows, limit=8)}",
        rows=RowIds(rows), seqs=seqs, pools=pools,
        evidence={"entries_per_row": per_row, **more},
    )


def _valued(*_key: np.ndarray, found: Finding, ctx: UbatchContext, equal: np.ndarray
            ) -> Finding:
    """`with_values` of `found` in `ctx`. (`_key`: `race_key`'s values and the raced
    groups' equality, which decide it.)"""
    return with_values(found, ctx, equal)


def _evidence(ctx: UbatchContext, shown: np.ndarray, equal: list[bool]) -> dict[int, dict]:
    """The value evidence of race groups `shown` of `ctx`, whose entries write equal
    values or not (`equal`): {row: {"equal": bool, "writers": [[seq, k], ...]}}."""
    return {row: {"equal": eq, "writers": w} for row, eq, w in zip(
        ctx.rows[shown].tolist(), equal, ctx.group_writers(shown), strict=True)}


def with_values(found: Finding, ctx: UbatchContext, equal: np.ndarray) -> Finding:
    """`found` (what `race` found in `ctx`) with value evidence. `equal` [n_groups]
    bool: the entries of each race group of `ctx` write equal values (the value
    backend's `ValueFacts.equal`).

    Evidence: {row: {"equal": bool, "writers": [[seq, k], ...]}} (padding is
    [-1, -1]) for the first EVIDENCE_ROWS raced rows (and the first row whose values
    differ), `values_not_listed` counting the rest. The sequences that may lose
    their value are those of every writer of a row whose writers' values are not
    all equal."""
    assert ctx.plan is not None  # a race is found in a plan
    rows, raced = ctx.rows, ctx.raced
    unequal = raced[~equal[raced]]
    shown = raced[:EVIDENCE_ROWS]
    if unequal.size and unequal[0] not in shown:
        shown = np.append(shown, unequal[0])
    evidence = _evidence(ctx, shown, equal[shown].tolist())
    extra = {"values_not_listed": int(raced.size - shown.size)} if raced.size > shown.size \
        else {}
    if not unequal.size:
        verdict = "values equal: every racing entry writes the same value"
    else:
        losers = sorted({w[0] for ws in ctx.group_writers(unequal) for w in ws} - {-1})
        if not losers:
            who = "padding entries may lose their value"
        else:
            who = (f"{words.seqs(losers)} may lose "
                   f"{'its' if len(losers) == 1 else 'their'} value")
        first = int(rows[unequal[0]])
        verdict = (f"values differ on {words.counted(unequal.size, 'row', number=str)} "
                   f"(row {first}: "
                   f"{', '.join(words.writer(w) for w in evidence[first]['writers'])}): {who}")
    return Finding(found.rule, f"{found.message}; {verdict}", rows=found.rows, seqs=found.seqs,
                   tokens=found.tokens, pools=found.pools,
                   evidence={**found.evidence, "values": evidence, **extra})
