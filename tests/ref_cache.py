"""An independent reference for ENGINE.md §2-§4: the cells, their edits, a decode's
validation, split and placement, and the staleness of each engine version.

Written from ENGINE.md and the llama.cpp functions it cites, not from kpool's modules:
nothing here imports `kpool_cli` except the trace model's plain dataclasses. Plain
Python lists, sets and dicts, one function per llama.cpp function, each rule citing
where it comes from. Where the real code and ENGINE.md differ, the real code wins, as
docs/ENGINE-NOTES.md lists (the rows are tested facts); those places say "NOTES:".

Per ubatch the reference also keeps its own *incremental* layout (ENGINE.md §5): the
cache-safe staleness rules of §4 ask whether "the layout is shared", a flag that only
the incremental layout has (it is sticky: re-derived on a rebuild only, §5 step 3).
With that layout, the §6-§7 decisions (marking, graph size, scatter plan, visibility,
aborts) come from the from-scratch functions of tests/reference.py, applied to this
reference's own layout, so they agree with the engine even where its layout drifted.

The hybrid memory's recurrent child (llama_memory_recurrent, `size == n_seq_max`
cells, `n_rs_seq` rollback snapshots per sequence) is modelled too, from
src/llama-memory-recurrent.cpp: its edits (a seq_rm it refuses changes nothing anywhere:
llama_memory_hybrid_idx::seq_rm asks it first; kpool reports KP008), its find_slot per
ubatch, the pending rollbacks that a ubatch's s_copy input consumes, its state
save/restore, the hybrid positions a batch is validated against
(llama_memory_hybrid::seq_pos_min/max) and split_equal's n_keep_tail step (the trailing
n_rs_seq + 1 tokens of a sequence stay in one ubatch; GGML_ASSERT(n_ubatch >
n_keep_tail)). Not modelled: the recurrent rows' values (r/s tensors, src/src0/rs_z), a
recurrent child that keeps no layer (is_empty()).

Not modelled, like kpool (docs/ENGINE-NOTES.md, "Not followed, on purpose"): SWA,
split_seq.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import reference as ref57  # ENGINE.md §5-§7 from scratch: plain Python, no kpool import

from kpool_cli.trace.model import (
    Clear,
    Decode,
    Expect,
    Note,
    SeqAdd,
    SeqCp,
    SeqDiv,
    SeqKeep,
    SeqRm,
    StateDrop,
    StateRead,
    StateWrite,
    Token,
    Trace,
)

CLEAN = (1 << 31) - 1  # llama_memory_hybrid_idx::POS_CLEAN
POS_MAX = (1 << 31) - 1  # std::numeric_limits<llama_pos>::max()


def i32(x: int) -> int:
    """x as an int32_t (llama_pos) holds it: two's complement, wrapped."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def u32(x: int) -> int:
    """x as a uint32_t holds it."""
    return x & 0xFFFFFFFF
ENGINES = ("rep-once", "cache-safe")

APPLIED, REJECTED, ABORTED = "applied", "rejected", "aborted"
EDIT_REFUSED = "edit refused"  # internal: a rejected edit with KP008


# == §2: one stream of cells (llama_kv_cells) ==========================================


class Cells:
    """llama_kv_cells: per cell a pos (-1 = empty), an ext and a set of sequences; and
    `has_shift`, which pos_add and pos_div set and reset() and reset_shift() clear."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pos = [-1] * size
        self.ext = [(0, 0)] * size
        self.seq: list[set[int]] = [set() for _ in range(size)]
        self.has_shift = False

    def is_empty(self, i: int) -> bool:
        return self.pos[i] == -1

    def get_used(self) -> int:
        return sum(1 for p in self.pos if p != -1)

    def pos_in(self, i: int, p0: int, p1: int) -> bool:
        """llama_kv_cells::pos_in: p0 <= pos < p1 (an empty cell's -1 never is: p0 >= 0)."""
        return p0 <= self.pos[i] < p1

    def seq_has(self, i: int, s: int) -> bool:
        return s in self.seq[i]

    def seq_count(self, i: int) -> int:
        return len(self.seq[i])

    def rm(self, i: int) -> None:
        """llama_kv_cells::rm: the cell becomes empty."""
        self.pos[i] = -1
        self.ext[i] = (0, 0)
        self.seq[i] = set()

    def seq_rm(self, i: int, s: int) -> bool:
        """llama_kv_cells::seq_rm: drop s; True when the cell became empty."""
        self.seq[i].discard(s)
        if not self.seq[i]:
            self.rm(i)
            return True
        return False

    def seq_keep(self, i: int, s: int) -> bool:
        """llama_kv_cells::seq_keep: a cell of s keeps only s; any other live cell
        empties (True)."""
        if s in self.seq[i]:
            self.seq[i] = {s}
            return False
        if self.seq[i]:
            self.rm(i)
            return True
        return False

    def seq_add(self, i: int, s: int) -> None:
        self.seq[i].add(s)

    def pos_add(self, i: int, d: int) -> bool:
        """llama_kv_cells::pos_add: True when the pos dropped below 0 (the cell empties)."""
        self.pos[i] = i32(self.pos[i] + d)  # pos[i] += d, an int32_t
        self.has_shift = True
        if self.pos[i] < 0:
            self.rm(i)
            return True
        return False

    def pos_div(self, i: int, d: int) -> None:
        self.pos[i] //= d  # pos >= 0 and d >= 1: C++ truncation is floor here
        self.has_shift = True  # even when the pos stays

    def seq_pos_min(self, s: int) -> int:
        ps = [self.pos[i] for i in range(self.size) if s in self.seq[i]]
        return min(ps) if ps else -1

    def seq_pos_max(self, s: int) -> int:
        ps = [self.pos[i] for i in range(self.size) if s in self.seq[i]]
        return max(ps) if ps else -1

    def reset(self) -> None:
        for i in range(self.size):
            self.rm(i)
        self.has_shift = False

    def pairs(self, s: int) -> list[tuple[int, int]]:
        """ENGINE.md §2: s's (pos, cell) pairs, ordered by pos, then cell."""
        return sorted((self.pos[i], i) for i in range(self.size) if s in self.seq[i])


def resolve(p0: int, p1: int) -> tuple[int, int]:
    """`if (p0 < 0) p0 = 0; if (p1 < 0) p1 = max`, as every llama_kv_cache edit does."""
    return (0 if p0 < 0 else p0), (POS_MAX if p1 < 0 else p1)


@dataclass
class Group:
    """One stream's part of a ubatch placement (slot_info: strm[s], idxs[s]); `tokens`
    are indices into the ubatch's token list, in ubatch order."""

    strm: int
    tokens: list[int]
    idxs: list[int] = field(default_factory=list)


class RefCache:
    """llama_kv_cache: `n_stream` Cells, a head per stream (v_heads), the queued stream
    copies (sc_info) and the state snapshots."""

    def __init__(self, cfg, seen: Counter | None = None) -> None:
        self.cfg = cfg
        self.unified = cfg.unified
        self.kv_size = cfg.kv_size
        self.n_stream = 1 if cfg.unified else cfg.n_seq_max
        self.v_cells = [Cells(cfg.kv_size) for _ in range(self.n_stream)]
        self.v_heads = [0] * self.n_stream
        self.sc_info: list[tuple[int, int]] = []  # (src stream, dst stream)
        self.snapshots: dict[str, list[tuple[int, tuple[int, int]]]] = {}
        self.seen = seen if seen is not None else Counter()

    # -- queries -----------------------------------------------------------------------

    def seq_to_stream(self, s: int) -> int:
        """ENGINE.md §2: unified, every sequence in stream 0; else stream s is seq s."""
        return 0 if self.unified else s

    def cells_of(self, s: int) -> Cells:
        return self.v_cells[self.seq_to_stream(s)]

    def seq_pos_min(self, s: int) -> int:
        return self.cells_of(s).seq_pos_min(s)

    def seq_pos_max(self, s: int) -> int:
        return self.cells_of(s).seq_pos_max(s)

    # -- edits (llama_kv_cache::seq_*) -----------------------------------------------------

    def seq_rm(self, s: int, p0: int, p1: int) -> None:
        """llama_kv_cache::seq_rm: head = min(head, first cell freed)."""
        p0, p1 = resolve(p0, p1)
        streams = [self.seq_to_stream(s)] if s >= 0 else list(range(self.n_stream))
        for strm in streams:
            cells = self.v_cells[strm]
            new_head = cells.size
            for i in range(cells.size):
                if not cells.pos_in(i, p0, p1):
                    continue
                if s >= 0:
                    freed = cells.seq_has(i, s) and cells.seq_rm(i, s)
                else:
                    cells.rm(i)
                    freed = True
                if freed and new_head == cells.size:
                    new_head = i
            if new_head != cells.size and new_head < self.v_heads[strm]:
                self.v_heads[strm] = new_head

    @staticmethod
    def is_full(p0: int, p1: int, size: int) -> bool:
        """llama_kv_cache::seq_cp, cross-stream: a bound is partial only when strictly
        inside (0, size - 1)."""
        return not ((p0 > 0 and p0 + 1 < size) or (p1 > 0 and p1 + 1 < size))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """llama_kv_cache::seq_cp. Same stream: dst joins src's cells in [p0, p1) (NOTES:
        dst keeps its own cells). Cross-stream (the caller has checked is_full): queue
        the row copy, reset dst's stream, copy every cell of src (the range is ignored,
        NOTES) with pos and ext, holding only dst, and copy src's head."""
        s0, s1 = self.seq_to_stream(src), self.seq_to_stream(dst)
        if s0 == s1:
            if src == dst:
                return
            p0, p1 = resolve(p0, p1)
            cells = self.v_cells[s0]
            for i in range(cells.size):
                if cells.pos_in(i, p0, p1) and cells.seq_has(i, src):
                    cells.seq_add(i, dst)
            return
        self.sc_info.append((s0, s1))
        a, b = self.v_cells[s0], self.v_cells[s1]
        b.reset()
        for i in range(a.size):
            if a.seq_has(i, src):
                b.pos[i] = a.pos[i]
                b.ext[i] = a.ext[i]
                b.seq_add(i, dst)
        self.v_heads[s1] = self.v_heads[s0]

    def seq_keep(self, s: int, every_stream: bool = False) -> None:
        """llama_kv_cache::seq_keep: only s's stream (ggml-org 001d906), or with
        `every_stream` each stream in turn (angt d5437c2: "keep only seq_id in every
        stream"); per stream, head = min(head, first freed)."""
        for strm in range(len(self.v_cells)) if every_stream else [self.seq_to_stream(s)]:
            cells = self.v_cells[strm]
            new_head = cells.size
            for i in range(cells.size):
                if cells.seq_keep(i, s) and new_head == cells.size:
                    new_head = i
            if new_head != cells.size and strm != self.seq_to_stream(s):
                self.seen["seq_keep that empties another stream"] += 1
            if new_head != cells.size and new_head < self.v_heads[strm]:
                self.v_heads[strm] = new_head

    def seq_add(self, s: int, p0: int, p1: int, shift: int) -> None:
        """llama_kv_cache::seq_add: a zero shift or p0 == p1 (after clamping) returns
        first; else head = first freed cell, or 0 (NOTES: a reversed range too)."""
        if shift == 0:
            return
        p0, p1 = resolve(p0, p1)
        if p0 == p1:
            return
        strm = self.seq_to_stream(s)
        cells = self.v_cells[strm]
        new_head = cells.size
        for i in range(cells.size):
            moved = cells.pos_in(i, p0, p1) and cells.seq_has(i, s)
            if moved and cells.pos_add(i, shift) and new_head == cells.size:
                new_head = i
        self.v_heads[strm] = new_head if new_head != cells.size else 0

    def seq_div(self, s: int, p0: int, p1: int, d: int) -> None:
        """llama_kv_cache::seq_div: never moves head (NOTES)."""
        if d == 1:
            return
        p0, p1 = resolve(p0, p1)
        if p0 == p1:
            return
        cells = self.cells_of(s)
        for i in range(cells.size):
            if cells.pos_in(i, p0, p1) and cells.seq_has(i, s):
                cells.pos_div(i, d)

    def clear(self) -> None:
        """llama_kv_cache::clear: every cell empty, every head 0; sc_info is left alone
        (NOTES: the queued stream copies stay queued)."""
        if self.sc_info:
            self.seen["clear with copies pending"] += 1
        for strm in range(self.n_stream):
            self.v_cells[strm].reset()
            self.v_heads[strm] = 0

    def memory_update(self) -> bool:
        """llama_context::memory_update(false), run by llama_context::decode once the
        batch is valid: llama_kv_cache::init_update takes do_shift = any stream's
        has_shift and the queued copies; its status is NO_UPDATE when there are
        neither (False: nothing more runs), else SUCCESS (True): apply() runs
        llama_kv_cache::update, the copies and then the shift (every stream's
        reset_shift), and llama_context goes on to init_full."""
        do_shift = any(c.has_shift for c in self.v_cells)
        copies, self.sc_info = self.sc_info, []
        if not do_shift and not copies:
            return False
        if copies:
            self.seen["memory update with stream copies"] += 1
        if do_shift:
            self.seen["memory update with a K-shift"] += 1
            for c in self.v_cells:
                c.has_shift = False
        return True

    # -- find_slot / apply_ubatch / prepare (ENGINE.md §3) --------------------------------

    def groups(self, tokens: list[Token]) -> list[Group]:
        """The ubatch's stream list: unified, one stream for every token; non-unified,
        one per sequence in seq_id_unq order (ascending ids), each with its tokens in
        ubatch order (find_slot's `n_tokens / n_seqs` per stream)."""
        if self.unified:
            return [Group(0, list(range(len(tokens))))]
        by: dict[int, list[int]] = {}
        for j, t in enumerate(tokens):
            by.setdefault(self.seq_to_stream(t.seq[0]), []).append(j)
        return [Group(k, by[k]) for k in sorted(by)]

    def find_slot(self, tokens: list[Token]) -> list[Group] | None:
        """llama_kv_cache::find_slot(ubatch, cont = false), per stream of the ubatch."""
        out = self.groups(tokens)
        for g in out:
            cells = self.v_cells[g.strm]
            n_tokens = len(g.tokens)
            head_cur = self.v_heads[g.strm]
            # enough unused cells before head: start from the beginning, hoping to fill it
            if head_cur == cells.get_used() + 2 * n_tokens:
                self.seen["find_slot: head == used + 2 n (no restart)"] += 1
            if head_cur > cells.get_used() + 2 * n_tokens:
                if head_cur != 0:
                    self.seen["find_slot restart at 0"] += 1
                head_cur = 0
            if n_tokens > cells.size:
                return None
            n_tested = 0
            while True:
                if head_cur + 1 > cells.size:
                    n_tested += cells.size - head_cur
                    head_cur = 0
                    continue
                idx = head_cur
                head_cur += 1
                n_tested += 1
                if cells.is_empty(idx):
                    g.idxs.append(idx)
                if len(g.idxs) == n_tokens:
                    break
                if n_tested >= cells.size:
                    return None
            if g.idxs != sorted(g.idxs):
                self.seen["find_slot wrap-around"] += 1
        return out

    def apply_ubatch(self, sinfo: list[Group], tokens: list[Token], by_order: bool) -> None:
        """llama_kv_cache::apply_ubatch: write each token (pos, ext for M-RoPE, its seq
        ids) into its cell; head = the last cell in placement order + 1 (NOTES)."""
        for g in sinfo:
            cells = self.v_cells[g.strm]
            for j, idx in zip(g.tokens, g.idxs, strict=True):
                t = tokens[j]
                assert cells.is_empty(idx), "apply_ubatch: the cell is not empty"
                cells.pos[idx] = t.pos
                if by_order:
                    cells.ext[idx] = t.ext if t.ext is not None else (0, 0)
                for s in t.seq:
                    cells.seq_add(idx, s)
            self.v_heads[g.strm] = g.idxs[-1] + 1

    def recorded_sinfo(self, tokens: list[Token]) -> list[Group]:
        """A trace's recorded placement (TRACE_FORMAT.md `cell`): no find_slot."""
        out = self.groups(tokens)
        for g in out:
            g.idxs = [tokens[j].cell for j in g.tokens]
        return out

    def prepare(self, ubatches: list[list[Token]], by_order: bool) -> list[list[Group]] | None:
        """llama_kv_cache::prepare: place every ubatch on the cells the earlier ones took
        (find_slot then apply_ubatch), then undo it all, newest first: each placed
        stream's cells back, and `head = v_heads_old[s]` with s the index in the
        ubatch's stream list (NOTES: the quirk; a non-unified stream can get another
        stream's old head). None when a ubatch found no slot.

        The undo runs on success too; the decode then applies the placements found here
        ubatch by ubatch, each setting its streams' heads again, so after the decode
        only the streams it placed have moved. Between two of its ubatches a stream the
        next one places may hold a quirk head: nothing reads it (no find_slot runs)."""
        res: list[list[Group]] = []
        states = []
        success = True
        for ub in ubatches:
            recorded = ub[0].cell is not None
            sinfo = self.recorded_sinfo(ub) if recorded else self.find_slot(ub)
            if sinfo is None:
                success = False
                break
            res.append(sinfo)
            backup = [[(self.v_cells[g.strm].pos[i], self.v_cells[g.strm].ext[i],
                        set(self.v_cells[g.strm].seq[i])) for i in g.idxs] for g in sinfo]
            states.append((sinfo, list(self.v_heads), backup))
            self.apply_ubatch(sinfo, ub, by_order)
        for sinfo, v_heads_old, backup in reversed(states):
            for s, g in enumerate(sinfo):
                cells = self.v_cells[g.strm]
                for i, (p, e, ss) in zip(g.idxs, backup[s], strict=True):
                    cells.pos[i], cells.ext[i], cells.seq[i] = p, e, ss
                if not success and v_heads_old[s] != v_heads_old[g.strm]:
                    self.seen["failed prepare: head quirk"] += 1
                self.v_heads[g.strm] = v_heads_old[s]
        if not success:
            if states and not self.unified:
                self.seen["failed prepare after a placed ubatch (non-unified)"] += 1
            return None
        return res

    # -- state (llama_kv_cache::state_*) ---------------------------------------------------

    def state_write(self, s: int, slot: str) -> None:
        """state_write: s's cells in cell order (pos, ext)."""
        cells = self.cells_of(s)
        self.snapshots[slot] = [(cells.pos[i], cells.ext[i]) for i in range(cells.size)
                                if cells.seq_has(i, s)]

    def state_read(self, s: int, slot: str, by_order: bool) -> bool:
        """state_read / state_read_meta: an empty snapshot is skipped; else seq_rm(s),
        then find_slot (not contiguous) for the snapshot's cells and apply_ubatch, each
        cell holding only s. False when there is no room (s is already removed)."""
        snap = self.snapshots[slot]
        if not snap:
            return True
        self.seq_rm(s, -1, -1)
        toks = [Token(p, (s,), e if by_order else None) for p, e in snap]
        # one sequence, one stream
        sinfo = self.find_slot(toks)
        if sinfo is None:
            self.seen["state_read without room"] += 1
            return False
        self.apply_ubatch(sinfo, toks, by_order)
        return True

    def state_drop(self, s: int) -> None:
        """ENGINE.md §2 state_drop(s >= 0): s leaves every cell, head lowered as by
        seq_rm (the caller makes s < 0 a clear)."""
        self.seq_rm(s, -1, -1)


# == §3: the hybrid memory's recurrent child (llama_memory_recurrent) ===================


class GgmlAssert(Exception):
    """A GGML_ASSERT that fails: the process aborts (kpool: KP005)."""

U32 = (1 << 32) - 1  # (uint32_t) seq_id


class RefRecurrent:
    """llama_memory_recurrent with `size == n_seq_max` cells (the hybrid memory's
    rs_size): per cell a pos (-1 = empty) and its set of sequences; per sequence s its
    tail (`cells[s].tail`: the cell holding s's state, or -1) and `rs_idx[s]` (a pending
    rollback, 0 = none); head, used, and n (the cells [head, head + n) the last ubatch's
    graph reads). A cell is empty when it holds no sequence (mem_cell::is_empty); `used`
    is kept as the C++ keeps it (each edit adjusts it; find_slot recounts it).

    The tail lives in the cell struct (`cells[i].tail`), so prepare's copy of the cells
    saves and restores the tails too; rs_idx is a separate array it leaves alone."""

    def __init__(self, n_seq_max: int, n_rs_seq: int, seen: Counter | None = None,
                 negative_matches_any: bool = True) -> None:
        self.negative_matches_any = negative_matches_any
        self.size = n_seq_max
        self.n_seq_max = n_seq_max
        self.n_rs_seq = n_rs_seq
        self.pos = [-1] * self.size
        self.seq: list[set[int]] = [set() for _ in range(self.size)]
        self.tail = [-1] * self.size
        self.rs_idx = [0] * n_seq_max
        self.head = self.used = self.n = 0
        self.saved: dict[str, list[int]] = {}  # state_write: the positions of s's cells
        self.seen = seen if seen is not None else Counter()

    def is_empty(self, i: int) -> bool:
        return not self.seq[i]

    def seq_pos_min(self, s: int) -> int:
        """llama_memory_recurrent::seq_pos_min: the least pos of a cell holding s, or -1."""
        ps = [self.pos[i] for i in range(self.size) if s in self.seq[i]]
        return min(ps) if ps else -1

    def seq_pos_max(self, s: int) -> int:
        """llama_memory_recurrent::seq_pos_max: the greatest pos of a cell holding s, or -1."""
        ps = [self.pos[i] for i in range(self.size) if s in self.seq[i]]
        return max(ps) if ps else -1

    # -- edits ---------------------------------------------------------------------------

    def clear(self) -> None:
        """llama_memory_recurrent::clear: every cell empty, every tail -1, head = used =
        0, every rs_idx 0 (the saved states are the caller's, they stay)."""
        for i in range(self.size):
            self.pos[i] = -1
            self.seq[i] = set()
            self.tail[i] = -1
        self.head = self.used = 0
        self.rs_idx = [0] * self.n_seq_max

    def seq_rm(self, s: int, p0: int, p1: int) -> bool:
        """llama_memory_recurrent::seq_rm. False (nothing changed) when s is at or
        above n_seq_max; for s < 0: when the version tests `(uint32_t) seq_id >=
        n_seq_max` (ggml-org/llama.cpp 0054ee8: -1 is always refused), else
        (`seq_id >= 0 && ...`, angt/llama.cpp d5437c2) when the range is neither
        everything nor nothing; or when s's tail cell has a pos in [p0, p1) with
        p0 > 0 (a state cannot be cut mid-way) and the rollback is not possible: one
        is pending, or it is deeper than n_rs_seq. A possible rollback only moves the
        cell's pos back to p0 - 1 and records rs_idx[s]. For s < 0 the loop clears
        every cell in range and no tail is touched (they may point at emptied cells)."""
        new_head = self.size
        p0, p1 = resolve(p0, p1)
        if s >= 0 and s >= self.n_seq_max:
            return False
        if s < 0 and not self.negative_matches_any and (s & U32) >= self.n_seq_max:
            self.seen["recurrent seq_rm refuses a seq id < 0"] += 1
            return False  # "invalid seq_id"
        if p0 == 0 and p1 == POS_MAX:
            # set_rs_idx(seq_id, 0): for seq_id < 0, every rs_idx
            if s < 0:
                self.rs_idx = [0] * self.n_seq_max
            else:
                self.rs_idx[s] = 0
        if s >= self.size:
            return False  # never: size == n_seq_max
        if s < 0:
            # seq_id is negative: the range should include everything or nothing
            if p0 != p1 and (p0 != 0 or p1 != POS_MAX):
                self.seen["recurrent seq_rm of every sequence refused: a partial range"] += 1
                return False
            self.seen["recurrent seq_rm of every sequence accepted"] += 1
        else:
            t = self.tail[s]
            if t >= 0:
                if 0 < p0 <= self.pos[t] < p1:
                    rollback = self.pos[t] - (p0 - 1)
                    pending = self.rs_idx[s] != 0
                    if not pending and 1 <= rollback <= self.n_rs_seq:
                        self.seen["recurrent rollback accepted"] += 1
                        if len(self.seq[t]) > 1:
                            self.seen["recurrent rollback of a shared cell"] += 1
                        self.rs_idx[s] = rollback
                        self.pos[t] = p0 - 1
                        return True
                    if pending:
                        self.seen["recurrent rollback refused: one is pending"] += 1
                    else:
                        self.seen["recurrent rollback refused: too deep"] += 1
                    return False
                # invalidate tails which will be cleared
                if p0 <= self.pos[t] < p1:
                    self.tail[s] = -1
        for i in range(self.size):
            if not (p0 <= self.pos[i] < p1):
                continue
            if s < 0:
                self.seq[i] = set()
            elif s in self.seq[i]:
                self.seq[i].discard(s)
            else:
                continue
            if self.is_empty(i):
                if self.pos[i] >= 0:
                    self.used = u32(self.used - 1)  # uint32_t used
                self.pos[i] = -1
                if new_head == self.size:
                    new_head = i
        if new_head != self.size and new_head < self.head:
            self.head = new_head
        return True

    def seq_cp(self, src: int, dst: int) -> None:
        """llama_memory_recurrent::seq_cp (the range is ignored): dst leaves its tail
        cell (emptied: pos -1, used - 1), then joins src's tail cell. rs_idx untouched."""
        if src == dst:
            return
        if not ((dst & U32) < self.size and (src & U32) < self.size):
            return
        td = self.tail[dst]
        if td >= 0:
            self.seq[td].discard(dst)
            self.tail[dst] = -1
            if self.is_empty(td):
                self.pos[td] = -1
                self.used = u32(self.used - 1)  # uint32_t used
        ts = self.tail[src]
        if ts >= 0:
            self.seq[ts].add(dst)
            self.tail[dst] = ts

    def seq_keep(self, s: int) -> None:
        """llama_memory_recurrent::seq_keep: every other sequence loses its tail; a cell
        without s empties (used - 1 if its pos was >= 0), a cell with s keeps only s;
        head = min(head, first emptied)."""
        new_head = self.size
        for i in range(self.size):
            if i != s:
                self.tail[i] = -1
            if s not in self.seq[i]:
                if self.pos[i] >= 0:
                    self.used = u32(self.used - 1)  # uint32_t used
                self.pos[i] = -1
                self.seq[i] = set()
                if new_head == self.size:
                    new_head = i
            else:
                self.seq[i] = {s}
        if new_head != self.size and new_head < self.head:
            self.head = new_head

    def seq_add(self, s: int, p0: int, p1: int, shift: int) -> None:
        """llama_memory_recurrent::seq_add: only s's tail cell's pos moves, when in
        [p0, p1) (it may go negative: the cell is not freed)."""
        if shift == 0:
            return
        p0, p1 = resolve(p0, p1)
        if p0 == p1:
            return
        if 0 <= s < self.size:
            t = self.tail[s]
            if t >= 0 and s in self.seq[t] and p0 <= self.pos[t] < p1:
                self.pos[t] = i32(self.pos[t] + shift)  # cell.pos += shift, int32_t
                if self.pos[t] < 0:
                    self.seen["recurrent pos below 0"] += 1

    def seq_div(self, s: int, p0: int, p1: int, d: int) -> None:
        """llama_memory_recurrent::seq_div: s's tail cell's pos /= d, when in [p0, p1)
        (pos >= p0 >= 0: C++ truncation is floor)."""
        if d == 1:
            return
        p0, p1 = resolve(p0, p1)
        if p0 == p1:
            return
        if 0 <= s < self.size:
            t = self.tail[s]
            if t >= 0 and s in self.seq[t] and p0 <= self.pos[t] < p1:
                self.pos[t] //= d

    # -- find_slot / prepare / s_copy ----------------------------------------------------

    def _next_empty(self, start: int) -> int:
        """find_slot's "find next empty cell" after a taken one: step first, wrapping,
        at most size steps (it may come back to `start`)."""
        nxt = start
        for _ in range(self.size):
            nxt += 1
            if nxt >= self.size:
                nxt -= self.size
            if self.is_empty(nxt):
                break
        return nxt

    def find_slot(self, sets: list[tuple[tuple[int, ...], int]]) -> bool:
        """llama_memory_recurrent::find_slot(ubatch). `sets` are the ubatch's sequence
        sets (ubatch_sets), each as (its first token's seq ids, the pos of its last
        token). Each set ends up in one cell, the sets in consecutive cells from the
        least cell any of them had: head = that cell, n = the span of the cells they had
        (before the gather), used recounted."""
        n_seqs = len(sets)
        size = self.size
        # if we have enough unused cells before the current head, start from the beginning
        if self.head > u32(self.used + 2 * n_seqs):  # uint32_t arithmetic
            if self.used + 2 * n_seqs >= 1 << 32:
                self.seen["recurrent find_slot: used wrapped below 0"] += 1
            self.seen["recurrent find_slot restart at 0"] += 1
            self.head = 0
        for ids, _last in sets:
            for j, s in enumerate(ids):
                if s < 0 or s >= size:
                    return False  # "too big seq_id"
                if j > 0 and self.tail[s] >= 0:
                    # clear cells from seq_ids that become shared
                    c = self.tail[s]
                    self.seen["recurrent find_slot: a coupled id leaves its cell"] += 1
                    self.seq[c].discard(s)
                    self.tail[s] = -1
                    if self.is_empty(c):
                        self.pos[c] = -1
                        self.used = u32(self.used - 1)  # uint32_t used
        # find next empty cell
        nxt = self.head
        for _ in range(size):
            if nxt >= size:
                nxt -= size
            if self.is_empty(nxt):
                break
            nxt += 1
        # find usable cell range
        lo, hi = size - 1, 0
        for k, (ids, _last) in enumerate(sets):
            s = ids[0]
            has_cell = False
            if self.tail[s] >= 0:
                if s not in self.seq[self.tail[s]]:
                    self.seen["recurrent find_slot asserts on a dangling tail"] += 1
                    raise GgmlAssert("GGML_ASSERT(cell.has_seq_id(seq_id))")
                # does this seq_id "own" the cell?
                has_cell = len(self.seq[self.tail[s]]) == 1
            if not has_cell:
                assert nxt < size and self.is_empty(nxt), "GGML_ASSERT(empty_cell.is_empty())"
                if self.tail[s] >= 0:
                    # copy the old tail into the empty cell
                    orig = self.tail[s]
                    self.seen["recurrent find_slot moves a sequence off a shared cell"] += 1
                    self.pos[nxt] = self.pos[orig]
                    self.seq[orig].discard(s)
                    self.seq[nxt].add(s)
                    assert not self.is_empty(orig)
                self.tail[s] = nxt
                if k + 1 < n_seqs:
                    nxt = self._next_empty(nxt)
            lo = min(lo, self.tail[s])
            hi = max(hi, self.tail[s])
        # gather and re-order
        for k, (ids, _last) in enumerate(sets):
            dst, src = lo + k, self.tail[ids[0]]
            if dst != src:
                self.seen["recurrent find_slot swaps two cells"] += 1
                self.pos[dst], self.pos[src] = self.pos[src], self.pos[dst]
                self.seq[dst], self.seq[src] = self.seq[src], self.seq[dst]
                self.tail = [dst if t == src else src if t == dst else t for t in self.tail]
        # update the pos of the used seqs
        for k, (ids, last) in enumerate(sets):
            c = lo + k
            self.pos[c] = last
            self.seq[c] = set(ids)
            for s in ids:
                self.tail[s] = c
        self.head = lo
        self.n = hi - lo + 1
        self.used = sum(1 for i in range(size) if not self.is_empty(i))
        return self.n >= n_seqs

    def prepare(self, ubatches: list[list[tuple[tuple[int, ...], int]]]) -> bool:
        """llama_memory_recurrent::prepare: find_slot for every ubatch on a copy, then
        the original cells (with their tails), used and head back."""
        org_pos, org_tail = list(self.pos), list(self.tail)
        org_seq = [set(x) for x in self.seq]
        org_used, org_head = self.used, self.head
        try:
            return all(self.find_slot(sets) for sets in ubatches)
        finally:  # an assert aborts the process: the state compared is the one before
            self.pos, self.tail, self.seq = org_pos, org_tail, org_seq
            self.used, self.head = org_used, org_head

    def s_copy(self, ub_seqs: set[int]) -> None:
        """llama_memory_recurrent_context::s_copy(i), for every i in [0, n)
        (llm_graph_input_rs::set_input): with n_rs_seq > 0, the first (least) sequence
        of each non-empty cell in [head, head + n) has its rollback consumed."""
        if self.n_rs_seq == 0:
            return
        for i in range(self.n):
            c = i + self.head
            if self.is_empty(c):
                continue
            s = min(self.seq[c])
            if 0 <= s < len(self.rs_idx):
                if self.rs_idx[s]:
                    self.seen["recurrent rollback consumed"] += 1
                    if s not in ub_seqs:
                        self.seen["recurrent rollback consumed outside the ubatch"] += 1
                self.rs_idx[s] = 0

    # -- state ---------------------------------------------------------------------------

    def state_write(self, s: int, slot: str) -> None:
        """state_write / state_write_meta: the pos of every cell holding s, in cell
        order (one at most: a sequence's state is its tail cell)."""
        self.saved[slot] = [self.pos[i] for i in range(self.size) if s in self.seq[i]]

    def state_read(self, s: int, slot: str) -> None:
        """state_read / state_read_meta(dest_seq_id = s): seq_rm(s, -1, -1) (so an empty
        saved state leaves s with none), then find_slot for one set of s with
        cell_count tokens, its last pos the saved one; then set_rs_idx(s, 0)."""
        cells = self.saved[slot]
        self.seq_rm(s, -1, -1)
        if cells:
            ok = self.find_slot([((s,), cells[-1])])
            assert ok, "state_read_meta: find_slot failed"
        if self.n_rs_seq != 0:
            self.rs_idx[s] = 0


def ubatch_sets(ub: list[Token]) -> list[tuple[tuple[int, ...], int]]:
    """A ubatch's sequence sets as llama_memory_recurrent::find_slot reads them
    (`ubatch.seq_id[s * n_seq_tokens]`, `ubatch.pos[s * n_seq_tokens + n_seq_tokens -
    1]`): split_equal lays the sets out one after the other; for a trace's recorded
    ubatches, the tokens grouped by their seq-id set in order of first appearance. Each
    set: its first token's seq ids (in that token's order) and its last token's pos."""
    order: list[frozenset[int]] = []
    first: dict[frozenset[int], tuple[int, ...]] = {}
    last: dict[frozenset[int], int] = {}
    for t in ub:
        key = frozenset(t.seq)
        if key not in first:
            order.append(key)
            first[key] = tuple(t.seq)
        last[key] = t.pos
    return [(first[k], last[k]) for k in order]


class RefHybrid:
    """llama_memory_hybrid's positions, what llama_batch_allocr::init validates a batch
    against: seq_pos_min = max(attention's, recurrent's), seq_pos_max = min of them."""

    def __init__(self, attn: RefCache, rec: RefRecurrent) -> None:
        self.attn, self.rec = attn, rec

    def seq_pos_min(self, s: int) -> int:
        return max(self.attn.seq_pos_min(s), self.rec.seq_pos_min(s))

    def seq_pos_max(self, s: int) -> int:
        return min(self.attn.seq_pos_max(s), self.rec.seq_pos_max(s))


# == §3: a decode's batch (llama_batch_allocr) ===========================================


def validate(tokens: tuple[Token, ...], mem: RefHybrid | RefCache, n_seq_max: int,
             mrope: bool, embd: bool, seen: Counter | None = None) -> bool:
    """llama_batch_allocr::init, the checks that can refuse a batch, against the
    memory's positions (`memory->seq_pos_min/max`: the hybrid memory's,
    llama_memory_hybrid::seq_pos_min/max)."""
    seq_pos: dict[int, set[int]] = {}
    seq_cpl: set[tuple[int, int]] = set()
    for t in tokens:
        for s in t.seq:
            if not 0 <= s < n_seq_max:
                return False
        for k, s1 in enumerate(t.seq):
            seq_pos.setdefault(s1, set()).add(t.pos)
            if k > 0:
                seq_cpl.add((s1, t.seq[0]))  # seq_cpl[s1][s0]: coupled to the first id
    if seen is not None and sum(len(t.seq) for t in tokens) > sum(map(len, seq_pos.values())):
        seen["batch with a repeated position"] += 1
    for s in sorted(seq_pos):
        y_min, y_max = min(seq_pos[s]), max(seq_pos[s])
        x = mem.seq_pos_max(s)
        if seen is not None and isinstance(mem, RefHybrid) and x != mem.attn.seq_pos_max(s):
            seen["validation: the recurrent position is not the attention's"] += 1
        if mrope:
            # ENGINE.md §3: M-RoPE checks only X < Y (text), X <= Y (embeddings)
            if x >= 0 and not (x <= y_min if embd else x < y_min):
                return False
            continue
        if x >= 0 and y_min != x + 1:
            return False
        # NOTES: seq_pos is a std::set: distinct positions are counted
        if y_max - y_min + 1 > len(seq_pos[s]):
            return False
    for s0, s1 in sorted(seq_cpl):
        ok = (mem.seq_pos_min(s0) == mem.seq_pos_min(s1)
              and mem.seq_pos_max(s0) == mem.seq_pos_max(s1))
        if seen is not None and isinstance(mem, RefHybrid):
            a = mem.attn
            attn_ok = (a.seq_pos_min(s0) == a.seq_pos_min(s1)
                       and a.seq_pos_max(s0) == a.seq_pos_max(s1))
            if ok and not attn_ok:
                seen["coupled batch passes by the hybrid positions (attention alone: no)"] += 1
            if attn_ok and not ok:
                seen["coupled batch refused by the hybrid positions (attention alone: ok)"] += 1
        if not ok:
            return False
    # "no partial sequence sub-sets" / "no decreasing positions": never fire as written
    return True


SPLIT_ABORT = "GGML_ASSERT(n_ubatch > n_keep_tail)"


def split_equal(tokens: tuple[Token, ...], n_ubatch: int, sequential: bool,
                seen: Counter | None = None, n_keep_tail: int = 0
                ) -> list[list[int]] | str | None:
    """llama_batch_allocr::split_equal(n_ubatch, sequential, n_keep_tail), called until
    every token is used. Returns the ubatches as lists of token indices, None when the
    split is refused, or SPLIT_ABORT (the engine aborts)."""
    n = len(tokens)
    seq_set = [frozenset(t.seq) for t in tokens]
    if sequential and any(len(ss) > 1 for ss in seq_set):
        return None  # "sequential split is not supported when there are coupled sequences"
    seq_set_map: dict[frozenset[int], list[int]] = {}
    for i, ss in enumerate(seq_set):
        seq_set_map.setdefault(ss, []).append(i)
    used = [False] * n
    out: list[list[int]] = []
    while not all(used):
        cur_seq_set: list[frozenset[int]] = []
        last_seq_id = -1
        skipped: set[int] = set()
        for i in range(n):
            if used[i]:
                continue
            add = all(not (c & seq_set[i]) for c in cur_seq_set)
            if sequential:
                # NOTES: every unused token is tried against the last collected id
                ok = not cur_seq_set or tokens[i].seq[0] == last_seq_id + 1
                if add and not ok:
                    skipped.add(tokens[i].seq[0])
                add = add and ok
            if add:
                cur_seq_set.append(seq_set[i])
                last_seq_id = tokens[i].seq[0]
                if seen is not None and last_seq_id in skipped:
                    seen["sequential split takes a passed-over seq"] += 1
                if len(cur_seq_set) > n_ubatch:
                    break
        n_seqs = len(cur_seq_set)
        if n_seqs == 0:
            return None
        cur_idx = [0] * n_seqs
        for s in range(n_seqs):
            while used[seq_set_map[cur_seq_set[s]][cur_idx[s]]]:
                cur_idx[s] += 1
        idxs_per_seq: list[list[int]] = [[] for _ in range(n_seqs)]
        while True:
            if any(cur_idx[s] >= len(seq_set_map[cur_seq_set[s]]) for s in range(n_seqs)):
                break
            for s in range(n_seqs):
                idx = seq_set_map[cur_seq_set[s]][cur_idx[s]]
                idxs_per_seq[s].append(idx)
                used[idx] = True
                cur_idx[s] += 1
            # NOTES: tested after the round, so the first round is always taken
            if (len(idxs_per_seq[0]) + 1) * n_seqs > n_ubatch:
                break
        if n_keep_tail > 0:
            # the trailing n_keep_tail tokens of a set never straddle two ubatches
            if not n_ubatch > n_keep_tail:
                return SPLIT_ABORT  # after the coupled refusal, on the first call
            n_seqs = _keep_tail(seq_set_map, cur_seq_set, cur_idx, idxs_per_seq, used,
                                n_ubatch, n_keep_tail, seen)
        out.append([i for lst in idxs_per_seq[:n_seqs] for i in lst])
    return out


def _keep_tail(seq_set_map: dict[frozenset[int], list[int]], cur_seq_set: list[frozenset[int]],
               cur_idx: list[int], idxs_per_seq: list[list[int]], used: list[bool],
               n_ubatch: int, n_keep_tail: int, seen: Counter | None) -> int:
    """split_equal's n_keep_tail step: keep the longest prefix of sets that either
    finish in this ubatch or keep at least n_keep_tail tokens for a later one. None
    does: set 0 alone, extended to its end if that fits n_ubatch, else cut back until
    n_keep_tail of its tokens remain. The sets after the kept ones give their tokens
    back. Returns the number of sets kept."""
    n_seqs = len(cur_seq_set)

    def n_remaining(k: int) -> int:
        return len(seq_set_map[cur_seq_set[k]]) - cur_idx[k]

    n_keep = 0
    while n_keep < n_seqs:
        remaining = n_remaining(n_keep)
        if remaining != 0 and remaining < n_keep_tail:
            break
        n_keep += 1
    if n_keep == 0:
        idxs = idxs_per_seq[0]
        seq_idxs = seq_set_map[cur_seq_set[0]]
        if len(idxs) + n_remaining(0) <= n_ubatch:
            if seen is not None:
                seen["split_equal n_keep_tail: set 0 extended to its end"] += 1
            while n_remaining(0) > 0:
                idx = seq_idxs[cur_idx[0]]
                idxs.append(idx)
                used[idx] = True
                cur_idx[0] += 1
        else:
            if seen is not None:
                seen["split_equal n_keep_tail: set 0 cut back"] += 1
            while n_remaining(0) < n_keep_tail:
                used[idxs.pop()] = False
                cur_idx[0] -= 1
        n_keep = 1
    elif n_keep < n_seqs and seen is not None:
        seen["split_equal n_keep_tail: sets deferred"] += 1
    # the tokens of the deferred sets go back to the pool
    for k in range(n_keep, n_seqs):
        for idx in idxs_per_seq[k]:
            used[idx] = False
    return n_keep


# == §5 (steps 1-4): the incremental layout the engine keeps ============================


@dataclass
class LaySeq:
    """llama_memory_hybrid_idx::kpool_layout::seq."""

    strm: int = 0
    pos_min: int = 0
    cells: list[tuple[int, int]] = field(default_factory=list)  # (pos, cell), a copy
    pools: list[int] = field(default_factory=list)
    j_next: int = 0
    shared: bool = False  # cache-safe only


# == the records the reference expects ===================================================


@dataclass
class RefEvent:
    op: int
    kind: str
    status: str
    stale: dict[int, int]
    codes: frozenset[str]


@dataclass
class RefUbatch:
    op: int
    batch_ubatch: int
    token_pos: list[int]
    token_seqs: list[tuple[int, ...]]
    token_rows: list[int]
    stale_batch: dict[int, int]
    aborted: bool
    codes: frozenset[str]
    kp2_rows: set[int]  # the rows of a fresh KP002
    kp7_seqs: set[int]  # the sequences of fresh KP007s
    layout: ref57.RefLayout
    drifted: set[int]  # sequences whose layout differs from their cells
    # the batch's last ubatch (between two ubatches of a batch a head may differ, see
    # RefCache.prepare: unobservable, the placements are fixed by then)
    last: bool
    # §6-§7 (None when the ubatch aborted)
    marked: list[int] | None = None
    n_new_g: int | None = None
    plan: ref57.RefPlan | None = None


# == the replay: ops through the cache, staleness per version ============================


class RefReplay:
    """A trace's ops through RefCache, with ENGINE.md §4's staleness for one engine
    version and the incremental layout of §5. `step(i, op)` returns the records the
    engine should yield for op i (none once the replay has aborted)."""

    def __init__(self, trace: Trace, engine: str, seen: Counter | None = None, *,
                 negative_seq_rm_matches_any: bool = True,
                 seq_keep_every_stream: bool = False) -> None:
        assert engine in ENGINES
        self.seq_keep_every_stream = seq_keep_every_stream
        self.trace = trace
        self.cfg = cfg = trace.cache
        self.engine = engine
        self.cache_safe = engine == "cache-safe"
        self.seen = seen if seen is not None else Counter()
        self.cache = RefCache(cfg, self.seen)
        self.rec = RefRecurrent(cfg.n_seq_max, cfg.n_rs_seq, self.seen,
                                negative_seq_rm_matches_any)
        self.hybrid = RefHybrid(self.cache, self.rec)
        self.n_seq_max = cfg.n_seq_max
        self.stale = [CLEAN] * cfg.n_seq_max
        self.lay = [LaySeq() for _ in range(cfg.n_seq_max)]
        self.lay_exists = False
        self.lay_cache_safe = True
        self.aborted = False
        self._kp2: set[int] = set()
        self._kp7: set[int] = set()

    def run(self):
        """Every record the engine should yield, in order (a generator: between two
        records the reference's state is the engine's at the same point)."""
        for i, op in enumerate(self.trace.ops):
            yield from self.step(i, op)

    # -- §4 ---------------------------------------------------------------------------------

    def stale_set(self, s: int, p: int, touched: dict[int, int]) -> None:
        """mem_idx_stale_set: p = max(p, 0); stale[s] = min(stale[s], p); s < 0: all."""
        p = max(p, 0)
        for t in (range(self.n_seq_max) if s < 0 else [s]):
            self.stale[t] = min(self.stale[t], p)
            if self.stale[t] != CLEAN:  # a sequence still clean: no stale position
                touched[t] = self.stale[t]
            else:
                self.seen["stale_set leaves a sequence clean"] += 1

    def stale_pos(self, s: int, p0: int) -> int:
        """mem_idx_stale_pos, taken before the edit: 0 when s < 0 or the edit reaches
        pos_min (the whole sequence regroups), else p0."""
        pmin = self.cache.seq_pos_min(s) if s >= 0 else -1
        if p0 == pmin > 0:
            self.seen["stale_pos at a first position > 0"] += 1
        if s < 0 or p0 <= pmin:
            return 0
        return p0

    def layout_shared(self) -> bool:
        """kpool_layout_shared() (cache-safe): a layout exists and its cache_safe flag
        was false at its last update."""
        return self.lay_exists and not self.lay_cache_safe

    def restale_if_shared(self, touched: dict[int, int]) -> None:
        """cache-safe: seq_rm, state_read and state_drop stale every sequence while the
        layout is shared (removed by PR #29994)."""
        if self.cache_safe and self.layout_shared():
            self.seen["cache-safe re-stale while shared"] += 1
            self.stale_set(-1, 0, touched)

    # -- ops --------------------------------------------------------------------------------

    def step(self, i: int, op):
        """The records of op i (a generator; nothing once the replay aborted)."""
        if isinstance(op, Expect) or self.aborted:
            return
        if isinstance(op, Note):
            yield RefEvent(i, "note", APPLIED, {}, frozenset())
            return
        if isinstance(op, Decode):
            yield from self.decode(i, op)
            return
        touched: dict[int, int] = {}
        status = self.edit(op, touched)
        codes = frozenset()
        if status == ABORTED:
            self.aborted = True
            codes = frozenset({"KP005"})
        elif status == EDIT_REFUSED:
            status, codes = REJECTED, frozenset({"KP008"})
        yield RefEvent(i, op.kind, status, dict(sorted(touched.items())), codes)

    def edit(self, op, touched: dict[int, int]) -> str:
        """One edit through llama_memory_hybrid_idx: the cache edit, the recurrent
        child's, and the stale rules of ENGINE.md §4 for this version. Returns the
        event's status (EDIT_REFUSED: the memory's seq_rm returned false)."""
        cache, cfg, rec = self.cache, self.cfg, self.rec
        if isinstance(op, SeqRm):
            # llama_memory_hybrid_idx::seq_rm: the recurrent child first; when it
            # refuses, the call returns false before anything else changes
            if not rec.seq_rm(op.seq, op.p0, op.p1):
                return EDIT_REFUSED
            st = self.stale_pos(op.seq, op.p0)
            cache.seq_rm(op.seq, op.p0, op.p1)
            self.stale_set(op.seq, st, touched)
            self.restale_if_shared(touched)
        elif isinstance(op, SeqCp):
            cross = cache.seq_to_stream(op.src) != cache.seq_to_stream(op.dst)
            if cross and (op.p0 > 0 or op.p1 >= 0):
                self.seen["cross-stream seq_cp with a range"] += 1
                if op.p0 in (cfg.kv_size - 2, cfg.kv_size - 1) or op.p1 in (
                        cfg.kv_size - 2, cfg.kv_size - 1):
                    self.seen["cross-stream seq_cp at the is_full boundary"] += 1
            if not self.cache_safe and not (op.p0 <= 0 and op.p1 < 0):
                return ABORTED  # PR #29994: GGML_ASSERT(p0 <= 0 && p1 < 0)
            if cross and not cache.is_full(op.p0, op.p1, cfg.kv_size):
                return ABORTED  # llama_kv_cache::seq_cp: GGML_ASSERT(is_full)
            cache.seq_cp(op.src, op.dst, op.p0, op.p1)
            rec.seq_cp(op.src, op.dst)  # llama_memory_hybrid::seq_cp: attention, then recurrent
            if self.cache_safe:
                self.stale_set(op.src, 0, touched)
            self.stale_set(op.dst, 0, touched)
        elif isinstance(op, SeqKeep):
            cache.seq_keep(op.seq, self.seq_keep_every_stream)
            rec.seq_keep(op.seq)
            self.stale_set(-1, 0, touched)
        elif isinstance(op, SeqAdd):
            if cfg.by_order:
                return ABORTED  # GGML_ASSERT(n_pos_per_embd() == 1), before any early return
            self._note_shared_first_move(op.seq, op.p0, op.p1)
            # p0 + shift summed as llama_pos (int32_t)
            st = self.stale_pos(op.seq, i32(op.p0 + op.shift) if op.shift < 0 else op.p0)
            cache.seq_add(op.seq, op.p0, op.p1, op.shift)
            rec.seq_add(op.seq, op.p0, op.p1, op.shift)
            self.stale_set(op.seq, st, touched)
        elif isinstance(op, SeqDiv):
            if cfg.by_order:
                return ABORTED
            if op.d != 1:
                self._note_shared_first_move(op.seq, op.p0, op.p1)
            cache.seq_div(op.seq, op.p0, op.p1, op.d)
            rec.seq_div(op.seq, op.p0, op.p1, op.d)
            self.stale_set(op.seq, 0, touched)
        elif isinstance(op, Clear):
            self.clear(touched)
        elif isinstance(op, StateWrite):
            cache.state_write(op.seq, op.slot)
            rec.state_write(op.seq, op.slot)
        elif isinstance(op, StateRead):
            if not cache.state_read(op.seq, op.slot, cfg.by_order):
                # NOTES: the hybrid memory catches the failed restore and drops s
                self.state_drop(op.seq, touched)
                return REJECTED
            try:
                rec.state_read(op.seq, op.slot)
            except GgmlAssert:  # find_slot on a tail a seq_rm(-1) left dangling
                return ABORTED
            self.stale_set(op.seq, 0, touched)
            self.restale_if_shared(touched)
        elif isinstance(op, StateDrop):
            self.state_drop(op.seq, touched)
        else:  # pragma: no cover
            raise AssertionError(f"unknown op {op!r}")
        return APPLIED

    def clear(self, touched: dict[int, int]) -> None:
        """llama_memory_hybrid::clear: both children (the recurrent child's saved
        states stay)."""
        self.cache.clear()
        self.rec.clear()
        self.stale_set(-1, 0, touched)

    def state_drop(self, s: int, touched: dict[int, int]) -> None:
        """The hybrid memory's drop of s: s < 0 is a clear; else each child's, the
        recurrent one a seq_rm(s, -1, -1) whose answer is ignored."""
        if s < 0:
            self.clear(touched)
            return
        self.cache.state_drop(s)
        self.rec.seq_rm(s, -1, -1)
        self.stale_set(s, 0, touched)
        self.restale_if_shared(touched)

    def _note_shared_first_move(self, s: int, p0: int, p1: int) -> None:
        """Coverage: a seq_add / seq_div whose range holds s's first position in a cell
        that another sequence shares."""
        cells = self.cache.cells_of(s)
        lo, hi = resolve(p0, p1)
        pmin = cells.seq_pos_min(s)
        for i in range(cells.size):
            if (cells.seq_has(i, s) and cells.pos[i] == pmin and lo <= pmin < hi
                    and cells.seq_count(i) > 1):
                self.seen["seq_add/seq_div moves a shared sequence's first position"] += 1
                return

    # -- decode -----------------------------------------------------------------------------

    def cparams_batch(self) -> tuple[int, int]:
        """llama_context's constructor: cparams.n_batch = min(n_ctx, params.n_batch)
        (causal attention), cparams.n_ubatch = min(cparams.n_batch, params.n_ubatch).
        Without a recorded n_batch: (n_ctx, the trace's n_ubatch)."""
        cfg = self.cfg
        n_ctx = cfg.kv_size * (1 if cfg.unified else cfg.n_seq_max)
        if cfg.n_batch is None:
            return n_ctx, cfg.n_ubatch
        n_batch = min(n_ctx, cfg.n_batch)
        return n_batch, min(n_batch, cfg.n_ubatch)

    def decode(self, i: int, op: Decode):
        cfg, cache = self.cfg, self.cache
        tokens = op.tokens
        if op.span is not None:
            # a range longer than its stream, which kpool keeps unbuilt: built here, so
            # that llama.cpp's own steps refuse it
            sp = op.span
            tokens = tuple(Token(p, sp.seq, sp.ext) for p in range(sp.start, sp.stop))
        refused = RefEvent(i, "decode", REJECTED, {}, frozenset({"KP006"}))
        if not validate(tokens, self.hybrid, cfg.n_seq_max, cfg.by_order, op.is_embd,
                        self.seen):
            yield refused
            return
        # llama_context::decode: GGML_ASSERT(n_tokens_all <= cparams.n_batch), and
        # n_batch = min(n_ctx, params.n_batch) with n_ctx = n_ctx_seq (the indexer's
        # kv_size) times the streams (src/llama-context.cpp), before the memory update;
        # a trace without n_batch records none: n_ctx alone
        n_batch, n_ubatch = self.cparams_batch()
        if len(tokens) > n_batch:
            self.seen["decode past the context (n_batch assert)" if cfg.n_batch is None
                      or n_batch == cfg.kv_size * (1 if cfg.unified else cfg.n_seq_max)
                      else "decode past n_batch (n_batch assert)"] += 1
            self.aborted = True
            yield RefEvent(i, "decode", ABORTED, {}, frozenset({"KP005"}))
            return
        if op.span is not None:  # past its stream, within the context: prepare fails
            self.seen["decode of more tokens than the stream has cells"] += 1
        # llama_context::decode: memory_update before init_batch; when it ran anything,
        # llama_memory_hybrid_idx::init_full's context runs kpool_layout_update
        updated = cache.memory_update()
        if updated:
            self.layout_update()

        def refused_after_update() -> RefEvent:
            if updated:
                self.seen["decode refused after the memory update's layout update"] += 1
            return refused
        if op.ubatches is not None:
            # a sequential split (non-unified) refuses coupled sequences
            if not cfg.unified and any(len(t.seq) > 1 for t in tokens):
                yield refused_after_update()
                return
            split = [list(ub) for ub in op.ubatches]
        else:
            # llama_memory_hybrid_idx::init_batch: split_equal(n_ubatch, !unified,
            # n_rs_seq > 0 ? n_rs_seq + 1 : 0)
            n_keep_tail = cfg.n_rs_seq + 1 if cfg.n_rs_seq > 0 else 0
            if n_ubatch < cfg.n_ubatch:
                self.seen["n_ubatch capped at n_batch"] += 1
            split = split_equal(tokens, n_ubatch, not cfg.unified, self.seen, n_keep_tail)
            if split is None:
                yield refused_after_update()
                return
            if isinstance(split, str):  # SPLIT_ABORT
                self.seen["split_equal: GGML_ASSERT(n_ubatch > n_keep_tail)"] += 1
                self.aborted = True
                yield RefEvent(i, "decode", ABORTED, {}, frozenset({"KP005"}))
                return
        ubs = [[tokens[j] for j in ub] for ub in split]
        # llama_memory_hybrid::init_batch: the recurrent child's prepare, then the cache's
        sets = [ubatch_sets(ub) for ub in ubs]
        try:
            prepared = self.rec.prepare(sets)
        except GgmlAssert:
            self.aborted = True
            yield RefEvent(i, "decode", ABORTED, {}, frozenset({"KP005"}))
            return
        if not prepared:
            self.seen["recurrent prepare failed"] += 1
            yield refused_after_update()
            return
        sinfos = cache.prepare(ubs, cfg.by_order)
        if sinfos is None:
            yield refused_after_update()
            return
        stale_batch = list(self.stale)
        for b, (ub, sinfo) in enumerate(zip(ubs, sinfos, strict=True)):
            # llama_memory_hybrid_context::apply: the cache's apply_ubatch, the recurrent
            # child's find_slot; then the graph's s_copy input consumes the rollbacks
            cache.apply_ubatch(sinfo, ub, cfg.by_order)
            self.rec.find_slot(sets[b])
            self.rec.s_copy({s for t in ub for s in t.seq})
            rec = self.ubatch(i, b, ub, sinfo, stale_batch, b == len(ubs) - 1)
            self.aborted = rec.aborted
            yield rec
            if rec.aborted:
                return
            if b == 0:
                # ENGINE.md §4: after the batch's first ubatch succeeds, every stale[s]
                # becomes CLEAN (only ubatch 0 reads stale_batch)
                self.stale = [CLEAN] * self.n_seq_max

    # -- §5 and the §6-§7 decisions per ubatch --------------------------------------------

    def layout_update(self) -> None:
        """ENGINE.md §5 steps 1-4 (kpool_layout_update), on this reference's cells."""
        cfg, kpool = self.cfg, self.cfg.kpool
        self.lay_exists = True
        self.lay_cache_safe = True
        for s, sq in enumerate(self.lay):
            cells = self.cache.cells_of(s)
            sp = cells.pairs(s)
            sq.strm = self.cache.seq_to_stream(s)
            n_kept = 0
            clean = self.stale[s] == CLEAN
            # step 1: append
            if clean and sq.cells and sp and sq.pos_min == sp[0][0]:
                n_kept = len(sq.cells)
                last = sq.cells[-1]
                sq.cells.extend(p for p in sp if p > last)
            # step 2: rebuild
            if len(sq.cells) != len(sp) or not clean:
                sq.cells = list(sp)
                sq.pools = []
                sq.j_next = 0
                sq.pos_min = sp[0][0] if sp else 0
                n_kept = 0
                sq.shared = False
            # step 3: cache-safe, unified only: the sharing scan from n_kept
            if self.cache_safe and cfg.unified and not sq.shared:
                for j in range(n_kept, len(sq.cells)):
                    if cells.seq_count(sq.cells[j][1]) > 1:
                        sq.shared = True
                        break
            # step 4: the pool scan, from j_next
            j = sq.j_next
            while j + kpool <= len(sq.cells):
                if cfg.by_order:
                    sq.pools.append(j)
                    j += kpool
                    continue
                pj = sq.cells[j][0]
                if (pj - sq.pos_min) % kpool == 0 and all(
                        sq.cells[j + m][0] == pj + m for m in range(1, kpool)):
                    sq.pools.append(j)
                    j += kpool
                else:
                    j += 1
            sq.j_next = j
            self.lay_cache_safe = self.lay_cache_safe and not sq.shared

    def ref_layout(self) -> ref57.RefLayout:
        """The incremental layout as tests/reference.py's RefLayout."""
        cfg = self.cfg
        seqs = [ref57.RefSeq(sq.strm, list(sq.cells), list(sq.pools)) for sq in self.lay]
        lay = ref57.RefLayout(cfg.kpool, cfg.kv_size, cfg.by_order, cfg.unified, seqs,
                              self.cache_safe and not self.lay_cache_safe)
        for s, sq in enumerate(seqs):
            for k in range(len(sq.pools)):
                lay.pool_seq.append(s)
                lay.pool_k.append(k)
        return lay

    def ubatch(self, i: int, b: int, ub: list[Token], sinfo: list[Group],
               stale_batch: list[int], last: bool) -> RefUbatch:
        cfg = self.cfg
        cell_of = {}
        for g in sinfo:
            for j, idx in zip(g.tokens, g.idxs, strict=True):
                cell_of[j] = (g.strm, idx)
        rows = [cell_of[j][0] * cfg.kv_size + cell_of[j][1] for j in range(len(ub))]
        self.layout_update()
        lay = self.ref_layout()
        # §8 KP007: a sequence whose layout no longer matches its cells (appearance)
        drifted = {s for s in range(self.n_seq_max)
                   if self.lay[s].cells != self.cache.cells_of(s).pairs(s)}
        if drifted - self._kp7:
            self.seen["layout drift (KP007)"] += 1
        kp7 = drifted - self._kp7
        self._kp7 = drifted
        # §8 KP002: rep rows of pools whose members differ (appearance)
        by_rep: dict[int, list[list[int]]] = {}
        for ip in range(lay.n_pool_real):
            by_rep.setdefault(lay.rep_row(ip), []).append(lay.members(ip))
        conflicts = {r for r, ms in by_rep.items() if any(m != ms[0] for m in ms)}
        kp2 = conflicts - self._kp2
        self._kp2 = conflicts
        codes = set()
        if kp7:
            codes.add("KP007")
        if kp2:
            codes.add("KP002")
        rec = RefUbatch(
            op=i, batch_ubatch=b, token_pos=[t.pos for t in ub],
            token_seqs=[tuple(t.seq) for t in ub], token_rows=rows,
            stale_batch=({s: p for s, p in enumerate(stale_batch) if p != CLEAN}
                         if b == 0 else {}),
            aborted=False, codes=frozenset(codes), kp2_rows=kp2, kp7_seqs=kp7,
            layout=lay, drifted=drifted, last=last)
        # §6 marking, §7 plan, through tests/reference.py on this layout
        toks = [(t.pos, tuple(t.seq), cell_of[j][1]) for j, t in enumerate(ub)]
        m = ref57.mark(lay, toks, list(stale_batch) if b == 0 else None, self.engine)
        first = ub[0]
        sq0 = lay.seqs[first.seq[0]]
        if m.abort or not any(p == first.pos for p, _c in sq0.pairs):
            # GGML_ASSERT(r >= 0) (by-order rank), or the first token missing from its
            # sequence's layout (set_input_kpool)
            return self._abort(rec)
        n_unq = len({s for t in ub for s in t.seq})
        n_g = ref57.n_new_g(len(m.marked), len(ub), n_unq, lay.n_pool_real, cfg.kv_size,
                            cfg.kpool, cfg.n_seq_max, m.repool_all)
        plan = ref57.plan(lay, m.marked, n_g, toks, cfg.n_rows)
        if plan.abort:
            return self._abort(rec)  # GGML_ASSERT(pad_cell < kv_size * n_stream)
        rec.marked, rec.n_new_g, rec.plan = m.marked, n_g, plan
        if len(set(plan.entry_rep)) != len(plan.entry_rep):
            rec.codes = rec.codes | {"KP001"}
        return rec

    def _abort(self, rec: RefUbatch) -> RefUbatch:
        self.seen["ubatch abort (KP005)"] += 1
        rec.aborted = True
        rec.codes = rec.codes | {"KP005"}
        return rec
