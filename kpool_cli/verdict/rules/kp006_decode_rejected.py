"""KP006 decode-rejected: llama_decode would refuse the batch; nothing applied.

Owns: the code (a warning), its explanation and `finding`, which the replay raises
when a decode fails validation, the split, or find_slot.

Invariants: the finding carries the refusal's message only; a refused decode
changes nothing.
"""

from __future__ import annotations

from ...contracts.finding import Code, Finding
from ...engine.context import OpContext
from ..rule import Check as RuleCheck
from ..rule import Explanation, doc

CODE = Code("KP006", "decode-rejected", "warning",
            "llama_decode would refuse the batch; nothing applied")

EXPLANATION = Explanation(
    CODE,
    oneline="llama_decode refuses the batch: nothing of it is applied (a warning)",
    what=doc("""
        Flags a decode that llama_decode would refuse (llama_batch_allocr::init's
        validation, a coupled batch on a sequential split, or find_slot finding no
        free cells, as for a decode larger than its own stream of a non-unified
        cache; past the whole cache it is KP005). Nothing of the batch
        is applied, and the replay goes on, as the caller of llama_decode does. A
        warning: it fails the run only with `--fail-on warning`."""),
    why=doc("""
        The engine is right to refuse, but the caller's bookkeeping (a slot's
        positions, its cells) no longer matches the cache: positions with a gap,
        coupled sequences that have diverged, a full cache. The next decodes of that
        slot will likely be refused too."""),
    example=doc("""
        kpool_trace: 1
        name: kp006-decode-rejected
        cache: {kv_size: 16, kpool: 4}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - decode: {seq: 0, pos: 6}"""),
    engine="rep-once",
    fix=doc("""
        Nothing in the k-pool engine: fix the caller (continue each sequence at
        seq_pos_max + 1, keep coupled sequences in step, free cells before
        decoding). If the engine itself issues the batch, validate it first."""),
)


class Check(RuleCheck):
    def at_op(self, op: OpContext) -> list[Finding]:
        """A decode llama_decode refused."""
        if op.kind != "decode" or op.refused is None:
            return []
        return [Finding(CODE, op.refused)]
