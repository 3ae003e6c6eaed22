"""KP005 engine-abort: the engine would abort here (GGML_ASSERT); the replay stops.

Owns: the code, its explanation and the findings the replay raises where the
engine model asserts (`EngineAbort` at an edit or in a ubatch's marking and padding
rows, `KeepTailAssert` at a decode's split).

Invariants: an abort at a ubatch names its first token (and that token's first
sequence); an abort at an edit or a split names nothing but its message.
"""

from __future__ import annotations

from ...contracts.finding import Code, Finding
from ...engine.context import OpContext, UbatchContext
from ..rule import STEP, Explanation, doc
from ..rule import Check as RuleCheck

CODE = Code("KP005", "engine-abort", "error",
            "the engine would abort here (GGML_ASSERT); the replay stops")

EXPLANATION = Explanation(
    CODE,
    oneline="a GGML_ASSERT would abort the process here: the server dies mid-request",
    what=doc("""
        Flags the op or ubatch where the engine would hit a GGML_ASSERT: a partial
        seq_cp under PR #29994, a cross-stream partial copy, seq_add/seq_div on an
        M-RoPE model, a ubatch whose first token is missing from a drifted layout,
        running out of padding rows, a decode of more tokens than the whole cache
        (llama_decode's assert on n_batch). The replay stops there, as the process
        would."""),
    why=doc("""
        An assert takes the whole llama-server down with every slot in it. A trace
        that reaches one means some caller (a server feature, a client API) can
        crash the process."""),
    example=doc("""
        kpool_trace: 1
        name: kp005-engine-abort
        cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..8}
          - seq_cp: {src: 0, dst: 1, p0: 4, p1: 8}"""),
    engine="rep-once",
    fix=doc("""
        Either support the case (cache-safe accepts partial copies; but see KP002) or
        refuse it where the caller can handle a refusal (a return code from the
        memory's seq_cp, checked by the server) instead of asserting."""),
)


class Check(RuleCheck):
    reads = STEP

    def at_op(self, op: OpContext) -> list[Finding]:
        """An abort at an edit or at a decode's split."""
        return [] if op.aborted is None else [Finding(CODE, op.aborted)]

    def at_ubatch(self, ctx: UbatchContext) -> list[Finding]:
        """An abort in a ubatch (its marking or padding rows): it names the ubatch's
        first token."""
        if ctx.abort is None:
            return []
        s = ctx.token_seqs[0][0]
        return [Finding(CODE, ctx.abort, seqs=(s,), tokens=((int(ctx.token_pos[0]), s),))]
