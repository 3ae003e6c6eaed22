"""What a sequence edit means to the k-pool engine: the assertions that abort it
(KP005) and the positions it makes stale (ENGINE.md §4), per engine version.

Owns: `Staleness`, the engine's `stale[s]` (CLEAN, or the first position whose
pools may have regrouped), its table of edits, and `check_edit`, the GGML_ASSERTs an
edit hits before it changes anything.

Invariants:
- `stale[s]` only decreases between cleanings (`stale_set` takes the minimum);
- a position is taken *before* the edit (`before`): the caller asks first, then
  edits the caches, then calls `after`;
- `changed` lists, per op, every sequence whose stale position an edit set (the
  op's event shows them), in the order they were set.
"""

from __future__ import annotations

from collections.abc import Callable

from ..cache.aborts import EngineAbort
from ..cache.cells import llama_pos
from ..trace import model as m
from ..versions import EngineVersion
from .layout import POS_CLEAN


def check_edit(op: m.Op, version: EngineVersion, config: m.CacheConfig) -> None:
    """The GGML_ASSERTs an edit hits before it changes anything (KP005):
    - rep-once (PR #29994) shares whole sequences only: a partial seq_cp aborts;
    - a cross-stream seq_cp (non-unified: a stream per sequence) must be full, by
      llama_kv_cache::seq_cp's own test: a bound counts as partial only when it lies
      strictly inside (0, kv_size - 1);
    - M-RoPE (by-order) caches refuse seq_add and seq_div (n_pos_per_embd() == 1)."""
    if isinstance(op, m.SeqCp):
        if version.seq_cp_whole_only and not op.is_whole:
            raise EngineAbort('GGML_ASSERT(p0 <= 0 && p1 < 0 && "partial seq_cp is not '
                              'supported")')
        size = config.kv_size
        partial = (op.p0 > 0 and op.p0 + 1 < size) or (op.p1 > 0 and op.p1 + 1 < size)
        if not config.unified and op.src != op.dst and partial:
            raise EngineAbort('GGML_ASSERT(is_full && "seq_cp() is only supported for full '
                              'KV buffers")')
    elif isinstance(op, m.SeqAdd | m.SeqDiv) and config.by_order:
        raise EngineAbort(f'GGML_ASSERT(n_pos_per_embd() == 1 && "{op.kind}() is only '
                          'supported for n_pos_per_embd() == 1") (M-RoPE)')


class Staleness:
    """`stale[s]` per sequence under one engine version (ENGINE.md §4)."""

    def __init__(self, n_seq_max: int, version: EngineVersion) -> None:
        self.version = version
        self.stale = [POS_CLEAN] * n_seq_max
        self.changed: dict[int, int] = {}

    def take_changed(self) -> dict[int, int]:
        """The stale positions the edits since the last call set, by sequence."""
        out, self.changed = dict(sorted(self.changed.items())), {}
        return out

    def clean(self) -> None:
        """After a batch's first ubatch (llama_memory_hybrid_idx_context::next)."""
        self.stale = [POS_CLEAN] * len(self.stale)

    def stale_set(self, s: int, p: int) -> None:
        """`p = max(p, 0)`; `stale[s] = min(stale[s], p)` (s < 0: every sequence). A
        sequence that stays clean (p at POS_CLEAN: a seq_rm from INT32_MAX, a seq_add
        whose `p0 + shift` wrapped) is no change."""
        p = max(p, 0)
        for t in range(len(self.stale)) if s < 0 else (s,):
            self.stale[t] = min(self.stale[t], p)
            if self.stale[t] != POS_CLEAN:
                self.changed[t] = self.stale[t]

    def before(self, op: m.Op, pos_min: Callable[[int], int],
               holds_in: Callable[[int, int, int], bool]) -> int | None:
        """`stale_pos(s, p0)`, taken before the edit: 0 when the edit reaches the
        sequence's pos_min (the whole sequence regroups) or s < 0, else p0. seq_add
        uses p0 + shift when it shifts down; other edits stale from 0. `pos_min(s)`
        and `holds_in(s, p0, p1)` read the cache, before the edit.

        None: the edit stales nothing, a seq_rm that finds no cell to remove under a
        version with `seq_rm_noop_keeps_clean` (docs/versions.md, the no-op patch; with
        `seq_rm_noop_one_seq_only`, on a cache of one sequence only, and a seq_rm of
        seq 0 only: the fork's `llama_qsa_noop::inspect` asks `sequence == 0`, so a
        seq_rm(-1) that removes nothing still stales every sequence from 0)."""
        v = self.version
        if (isinstance(op, m.SeqRm) and v.seq_rm_noop_keeps_clean
                and (not v.seq_rm_noop_one_seq_only
                     or (len(self.stale) == 1 and op.seq == 0))
                and not holds_in(op.seq, op.p0, op.p1)):
            return None
        if isinstance(op, m.SeqAdd):
            # the raw p0 (-1 included), summed in int32 (`llama_pos`)
            p0 = llama_pos(op.p0 + op.shift) if op.shift < 0 else op.p0
        elif isinstance(op, m.SeqRm):
            p0 = op.p0
        else:
            return 0
        return 0 if op.seq < 0 or p0 <= pos_min(op.seq) else p0

    def after(self, op: m.Op, pos: int | None, layout_shared: bool) -> None:
        """The table of ENGINE.md §4 for an edit that went through (`pos`: what
        `before` said, None: nothing to stale; `layout_shared`: the layout was shared
        at its last update).

        | edit          | rep-once (PR #29994)  | cache-safe: also              |
        | seq_rm(s)     | stale_set(s, pos)     | while shared: stale_set(-1, 0) |
        | seq_cp        | stale_set(dst, 0)     | stale_set(src, 0)             |
        | seq_keep      | stale_set(-1, 0)      |                               |
        | seq_add(s)    | stale_set(s, pos)     |                               |
        | seq_div(s)    | stale_set(s, 0)       |                               |
        | clear         | stale_set(-1, 0)      |                               |
        | state_read(s) | stale_set(s, 0)       | while shared: stale_set(-1, 0) |
        | state_drop(s) | stale_set(s, 0); s<0: clear | while shared: stale_set(-1, 0) |
        | state_write   | nothing               |                               |"""
        v = self.version
        if pos is None:
            return
        if isinstance(op, m.SeqCp):
            if v.seq_cp_stales_src:
                self.stale_set(op.src, 0)
            self.stale_set(op.dst, 0)
        elif isinstance(op, m.SeqKeep | m.Clear):
            self.stale_set(-1, 0)
        elif isinstance(op, m.SeqRm | m.SeqAdd | m.SeqDiv | m.StateRead | m.StateDrop):
            self.stale_set(op.seq, pos)
            restale = isinstance(op, m.SeqRm | m.StateRead | m.StateDrop)
            if restale and v.restale_all_when_shared and layout_shared:
                self.stale_set(-1, 0)
