"""The indexer KV cache: streams, edits, find_slot and state (ENGINE.md §2-3).

Owns: the streams and their heads (find_slot's, kept here: a `Stream` holds cells
only), what the next memory update runs (the pending cross-stream copies and
K-shift: `take_update`), the state snapshots, and the key write counter. Outside
cache/ it is read through its queries (`seq_pos_min`, `seq_keys`, `is_empty`,
`row_pos`, `seq_codes`, `seq_counts`, `holds`, `heads`; and, for a loop over every
sequence, `strm_of` and `seq_indices`, whose `view` is `seq_keys`) and changed
through its mutators, never through a stream's arrays.

What it does not own: staleness (the engine's, ENGINE.md §4), pooled rows (the
backend's). Every mutator returns the global rows whose *data* it changed, so the
replay can tell the backend; it never prints and never raises for a refusal that
llama.cpp reports with a return code: those come back as values.

Conventions: `p0 < 0` means 0 and `p1 < 0` means "to the end", as in llama.cpp;
seq < 0 means every sequence where the op allows it. Global rows: `global_row`
(cells.py), the one place `strm * kv_size + cell` is computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..arrays import unique
from ..trace import model as m
from ..trace.model import CacheConfig
from .batch import one_set
from .cells import Stream, global_row, key_cell

POS_INF = (1 << 31) - 1  # llama.cpp: std::numeric_limits<llama_pos>::max()


def resolve_range(p0: int, p1: int) -> tuple[int, int]:
    """llama.cpp's `if (p0 < 0) p0 = 0; if (p1 < 0) p1 = max`."""
    return max(p0, 0), (POS_INF if p1 < 0 else p1)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a ubatch's tokens go: per token its stream and stream-local cell; and the
    one stream they all go to, when they go to one (else -1: several, or a placement
    built outside `KvCache.plan`)."""

    strm: np.ndarray  # [n_tokens] | token | stream
    cells: np.ndarray  # [n_tokens] | token | cell
    stream: int = -1


@dataclass(frozen=True, slots=True)
class MemoryUpdate:
    """What `llama_kv_cache::update` runs at a decode (`KvCache.take_update`): the
    queued cross-stream copies, (src stream, dst stream) in queue order, and whether a
    K-shift was pending (llama_kv_cells' `has_shift`: a seq_add or seq_div moved or
    divided a cell since the last update or clear)."""

    copies: list[tuple[int, int]]
    shift: bool

    @property
    def ran(self) -> bool:
        """llama_kv_cache::init_update's status was SUCCESS, not NO_UPDATE: there was
        something to run (ENGINE.md §3, "The memory update")."""
        return bool(self.copies) or self.shift


@dataclass(frozen=True, slots=True)
class Snapshot:
    """`state_write(s)`: s's cells in cell order (pos, ext, key id), and the global
    rows they were read from (the backend saves those rows' pooled slots)."""

    pos: np.ndarray
    ext: np.ndarray
    key_id: np.ndarray
    rows: np.ndarray


@dataclass(frozen=True, slots=True)
class Reach:
    """The most a trace can make the cache hold, counted from its ops before it runs.

    Cells are created only by a decode's writes, a state_read's restore and a
    cross-stream seq_cp (whose rows the backend copies at the next decode); every
    one of them counts in `made`, however the ops turn out (a refused decode, an
    aborted copy), so these are upper bounds."""

    tokens: int  # tokens of every decode
    restored: int  # cells every state_read can restore
    copied: int  # rows every cross-stream seq_cp can copy
    made: int  # cells the trace can create, in all: tokens + restored + copied
    cells: int  # live cells of one stream at any time: min(kv_size, made)
    rows: int  # global rows those writes can reach: min(n_rows, made)
    snapshot_rows: int  # rows the live snapshots hold at once, plus the largest (replaced)
    decode_tokens: int  # tokens of the largest decode
    # rows a value backend can hold data in: the rows above plus the scatter's padding
    # rows (ENGINE.md §6: a ubatch pads at most n_tokens // kpool + n_seqs_unq <=
    # n_tokens // kpool + n_tokens entries), a cross-stream copy copying them too
    value_rows: int

    @classmethod
    def of(cls, trace: m.Trace) -> Reach:
        cfg = trace.cache
        kv = cfg.kv_size
        tokens = restored = copied = biggest = decode_max = 0
        values = 0  # value_rows so far
        snaps: dict[str, int] = {}  # slot -> the most cells it held
        last: dict[str, int] = {}  # slot -> cells of its latest state_write, at most
        for op in trace.ops:
            made = tokens + restored + copied
            if isinstance(op, m.Decode):
                n = len(op.tokens)
                tokens += n
                values += 2 * n + n // cfg.kpool
                decode_max = max(decode_max, n)
            elif isinstance(op, m.StateWrite):
                # a snapshot holds one sequence's cells: at most the live cells of a stream
                last[op.slot] = min(kv, made)
                snaps[op.slot] = max(snaps.get(op.slot, 0), last[op.slot])
                biggest = max(biggest, last[op.slot])
            elif isinstance(op, m.StateRead):
                n = last.get(op.slot, min(kv, made))
                restored += n
                values += n
            elif isinstance(op, m.SeqCp) and not cfg.unified and op.src != op.dst:
                # the destination stream gets the source stream's rows: at most its live
                # cells (the cache), the rows holding values in it (a backend)
                copied += min(kv, made)
                values += min(kv, values)
        made = tokens + restored + copied
        return cls(tokens=tokens, restored=restored, copied=copied, made=made,
                   cells=min(kv, made), rows=min(cfg.n_rows, made),
                   snapshot_rows=sum(snaps.values()) + biggest, decode_tokens=decode_max,
                   value_rows=min(cfg.n_rows, values))


class KvCache:
    """`n_stream` streams of `kv_size` cells (ENGINE.md §2)."""

    # bytes per snapshot row of a `Snapshot`: pos, ext (2), key_id, rows
    SNAPSHOT_ROW_BYTES = 8 + 2 * 8 + 8 + 8
    # bytes per token of a decode's placement: strm, cells, the sorted cells taken,
    # key ids and rows, with their copies
    PLACE_TOKEN_BYTES = 8 * 8
    # the streams' class (the compiled core's writes through kernels)
    STREAM: type[Stream] = Stream

    @classmethod
    def bytes_bound(cls, config: CacheConfig, reach: Reach) -> int:
        """Bytes the cache can hold during a replay that reaches `reach`: every
        stream (its per-cell arrays and index), the snapshots, and the largest
        temporaries of one op (they never coincide: ops run one at a time)."""
        n_col = config.n_seq_max if config.unified else 1
        held = config.n_stream * Stream.bytes_bound(config.kv_size, n_col, reach.cells)
        snaps = cls.SNAPSHOT_ROW_BYTES * reach.snapshot_rows
        temp = max(Stream.op_bytes_bound(config.kv_size, n_col, reach.cells),
                   cls.PLACE_TOKEN_BYTES * reach.decode_tokens)
        return held + snaps + temp

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.kv_size = config.kv_size
        if config.unified:
            self.streams = [self.STREAM(config.kv_size, list(range(config.n_seq_max)))]
        else:
            self.streams = [self.STREAM(config.kv_size, [s]) for s in range(config.n_seq_max)]
        self._heads = [0] * len(self.streams)  # per stream: where find_slot starts
        # per sequence: its stream and that stream's index of its pairs (a stream's
        # `seq_keys` are made once and never replaced: `reset` empties them in place)
        self.strm_of = [self.stream_of(s) for s in range(config.n_seq_max)]
        self.seq_indices = [self.streams[k].seq_keys[s] for s, k in enumerate(self.strm_of)]
        self.changed_from: dict[int, int] = {}  # `take_touched`'s
        self.pending_copies: list[tuple[int, int]] = []  # (src stream, dst stream)
        self.snapshots: dict[str, Snapshot] = {}
        self.n_key_writes = 0  # the per-write counter: key ids are 1, 2, ...

    # -- queries -------------------------------------------------------------------

    def stream_of(self, s: int) -> int:
        return 0 if self.config.unified else s

    def one_stream(self, seq_sets: Sequence[tuple[int, ...]]) -> int | None:
        """The stream of every set's first seq id when it is one stream (always, in a
        unified cache), else None."""
        k = self.stream_of(seq_sets[0][0])
        if self.config.unified:  # one stream holds them all
            return k
        return k if all(self.stream_of(ss[0]) == k for ss in seq_sets) else None

    def stream(self, s: int) -> Stream:
        return self.streams[self.stream_of(s)]

    def seq_pos_min(self, s: int) -> int:
        return self.stream(s).seq_pos_min(s)

    def seq_pos_max(self, s: int) -> int:
        return self.stream(s).seq_pos_max(s)

    def seq_pos_maxes(self, seqs: Sequence[int]) -> list[int]:
        """`seq_pos_max` of each of `seqs`."""
        if self.config.unified:  # one stream holds them all
            return self.stream(0).seq_pos_maxes(seqs)
        return [self.stream(s).seq_pos_max(s) for s in seqs]

    def holds_in(self, s: int, p0: int, p1: int) -> bool:
        """Whether a seq_rm(s, p0, p1) would find a cell to drop s from (s < 0: any
        sequence), taken before it."""
        lo, hi = resolve_range(p0, p1)
        if lo >= hi:
            return False
        streams = self.streams if s < 0 else [self.stream(s)]
        return any(k.range(lo, hi).size for st in streams
                   for q, k in st.seq_keys.items() if s < 0 or q == s)

    def seq_keys(self, s: int) -> np.ndarray:
        """s's (pos, cell) pairs as sorted keys; cells are stream-local."""
        return self.seq_indices[s].view

    def take_touched(self) -> set[int]:
        """The sequences whose pairs changed since the last call (cleared by it);
        `changed_from` holds, of each, a key at or below every pair of it that changed
        in that time (`Stream.changed_from`), until the next call."""
        if len(self.streams) == 1:  # a unified cache: the stream's own, handed over
            st = self.streams[0]
            out, self.changed_from = st.touched, st.changed_from
            st.touched, st.changed_from = set(), {}
            return out
        out = set()
        self.changed_from = {}
        for st in self.streams:
            out |= st.touched
            self.changed_from.update(st.changed_from)
            st.touched = set()
            st.changed_from = {}
        return out

    def global_rows(self, s: int, cells: np.ndarray) -> np.ndarray:
        return global_row(self.stream_of(s), cells, self.kv_size)

    @property
    def heads(self) -> tuple[int, ...]:
        """Each stream's head: where its find_slot starts (ENGINE.md §3)."""
        return tuple(self._heads)

    def is_empty(self, strm: int, cell: int) -> bool:
        return bool(self.streams[strm].pos[cell] == -1)

    def row_pos(self, rows: np.ndarray) -> np.ndarray:
        """[n] the pos of each global row's cell, -1 where it is empty."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty(rows.size, dtype=np.int64)
        for k, st in enumerate(self.streams):
            mine = rows // self.kv_size == k
            out[mine] = st.pos[rows[mine] % self.kv_size]
        return out

    def holds(self, s: int, rows: np.ndarray) -> np.ndarray:
        """[n] bool: each global row's cell holds sequence s (rows of s's stream)."""
        rows = np.asarray(rows, dtype=np.int64)
        k = self.stream_of(s)
        mine = rows // self.kv_size == k
        out = np.zeros(rows.size, dtype=bool)
        out[mine] = self.streams[k].holds(s, rows[mine] % self.kv_size)
        return out

    def seq_counts(self, strm: int, cells: np.ndarray) -> np.ndarray:
        """[n] how many sequences each cell of stream `strm` holds."""
        return self.streams[strm].seq_count[cells]

    def seq_codes(self, empty: int, shared: int) -> np.ndarray:
        """[n_rows] int16 per global row: `empty`, its cell's one seq id, or `shared`
        (each stream's `Stream.seq_codes`, written in place: one fill of the rows, then
        the live cells)."""
        kv = self.kv_size
        out = np.empty(len(self.streams) * kv, dtype=np.int16)
        for k, st in enumerate(self.streams):
            base = global_row(k, 0, kv)
            st.seq_codes(empty, shared, out[base:base + kv])
        return out

    # -- edits (llama_kv_cache::seq_*) ---------------------------------------------

    def _lower_head(self, k: int, freed: np.ndarray) -> None:
        """seq_rm / seq_keep / state drop: `head = min(head, first freed cell)`."""
        if freed.size:
            self._heads[k] = min(self._heads[k], int(freed.min()))

    def seq_rm(self, s: int, p0: int, p1: int) -> None:
        lo, hi = resolve_range(p0, p1)
        if lo >= hi:
            return
        if s < 0:
            for k, st in enumerate(self.streams):
                self._lower_head(k, st.rm_range(lo, hi))
            return
        self._seq_rm_one(s, lo, hi)

    def _seq_rm_one(self, s: int, lo: int, hi: int) -> np.ndarray:
        """seq_rm of sequence s >= 0 over [lo, hi) (resolved): the cells it freed (those
        it held alone), stream-local, its stream's head lowered to the first."""
        k = self.stream_of(s)
        freed = self.streams[k].seq_rm(s, lo, hi)
        self._lower_head(k, freed)
        return freed

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Same stream: dst joins src's cells in range. Cross-stream (non-unified): the
        metadata is copied now, the rows at the next decode that passes validation;
        the caller has already refused a partial range (GGML_ASSERT is_full)."""
        if src == dst:
            return
        s0, s1 = self.stream_of(src), self.stream_of(dst)
        if s0 == s1:
            lo, hi = resolve_range(p0, p1)
            if lo < hi:
                self.streams[s0].seq_cp(src, dst, lo, hi)
            return
        self.streams[s1].copy_from(self.streams[s0], src, dst)
        self._heads[s1] = self._heads[s0]
        self.pending_copies.append((s0, s1))

    @property
    def shift_pending(self) -> bool:
        """llama_kv_cache::get_has_shift: a stream has a K-shift pending."""
        return any(st.has_shift for st in self.streams)

    def take_update(self) -> MemoryUpdate:
        """llama_kv_cache::init_update and update, as a decode runs them (ENGINE.md §3,
        "The memory update"): the cross-stream row copies due now and the K-shift, both
        done once taken (the queue empties, every stream's shift is reset)."""
        shift = self.shift_pending
        if not shift and not self.pending_copies:
            return MemoryUpdate([], False)  # every decode but a few: no stream to reset
        got = MemoryUpdate(self.pending_copies, shift)
        self.pending_copies = []
        if shift:
            for st in self.streams:
                st.has_shift = False
        return got

    def seq_keep(self, s: int, every_stream: bool = False) -> None:
        """ENGINE.md §2: s's stream keeps s alone; `every_stream` (angt's
        llama_kv_cache::seq_keep, `EngineVersion.seq_keep_every_stream`): so does every
        other stream, which holds none of s's cells and so empties. Each stream's head
        drops to its first freed cell."""
        for k in range(len(self.streams)) if every_stream else (self.stream_of(s),):
            self._lower_head(k, self.streams[k].seq_keep(s))

    def seq_add(self, s: int, p0: int, p1: int, shift: int) -> None:
        """`head` = first freed cell, or 0 when none was freed; a zero shift or an empty
        range returns before touching anything (llama_kv_cache::seq_add)."""
        if shift == 0:
            return
        lo, hi = resolve_range(p0, p1)
        if lo == hi:
            return
        st = self.stream(s)
        freed = st.shift_pos(s, lo, hi, shift) if lo < hi else np.empty(0, np.int64)
        self._heads[self.stream_of(s)] = int(freed.min()) if freed.size else 0

    def seq_div(self, s: int, p0: int, p1: int, d: int) -> None:
        if d == 1:
            return
        lo, hi = resolve_range(p0, p1)
        if lo < hi:
            self.stream(s).div_pos(s, lo, hi, d)

    def clear(self) -> None:
        """llama_kv_cache::clear: every cell empty, every head 0, no K-shift pending
        (`Stream.reset`). The stream copies a cross-stream seq_cp queued stay
        queued (clear does not touch `sc_info`): the next update still copies the source
        stream's rows, as they are then, over the destination's."""
        for st in self.streams:
            st.reset()
        self._heads = [0] * len(self.streams)

    # -- find_slot / apply_ubatch (ENGINE.md §3) ---------------------------------------

    def plan(self, ubatches: Sequence[tuple[np.ndarray, Sequence[tuple[int, ...]],
                                           np.ndarray | None]]
             ) -> list[Placement] | None:
        """Place every ubatch of a decode, each seeing the cells the earlier ones took
        (llama_kv_cache::prepare). None when one of them finds no room: the decode
        fails whole. Each ubatch is (pos, seq sets, recorded cells or None)."""
        # per stream touched: the cells earlier ubatches of this decode took (sorted),
        # so nothing here costs O(kv_size * n_stream)
        taken: dict[int, np.ndarray] = {}
        used = [st.used for st in self.streams]
        head = list(self._heads)
        out: list[Placement] = []
        heads_before: list[list[int]] = []
        strm_of = self.strm_of
        for _pos, seqs, recorded in ubatches:
            heads_before.append(list(head))
            first = one_set(seqs)  # a prefill's, a draft's: one stream
            strm = (np.full(len(seqs), strm_of[first[0]], dtype=np.int64) if first is not None
                    else np.fromiter((strm_of[ss[0]] for ss in seqs), dtype=np.int64,
                                     count=len(seqs)))
            cells = np.empty(len(seqs), dtype=np.int64)
            streams = unique(strm).tolist()
            for k in streams:
                mine = np.flatnonzero(strm == k)
                got: np.ndarray | None
                if recorded is not None:
                    got = recorded[mine]
                else:
                    # non-unified: the head rule counts this stream's tokens only
                    got = self._find_slot(self.streams[k], used[k], head[k], mine.size,
                                          taken.get(k))
                    if got is None:
                        self._restore_heads_after_failed_prepare(out, heads_before)
                        return None
                cells[mine] = got
                before = taken.get(k)
                taken[k] = (np.sort(got) if before is None
                            else np.sort(np.concatenate((before, got)), kind="stable"))
                used[k] += int(got.size)
                head[k] = int(got[-1]) + 1  # the last token's cell in placement order
            out.append(Placement(strm, cells, streams[0] if len(streams) == 1 else -1))
        return out

    def prepare_unplaceable(self, strm: int, first_len: int) -> None:
        """llama_kv_cache::prepare of a decode of one stream that the stream can never
        hold (a `Span`): its ubatches are placed in simulation until one finds no
        room, then undone. Only the heads can change: when the first ubatch (of
        `first_len` tokens) found room, the undo gives stream `strm` the old head of
        stream 0 (`_restore_heads_after_failed_prepare`); else nothing was placed."""
        st = self.streams[strm]
        if first_len <= st.kv_size - st.used:  # the non-contiguous find_slot finds room
            placed = Placement(np.array([strm]), np.zeros(1, dtype=np.int64))
            self._restore_heads_after_failed_prepare([placed], [list(self._heads)])

    def _restore_heads_after_failed_prepare(self, planned: list[Placement],
                                            heads_before: list[list[int]]) -> None:
        """llama_kv_cache::prepare undoes its simulation with `head = v_heads_old[s]`,
        where s is the index in the ubatch's list of streams, not the stream itself:
        stream strm[s] gets stream s's old head. Unified caches cannot tell; a
        non-unified one keeps the wrong heads after a failed decode (real code, not
        ENGINE.md: tests/test_cache.py::test_failed_prepare_head_quirk)."""
        for p, old in zip(reversed(planned), reversed(heads_before[: len(planned)]),
                          strict=True):
            for idx, k in enumerate(unique(p.strm).tolist()):
                self._heads[k] = old[idx]

    @staticmethod
    def _find_slot(st: Stream, used: int, head: int, n: int,
                   taken: np.ndarray | None = None) -> np.ndarray | None:
        """Non-contiguous find_slot: from `head` (or 0 when `head > used + 2 n`), take
        the first n empty cells, wrapping once; `taken` (sorted) are cells an earlier
        ubatch of the same decode took. Reads only as far as it must."""
        size = st.kv_size
        if n > size:
            return None
        if head > used + 2 * n:
            head = 0
        if head >= size:
            head = 0
        got = st.empty_cells(head, size, n, taken)
        if got.size < n:
            got = np.concatenate((got, st.empty_cells(0, head, n - got.size, taken)))
        return got if got.size == n else None

    def apply(self, placement: Placement, pos: np.ndarray, ext: np.ndarray | None,
              seqs: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """Write a planned ubatch (apply_ubatch): each cell gets its token and a new key
        id (in token order); head = last cell used + 1, per stream. Returns the global
        rows written and their key ids, per token."""
        ids = np.arange(self.n_key_writes + 1, self.n_key_writes + 1 + pos.size)
        self.n_key_writes += int(pos.size)
        for k in unique(placement.strm).tolist():
            mine = np.flatnonzero(placement.strm == k)
            st = self.streams[k]
            st.write(placement.cells[mine], pos[mine], None if ext is None else ext[mine],
                     [seqs[i] for i in mine.tolist()], ids[mine])
            self._heads[k] = int(placement.cells[mine][-1]) + 1
        return global_row(placement.strm, placement.cells, self.kv_size), ids

    # -- state (llama_state_seq_*) ---------------------------------------------------

    def state_write(self, s: int, slot: str) -> None:
        st = self.stream(s)
        cells = np.sort(key_cell(st.cells_of(s)))
        self.snapshots[slot] = Snapshot(*st.saved(cells), self.global_rows(s, cells))

    def state_read(self, s: int, slot: str) -> tuple[bool, np.ndarray]:
        """Restore a snapshot into s: seq_rm(s), then find_slot for its cells, each
        holding only s. Returns (ok, rows): restored, the global rows written, in
        snapshot order. An empty snapshot leaves s untouched. No room: s has been
        removed, ok is False (the caller then drops s, as the hybrid memory does), and
        rows are those of the cells s held alone before, which the indexer cache
        zeroes (ENGINE.md §2, ENGINE-NOTES.md "the rows a failed restore zeroes"): the
        attention cache's restore is what fails, before the indexer cache's runs, so
        `llama_memory_hybrid_idx::state_drop` finds s's old cells still in the
        indexer cache and its `llama_kv_cache::state_clear(s)` zeroes the rows of
        those that hold s alone (`seq_has(i, s) && seq_count(i) == 1`); their keys
        are forgotten here."""
        snap = self.snapshots[slot]
        n = int(snap.pos.size)
        if n == 0:
            return True, np.empty(0, dtype=np.int64)
        assert n <= self.kv_size, "a snapshot cannot outgrow the cache it came from"
        freed = self._seq_rm_one(s, *resolve_range(-1, -1))  # seq_rm(s, -1, -1)
        k = self.stream_of(s)
        st = self.streams[k]
        cells = self._find_slot(st, st.used, self._heads[k], n)
        if cells is None:
            st.forget_keys(freed)
            return False, self.global_rows(s, freed)
        st.write(cells, snap.pos, snap.ext, [(s,)] * n, snap.key_id)
        self._heads[k] = int(cells[-1]) + 1
        return True, self.global_rows(s, cells)

    def state_drop(self, s: int) -> np.ndarray:
        """Every cell of s drops s; the cells that became empty have their rows zeroed.
        Returns those global rows (s < 0 is the caller's `clear`)."""
        st = self.stream(s)
        freed = st.seq_rm(s, 0, POS_INF)
        self._lower_head(self.stream_of(s), freed)
        st.forget_keys(freed)
        return self.global_rows(s, freed)

    # -- checks -----------------------------------------------------------------------

    def check_invariants(self) -> None:
        for st in self.streams:
            st.check_invariants()
