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

Not modelled, like kpool (docs/ENGINE-NOTES.md, "Not followed, on purpose"): the
hybrid memory's recurrent child, SWA, split_seq.
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
ENGINES = ("rep-once", "cache-safe")

APPLIED, REJECTED, ABORTED = "applied", "rejected", "aborted"


# == §2: one stream of cells (llama_kv_cells) ==========================================


class Cells:
    """llama_kv_cells: per cell a pos (-1 = empty), an ext and a set of sequences."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pos = [-1] * size
        self.ext = [(0, 0)] * size
        self.seq: list[set[int]] = [set() for _ in range(size)]

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
        self.pos[i] += d
        if self.pos[i] < 0:
            self.rm(i)
            return True
        return False

    def pos_div(self, i: int, d: int) -> None:
        self.pos[i] //= d  # pos >= 0 and d >= 1: C++ truncation is floor here

    def seq_pos_min(self, s: int) -> int:
        ps = [self.pos[i] for i in range(self.size) if s in self.seq[i]]
        return min(ps) if ps else -1

    def seq_pos_max(self, s: int) -> int:
        ps = [self.pos[i] for i in range(self.size) if s in self.seq[i]]
        return max(ps) if ps else -1

    def reset(self) -> None:
        for i in range(self.size):
            self.rm(i)

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

    def seq_keep(self, s: int) -> None:
        """llama_kv_cache::seq_keep: only s's stream; head = min(head, first freed)."""
        strm = self.seq_to_stream(s)
        cells = self.v_cells[strm]
        new_head = cells.size
        for i in range(cells.size):
            if cells.seq_keep(i, s) and new_head == cells.size:
                new_head = i
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

    def take_copies(self) -> list[tuple[int, int]]:
        """llama_kv_cache::update (run by llama_context::decode once the batch is valid):
        the queued copies are done and the queue is empty."""
        out, self.sc_info = self.sc_info, []
        return out

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


# == §3: a decode's batch (llama_batch_allocr) ===========================================


def validate(tokens: tuple[Token, ...], cache: RefCache, n_seq_max: int, mrope: bool,
             embd: bool, seen: Counter | None = None) -> bool:
    """llama_batch_allocr::init, the checks that can refuse a batch."""
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
        x = cache.seq_pos_max(s)
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
        if (cache.seq_pos_min(s0) != cache.seq_pos_min(s1)
                or cache.seq_pos_max(s0) != cache.seq_pos_max(s1)):
            return False
    # "no partial sequence sub-sets" / "no decreasing positions": never fire as written
    return True


def split_equal(tokens: tuple[Token, ...], n_ubatch: int, sequential: bool,
                seen: Counter | None = None) -> list[list[int]] | None:
    """llama_batch_allocr::split_equal, called until every token is used. Returns the
    ubatches as lists of token indices, or None when the split is refused."""
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
        out.append([i for lst in idxs_per_seq for i in lst])
    return out


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

    def __init__(self, trace: Trace, engine: str, seen: Counter | None = None) -> None:
        assert engine in ENGINES
        self.trace = trace
        self.cfg = cfg = trace.cache
        self.engine = engine
        self.cache_safe = engine == "cache-safe"
        self.seen = seen if seen is not None else Counter()
        self.cache = RefCache(cfg, self.seen)
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
            touched[t] = self.stale[t]

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
        codes = frozenset({"KP005"}) if status == ABORTED else frozenset()
        if status == ABORTED:
            self.aborted = True
        yield RefEvent(i, op.kind, status, dict(sorted(touched.items())), codes)

    def edit(self, op, touched: dict[int, int]) -> str:
        """One edit through llama_memory_hybrid_idx: the cache edit and the stale rules
        of ENGINE.md §4 for this version. Returns the event's status."""
        cache, cfg = self.cache, self.cfg
        if isinstance(op, SeqRm):
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
            if self.cache_safe:
                self.stale_set(op.src, 0, touched)
            self.stale_set(op.dst, 0, touched)
        elif isinstance(op, SeqKeep):
            cache.seq_keep(op.seq)
            self.stale_set(-1, 0, touched)
        elif isinstance(op, SeqAdd):
            if cfg.by_order:
                return ABORTED  # GGML_ASSERT(n_pos_per_embd() == 1), before any early return
            self._note_shared_first_move(op.seq, op.p0, op.p1)
            st = self.stale_pos(op.seq, op.p0 + op.shift if op.shift < 0 else op.p0)
            cache.seq_add(op.seq, op.p0, op.p1, op.shift)
            self.stale_set(op.seq, st, touched)
        elif isinstance(op, SeqDiv):
            if cfg.by_order:
                return ABORTED
            if op.d != 1:
                self._note_shared_first_move(op.seq, op.p0, op.p1)
            cache.seq_div(op.seq, op.p0, op.p1, op.d)
            self.stale_set(op.seq, 0, touched)
        elif isinstance(op, Clear):
            cache.clear()
            self.stale_set(-1, 0, touched)
        elif isinstance(op, StateWrite):
            cache.state_write(op.seq, op.slot)
        elif isinstance(op, StateRead):
            if not cache.state_read(op.seq, op.slot, cfg.by_order):
                # NOTES: the hybrid memory catches the failed restore and drops s
                self.state_drop(op.seq, touched)
                return REJECTED
            self.stale_set(op.seq, 0, touched)
            self.restale_if_shared(touched)
        elif isinstance(op, StateDrop):
            self.state_drop(op.seq, touched)
        else:  # pragma: no cover
            raise AssertionError(f"unknown op {op!r}")
        return APPLIED

    def state_drop(self, s: int, touched: dict[int, int]) -> None:
        if s < 0:
            self.cache.clear()
            self.stale_set(-1, 0, touched)
            return
        self.cache.state_drop(s)
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

    def decode(self, i: int, op: Decode):
        cfg, cache = self.cfg, self.cache
        tokens = op.tokens
        refused = RefEvent(i, "decode", REJECTED, {}, frozenset({"KP006"}))
        if not validate(tokens, cache, cfg.n_seq_max, cfg.by_order, op.is_embd, self.seen):
            yield refused
            return
        # llama_context::decode: memory_update (the queued stream copies) before init_batch
        cache.take_copies()
        if op.ubatches is not None:
            # a sequential split (non-unified) refuses coupled sequences
            if not cfg.unified and any(len(t.seq) > 1 for t in tokens):
                yield refused
                return
            split = [list(ub) for ub in op.ubatches]
        else:
            split = split_equal(tokens, cfg.n_ubatch, not cfg.unified, self.seen)
            if split is None:
                yield refused
                return
        ubs = [[tokens[j] for j in ub] for ub in split]
        sinfos = cache.prepare(ubs, cfg.by_order)
        if sinfos is None:
            yield refused
            return
        stale_batch = list(self.stale)
        for b, (ub, sinfo) in enumerate(zip(ubs, sinfos, strict=True)):
            cache.apply_ubatch(sinfo, ub, cfg.by_order)
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
