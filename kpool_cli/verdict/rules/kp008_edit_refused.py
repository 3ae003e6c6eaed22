"""KP008 edit-refused: the memory refuses a seq_rm (the recurrent state cannot be cut);
nothing changed.

Owns: the code (a warning), its explanation and `finding`, which the replay raises
when the recurrent child refuses a seq_rm (`EditRefused`).

Invariants: the finding names the sequence of the refused seq_rm, none for a
negative seq id.
"""

from __future__ import annotations

from ...contracts.finding import Code, Finding
from ...engine.context import OpContext
from ..rule import Check as RuleCheck
from ..rule import Explanation, doc

CODE = Code("KP008", "edit-refused", "warning",
            "the memory refuses a seq_rm (the recurrent state cannot be cut); nothing "
            "changed")

EXPLANATION = Explanation(
    CODE,
    oneline="the memory refuses a seq_rm: the recurrent state cannot be cut, nothing "
            "changed (a warning)",
    what=doc("""
        Flags a seq_rm that llama_memory_hybrid_idx::seq_rm returns false for: its
        recurrent child (llama_memory_recurrent::seq_rm) refuses a removal that
        cuts into a sequence's state, 0 < p0 <= last pos < p1, unless it is a
        rollback of 1..n_rs_seq tokens with no rollback pending; for a negative seq
        id (every sequence) it refuses a range that holds neither every position
        nor none (a whole-range seq_rm(-1) clears every sequence). The hybrid memory
        asks it first, so no cache changes and no sequence is staled. A warning: it
        fails the run only with `--fail-on warning`."""),
    why=doc("""
        A speculative-decoding server removes the rejected draft tail with
        seq_rm(s, p, -1). Without rollback snapshots (n_rs_seq 0, no MTP), or with a
        rollback already pending, the removal is refused: the cells of the rejected
        draft stay in the cache, and if the caller does not check the return value,
        its next decode starts at the wrong position (refused, KP006) or reads the
        draft's keys as context."""),
    example=doc("""
        kpool_trace: 1
        name: kp008-edit-refused
        cache: {kv_size: 16, kpool: 4, n_rs_seq: 0}
        ops:
          - decode: {seq: 0, pos: 0..8}
          - seq_rm: {seq: 0, p0: 6, p1: -1}"""),
    engine="rep-once",
    fix=doc("""
        Nothing in the k-pool engine: give the memory rollback snapshots
        (n_rs_seq at least the draft depth), remove one draft tail per decode, and
        check seq_rm's return value (on false, clear the sequence and re-decode)."""),
)


class Check(RuleCheck):
    def at_op(self, op: OpContext) -> list[Finding]:
        """An edit the memory refused (a seq_rm its recurrent child will not cut)."""
        if op.kind == "decode" or op.refused is None:
            return []
        return [Finding(CODE, op.refused, seqs=(op.seq,) if op.seq >= 0 else ())]
