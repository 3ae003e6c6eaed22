"""What each finding code means, written like ruff's rule docs (STYLE.md §3): What it
does, Why is this bad?, Example (a minimal trace), How to fix the engine. `kpool
explain CODE` prints one; the rich view quotes `oneline` under each finding.

Owns: `EXPLANATIONS` (one per code of `codes.CODES`, same keys) and `explain_text`.
Invariant, held by tests/test_view.py: every `example` loads with
`load_trace_text` and raises its code when replayed under `engine` (a registered
engine name, or the `EngineVersion` built by `plugin`), with a value backend when
`needs_values`.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from .codes import CODES, CodeLookup


@dataclass(frozen=True, slots=True)
class Explanation(CodeLookup):
    code: str
    oneline: str  # why it matters, in one line (the rich view's finding panels)
    what: str
    why: str
    example: str  # a minimal YAML trace that raises the code under `engine`
    engine: str  # the registered engine the example runs under (or the plug-in's base)
    fix: str
    plugin: str = ""  # replace(<engine>, ...) arguments when the example needs a plug-in
    needs_values: bool = False  # the example needs a value backend (not --backend none)

    @property
    def command(self) -> str:
        if self.plugin:
            return "kpool replay example.yaml --engine mypkg.myengine:Version"
        return f"kpool replay example.yaml --engine {self.engine}"


def _t(text: str) -> str:
    return textwrap.dedent(text).strip()


EXPLANATIONS: dict[str, Explanation] = {e.code: e for e in (
    Explanation(
        "KP001",
        oneline="set_rows splits entries across threads: the row keeps an undefined "
                "writer's value",
        what=_t("""
            Flags a ubatch whose scatter plan has two or more entries that write the same
            row (ggml_set_rows into the pooled slots). With a value backend the finding
            says whether the racing entries carry equal values or not, and which
            sequences may lose theirs."""),
        why=_t("""
            The CPU backend splits set_rows across threads, so the rows two entries write
            are written concurrently: a data race. When the values are equal it is
            "only" undefined behaviour; when they differ, the row ends with one writer's
            pooled key and every other sequence reading it attends with a wrong key.
            This is the race that llama.cpp PR #29994 fixed: before it (cache-safe),
            shared cells made the engine re-pool every pool, and the pools a seq_cp
            shares between sequences were scattered once per sequence."""),
        example=_t("""
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
        fix=_t("""
            Give every row at most one scatter entry per ubatch: mark each rep row once
            (PR #29994's per-row generation array, `rep-once`), so the sequences sharing
            a rep read the one pooled row through pool_cells. Where two pools on one row
            would need different values, that is KP002: fix that first."""),
    ),
    Explanation(
        "KP002",
        oneline="one pooled row cannot hold two different poolings: some sequence reads "
                "the wrong one",
        what=_t("""
            Flags the ubatch where a rep row becomes the rep of two or more pools whose
            member rows differ (reported once, where the condition appears; it persists
            until the layout changes)."""),
        why=_t("""
            A rep row has a single pooled slot. Pools that share it must share their
            members too, or the slot holds one pool's value and the other pools are read
            wrong (KP003), or it is raced every ubatch (KP001 with different values).
            It arises from partial seq_cp (a shared cell that ends pools of different
            groupings) and from coupled tokens (one cell carrying several sequences whose
            earlier cells differ)."""),
        example=_t("""
            kpool_trace: 1
            name: kp002-rep-conflict
            cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
            ops:
              - decode: {seq: 0, pos: 0..2}
              - decode: {seq: 1, pos: 0..2}
              - decode: {seq: [0, 1], pos: 2..4}"""),
        engine="rep-once",
        fix=_t("""
            Never let a shared cell end pools of different groupings: refuse partial
            copies (PR #29994 asserts a whole-sequence seq_cp), and give a sequence whose
            pool would end on a cell shared with a differently grouped sequence a pooled
            row of its own (or refuse coupled tokens whose sequences' cells differ)."""),
    ),
    Explanation(
        "KP003",
        oneline="attention reads a pooled key that is not the pooling of the pool's "
                "members: silent corruption",
        what=_t("""
            Flags a ubatch in which a token sees (through pool_cells) a pool whose rep
            row holds something other than the pooling of that pool's current members
            with their current keys: another pool's value, a stale value, a zeroed
            slot. Needs a value backend (`--backend numba` or `numpy`)."""),
        why=_t("""
            Nothing crashes and nothing warns: the indexer scores the token against a
            wrong pooled key and picks the wrong blocks for sparse attention. Output
            quality degrades silently, only for the sequences whose rows were
            overwritten, which makes the bug look like a model problem."""),
        example=_t("""
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
        needs_values=True,
        fix=_t("""
            Re-pool (mark) every pool whose members or member keys changed since its row
            was written, before any token reads it: stale the sequences an edit
            regroups, and keep one pooled row per grouping (see KP002). The rep-once
            engine marks only the first pool on a shared rep; that is right only when
            the pools on it have the same members."""),
    ),
    Explanation(
        "KP004",
        oneline="a padding entry overwrites a real pool's pooled row with padding",
        what=_t("""
            Flags a ubatch whose scatter plan has a padding entry (entries n_new ..
            n_new_g - 1 that keep the graph's shape stable) writing a row that is the
            rep row of a real pool."""),
        why=_t("""
            Padding entries pool garbage (a row repeated) into the row they name. If that
            row is some pool's rep, the pool's key is overwritten for every later reader
            until it is re-pooled, and the entry may also race with the real pool's own
            entry in the same ubatch (KP001)."""),
        example=_t("""
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
        plugin='name="row-zero", padding="row-zero"',
        fix=_t("""
            Point padding entries at rows no real pool reads: set_input_kpool sorts the
            real pools' rep rows and gives each padding entry its own smallest row that
            is not one of them (`padding="unused-rows"`), asserting when none is left.
            Never use row 0 as a dump row: cell 0 is a real cell."""),
    ),
    Explanation(
        "KP005",
        oneline="a GGML_ASSERT would abort the process here: the server dies mid-request",
        what=_t("""
            Flags the op or ubatch where the engine would hit a GGML_ASSERT: a partial
            seq_cp under PR #29994, a cross-stream partial copy, seq_add/seq_div on an
            M-RoPE model, a ubatch whose first token is missing from a drifted layout,
            running out of padding rows. The replay stops there, as the process would."""),
        why=_t("""
            An assert takes the whole llama-server down with every slot in it. A trace
            that reaches one means some caller (a server feature, a client API) can
            crash the process."""),
        example=_t("""
            kpool_trace: 1
            name: kp005-engine-abort
            cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
            ops:
              - decode: {seq: 0, pos: 0..8}
              - seq_cp: {src: 0, dst: 1, p0: 4, p1: 8}"""),
        engine="rep-once",
        fix=_t("""
            Either support the case (cache-safe accepts partial copies; but see KP002) or
            refuse it where the caller can handle a refusal (a return code from the
            memory's seq_cp, checked by the server) instead of asserting."""),
    ),
    Explanation(
        "KP006",
        oneline="llama_decode refuses the batch: nothing of it is applied (a warning)",
        what=_t("""
            Flags a decode that llama_decode would refuse (llama_batch_allocr::init's
            validation, a coupled batch on a sequential split, or find_slot finding no
            free cells). Nothing of the batch is applied. A warning: it fails the run
            only with `--fail-on warning`."""),
        why=_t("""
            The engine is right to refuse, but the caller's bookkeeping (a slot's
            positions, its cells) no longer matches the cache: positions with a gap,
            coupled sequences that have diverged, a full cache. The next decodes of that
            slot will likely be refused too."""),
        example=_t("""
            kpool_trace: 1
            name: kp006-decode-rejected
            cache: {kv_size: 16, kpool: 4}
            ops:
              - decode: {seq: 0, pos: 0..4}
              - decode: {seq: 0, pos: 6}"""),
        engine="rep-once",
        fix=_t("""
            Nothing in the k-pool engine: fix the caller (continue each sequence at
            seq_pos_max + 1, keep coupled sequences in step, free cells before
            decoding). If the engine itself issues the batch, validate it first."""),
    ),
    Explanation(
        "KP007",
        oneline="the layout's cached positions no longer match the cells: pools are "
                "grouped wrong from here on",
        what=_t("""
            Flags the ubatch where a sequence's incremental layout (the (pos, cell)
            pairs it appended to since its last rebuild) stops matching a rebuild from
            the sequence's cells. The replay goes on with the drifted layout, as the
            engine does."""),
        why=_t("""
            Pools are groups of positions. An edit that moves positions without staling
            every sequence it affects (a seq_add on cells another sequence shares: pos
            belongs to the cell) leaves that sequence's layout with old positions: its
            pools group the wrong cells, its new tokens append after the wrong pair, and
            a later ubatch may not find its first token at all (KP005)."""),
        example=_t("""
            kpool_trace: 1
            name: kp007-layout-drift
            cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
            ops:
              - decode: {seq: 0, pos: 0..8}
              - seq_cp: {src: 0, dst: 1}
              - decode: {seq: 1, pos: 8..10}
              - seq_add: {seq: 0, p0: 4, p1: 8, shift: 1}
              - decode: {seq: 1, pos: 10}"""),
        engine="rep-once",
        fix=_t("""
            Stale every sequence an edit moves: in seq_add/seq_div, stale each sequence
            that shares a moved cell (or every sequence while cells are shared), from
            the smallest moved position."""),
    ),
    Explanation(
        "KP008",
        oneline="the memory refuses a seq_rm: the recurrent state cannot be cut, nothing "
                "changed (a warning)",
        what=_t("""
            Flags a seq_rm that llama_memory_hybrid_idx::seq_rm returns false for: its
            recurrent child (llama_memory_recurrent::seq_rm) refuses a removal that
            cuts into a sequence's state, 0 < p0 <= last pos < p1, unless it is a
            rollback of 1..n_rs_seq tokens with no rollback pending; it also refuses a
            negative seq id. The hybrid memory asks it first, so no cache changes and no
            sequence is staled. A warning: it fails the run only with
            `--fail-on warning`."""),
        why=_t("""
            A speculative-decoding server removes the rejected draft tail with
            seq_rm(s, p, -1). Without rollback snapshots (n_rs_seq 0, no MTP), or with a
            rollback already pending, the removal is refused: the cells of the rejected
            draft stay in the cache, and if the caller does not check the return value,
            its next decode starts at the wrong position (refused, KP006) or reads the
            draft's keys as context."""),
        example=_t("""
            kpool_trace: 1
            name: kp008-edit-refused
            cache: {kv_size: 16, kpool: 4, n_rs_seq: 0}
            ops:
              - decode: {seq: 0, pos: 0..8}
              - seq_rm: {seq: 0, p0: 6, p1: -1}"""),
        engine="rep-once",
        fix=_t("""
            Nothing in the k-pool engine: give the memory rollback snapshots
            (n_rs_seq at least the draft depth), remove one draft tail per decode, and
            check seq_rm's return value (on false, clear the sequence and re-decode)."""),
    ),
)}


def explain_text(code: str) -> str:
    """The plain text of `kpool explain CODE` (ruff's headings)."""
    e = EXPLANATIONS[code]
    ind = textwrap.indent
    engine = (f"a plug-in engine: replace({e.engine.upper().replace('-', '_')}, {e.plugin})"
              if e.plugin else e.engine)
    values = ", with a value backend (the default)" if e.needs_values else ""
    return "\n".join([
        f"{e.code} {e.name} ({e.severity})",
        "",
        textwrap.fill(f"{e.oneline}.", 78, initial_indent="  ", subsequent_indent="  "),
        "",
        "What it does",
        ind(e.what, "  "),
        "",
        "Why is this bad?",
        ind(e.why, "  "),
        "",
        textwrap.fill(f"Example (under {engine}{values})", 80, subsequent_indent="  "),
        ind(e.example, "    "),
        "",
        f"  $ {e.command}",
        "",
        "How to fix the engine",
        ind(e.fix, "  "),
        "",
    ])


def resolve(word: str) -> str | None:
    """A code from `KP001`, `kp1`, `1` or a name (`scatter-race`)."""
    w = word.strip().lower()
    for c in CODES.values():
        if w == c.name:
            return c.code
    digits = w[2:] if w.startswith("kp") else w
    if digits.isdigit():
        code = f"KP{int(digits):03d}"
        return code if code in CODES else None
    return None
