"""KP004 pad-collision: a padding entry writes a row that some real pool reads.

Owns: the code, its explanation and `check` (over the ubatch context's plan).

Invariants: the rows are the real pools' rep rows that a padding entry writes,
ascending; the pools are every real pool on them, in pool order.
"""

from __future__ import annotations

from ... import wording as words
from ...arrays import unique
from ...contracts.finding import Code, Finding, PoolIds, RowIds
from ...engine.context import UbatchContext
from ..rule import PLAN, Explanation, doc
from ..rule import Check as RuleCheck

CODE = Code("KP004", "pad-collision", "error",
            "a padding entry writes a row that some real pool reads")

EXPLANATION = Explanation(
    CODE,
    oneline="a padding entry overwrites a real pool's pooled row with padding",
    what=doc("""
        Flags a ubatch whose scatter plan has a padding entry (entries n_new ..
        n_new_g - 1 that keep the graph's shape stable) writing a row that is the
        rep row of a real pool."""),
    why=doc("""
        Padding entries pool garbage (a row repeated) into the row they name. If that
        row is some pool's rep, the pool's key is overwritten for every later reader
        until it is re-pooled, and the entry may also race with the real pool's own
        entry in the same ubatch (KP001)."""),
    example=doc("""
        kpool_trace: 1
        name: kp004-pad-collision
        cache: {kv_size: 16, kpool: 4}
        ops:
          - decode:
              tokens:
                - {pos: 0, seq: [0], cell: 3}
                - {pos: 1, seq: [0], cell: 2}
                - {pos: 2, seq: [0], cell: 1}
                - {pos: 3, seq: [0], cell: 0}
          - decode: {seq: 0, pos: 4}"""),
    engine="rep-once",
    replaces={"name": "row-zero", "padding": "row-zero"},
    fix=doc("""
        Point padding entries at rows no real pool reads: set_input_kpool sorts the
        real pools' rep rows and gives each padding entry its own smallest row that
        is not one of them (`padding="unused-rows"`), asserting when none is left.
        Never use row 0 as a dump row: cell 0 is a real cell."""),
)


class Check(RuleCheck):
    reads = PLAN

    def at_ubatch(self, ctx: UbatchContext) -> list[Finding]:
        return check(ctx)


def check(ctx: UbatchContext) -> list[Finding]:
    """A padding entry writes a row that a real pool reads (its rep row)."""
    plan = ctx.plan
    if plan is None:
        return []
    readers = plan.pad_readers
    if readers.size == 0:
        return []
    hit = unique(plan.pool_cells[readers])
    seq, k = ctx.layout.locate(readers)
    return [Finding(
        CODE,
        f"padding writes {words.counted(hit.size, 'row', number=str)} that real pools read: "
        f"{words.folded(hit, limit=8)}",
        rows=RowIds(hit), seqs=tuple(sorted(set(seq.tolist()))),
        pools=PoolIds.of(seq, k),
    )]
