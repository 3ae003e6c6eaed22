"""The compiled core's cache: the reference cache (cache/kv.py, cache/cells.py) whose
per-ubatch work, find_slot and a decode's writes with their index, runs as kernels
(compiled/kernels.py) over the same cell arrays, with each stream's index of its
sequences' cells in an arena (compiled/arena.py: row i is sequence column i's keys).

Owns: `CompiledStream` (Stream.write, `seq_rm`, `seq_pos_maxes`; the index arena;
`appends` and `added`, what its last write only appended) and `CompiledKvCache`
(KvCache._find_slot; `take_appended` and `take_added`, which the compiled layout's
update reads). Invariants: the state is the reference's, cell for cell and key for
key (the streams' `check_invariants` hold after every op, and tests hold the two
cores' reports byte-identical, and `seq_rm` to `Stream.seq_rm` on random streams);
every other mutator is the reference's own; `added`
holds exactly the pairs a step of parallel slots pushed past the pairs of
sequences nothing else touched since the owner last took `touched`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..cache.batch import one_seq_each, one_set
from ..cache.cells import CELL_BITS, EMPTY_POS, SortedKeys, Stream, global_row
from ..cache.kv import KvCache, Placement
from ..trace.model import CacheConfig
from . import kernels as k
from .arena import Arena, ArenaKeys

_NO_CELLS = np.empty(0, dtype=np.int64)
# a step's pairs written past each sequence's: (seq [m], off [m + 1], keys)
Added = tuple[np.ndarray, np.ndarray, np.ndarray]


def add_keys(index: SortedKeys, keys: np.ndarray) -> None:
    """`SortedKeys.add` through `kernels.sorted_add` (keys not present yet)."""
    n = len(index)
    buf = index.spare(n + keys.size)
    index.set_len(k.sorted_add(buf, n, keys))


class CompiledStream(Stream):
    def __init__(self, kv_size: int, seq_ids: list[int]) -> None:
        super().__init__(kv_size, seq_ids)
        # the index: sequence column i's keys are row i of one arena (compiled/arena.py),
        # so a step of parallel slots pushes each slot's key in one kernel call
        self.index = Arena(len(self.seq_ids), kv_size)
        self.seq_keys = {s: ArenaKeys(self.index, i) for i, s in enumerate(self.seq_ids)}
        self._rows_are_ids = self.seq_ids == list(range(len(self.seq_ids)))  # unified
        # the sequences whose pairs, since the owner last took `touched`, changed only
        # by writes past their last pair (so a copy of the old pairs plus the new
        # ones is the index): what CompiledLayout's drift flags rely on
        self.appends: set[int] = set()
        # what the last write, a step of parallel slots, added past the pairs of the
        # sequences it appended to (of `appends`), as (seq [m], off [m + 1], keys):
        # seq[i]'s pairs gained keys[off[i]:off[i + 1]] at their end
        # (`CompiledKvCache.take_added`); None when it noted none
        self.added: Added | None = None

    def seq_pos_maxes(self, seqs: Iterable[int]) -> list[int]:
        """Stream.seq_pos_maxes: the last key of each sequence's row, a few read one by
        one (a call costs more than it saves below 8 rows), more in one
        `kernels.last_pos` call."""
        seqs = list(seqs)
        lens, buf = self.index.lens, self.index.buf
        if len(seqs) < 8:
            out = []
            for s in seqs:
                r = self._col[s]
                n = int(lens[r])
                out.append(int(buf[r, n - 1]) >> CELL_BITS if n else -1)
            return out
        rows = (np.array(seqs, dtype=np.int64) if self._rows_are_ids
                else np.fromiter(map(self._col.__getitem__, seqs), np.int64, len(seqs)))
        last = np.empty(rows.size, dtype=np.int64)
        k.last_pos(rows, lens, buf, last)
        return last.tolist()

    def write(self, cells: np.ndarray, pos: np.ndarray, ext: np.ndarray | None,
              seqs: list[tuple[int, ...]], key_ids: np.ndarray) -> None:
        """Stream.write: the cells through a kernel, then each sequence's new pairs into
        its index (one sequence: `kernels.write_seq`; a step of parallel slots:
        `kernels.write_slots`, which pushes them; else `kernels.write_cells`)."""
        col = self._col
        n = len(seqs)
        first = one_set(seqs)
        if first is not None and len(first) == 1:  # one sequence
            s = first[0]
            index = self.seq_keys[s]
            n0 = len(index)
            buf = index.spare(n0 + n)
            n1, past_end, empty, low = k.write_seq(
                cells, pos, ext if ext is not None else self.ext[:0], ext is not None,
                col[s], key_ids, self.pos, self.ext, self.has, self.seq_count, self.key_id,
                buf, n0)
            assert empty, "writing a cell that is not empty"
            index.set_len(n1)
            self.used += n
            self._note_all((s,), bool(past_end), int(low))
            return
        ext_a = ext if ext is not None else self.ext[:0]
        firsts = one_seq_each(seqs)
        if firsts is not None:
            # a token per sequence, one sequence a token (parallel slots): each token's
            # cell written and its key pushed onto its sequence's row (`SortedKeys.push`)
            # in one call, the others inserted (`_add`)
            flat = (np.array(firsts, dtype=np.int64) if self._rows_are_ids
                    else np.fromiter(map(col.__getitem__, firsts), np.int64, n))
            keys, pushed = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
            while (got := k.write_slots(cells, pos, ext_a, ext is not None, flat, key_ids,
                                        self.pos, self.ext, self.has, self.seq_count,
                                        self.key_id, self.index.buf, self.index.lens, keys,
                                        pushed))[0] < 0:
                self.index.reserve(-got[0])
            assert got[0] == 0, "writing a cell that is not empty"
            self.used += n
            low = int(got[1])  # at or below each sequence's new pair
            if self.touched.isdisjoint(firsts) and pushed.all():  # a decode step
                self._note_all(firsts, True, low)  # each an append
                # the rows are the sequences (unified) or not: the sequences' array
                self.added = (flat if self._rows_are_ids else np.array(firsts, dtype=np.int64),
                              np.arange(n + 1, dtype=np.int64), keys)
            else:
                self._note_all([s for s, p in zip(firsts, pushed.tolist(), strict=True)
                                if p], True, low)
                for i in np.flatnonzero(~pushed).tolist():
                    self._add(firsts[i], keys[i:i + 1])
            return
        assert np.all(self.pos[cells] == EMPTY_POS), "writing a cell that is not empty"
        by_seq: dict[int, list[int]] = {}  # token indices per sequence
        ptr_l, flat_l = [0], []
        for i, ss in enumerate(seqs):
            for s in ss:
                flat_l.append(col[s])
                by_seq.setdefault(s, []).append(i)
            ptr_l.append(len(flat_l))
        ptr, flat = np.array(ptr_l, dtype=np.int64), np.array(flat_l, dtype=np.int64)
        k.write_cells(cells, pos, ext_a, ext is not None, ptr, flat, key_ids, self.pos,
                      self.ext, self.has, self.seq_count, self.key_id)
        self.used += int(cells.size)
        keys = (pos.astype(np.int64) << 32) | cells
        for s, idx in by_seq.items():
            self._add(s, keys[idx])

    def seq_rm(self, s: int, p0: int, p1: int) -> np.ndarray:
        """Stream.seq_rm, the keys found by `SortedKeys.range`'s search, then one
        `kernels.seq_rm` pass over s's index row and the cells (a rejected draft's
        tail: W3's every step)."""
        index = self.seq_keys[s]
        have = index.view
        lo, hi = SortedKeys.range_ends(have, p0, p1)
        if lo == hi:
            return _NO_CELLS
        low = int(have[lo])
        scratch = np.empty(4 * (hi - lo), dtype=np.int64)
        n_freed = k.seq_rm(index.spare(have.size), have.size, lo, hi, self._col[s],
                           self.has, self.seq_count, self.pos, self.ext, EMPTY_POS, scratch)
        index.set_len(have.size - (hi - lo))
        self.used -= n_freed
        self.touch(s, low)  # the cut keys ascend
        return scratch[hi - lo:hi - lo + n_freed]

    def _note_all(self, seqs: list[int] | tuple[int, ...], past_end: bool, low: int
                  ) -> None:
        """The index of each of the distinct sequences `seqs` changed, none below the
        key `low` (`Stream.touch`), all as `past_end` says: a sequence nothing touched
        before that changed only past its end is an append; any other is not."""
        if not seqs:
            return
        changed = set(seqs)
        if past_end:
            self.appends -= changed & self.touched
            self.appends |= changed - self.touched
        else:
            self.appends -= changed
        self.touch_all(changed, low)

    def _add(self, s: int, keys: np.ndarray) -> None:
        index = self.seq_keys[s]
        low = int(keys.min())
        self._note_all((s,), len(index) == 0 or low > int(index.view[-1]), low)
        add_keys(index, keys)


class CompiledKvCache(KvCache):
    STREAM = CompiledStream

    def __init__(self, config: CacheConfig) -> None:
        super().__init__(config)
        self._appended: set[int] = set()
        self._compiled = [st for st in self.streams if isinstance(st, CompiledStream)]

    def apply(self, placement: Placement, pos: np.ndarray, ext: np.ndarray | None,
              seqs: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """KvCache.apply, noting the sequences it only appended to (`take_appended`)."""
        for st in self._compiled:  # new sets: the last ones may be the owner's now
            st.appends = set()
            st.added = None
        k = placement.stream
        if k >= 0:  # one stream: KvCache.apply without its grouping by stream
            ids = np.arange(self.n_key_writes + 1, self.n_key_writes + 1 + pos.size)
            self.n_key_writes += int(pos.size)
            self.streams[k].write(placement.cells, pos, ext, seqs, ids)
            self._heads[k] = int(placement.cells[-1]) + 1
            out = global_row(k, placement.cells, self.kv_size), ids
        else:
            out = super().apply(placement, pos, ext, seqs)
        compiled = self._compiled
        self._appended = (compiled[0].appends if len(compiled) == 1  # handed over
                          else set().union(*(st.appends for st in compiled)))
        return out

    def plan(self, ubatches: Sequence[tuple[np.ndarray, Sequence[tuple[int, ...]],
                                           np.ndarray | None]]
             ) -> list[Placement] | None:
        """KvCache.plan; a decode of one ubatch on one stream with no recorded cells
        (every decode step) is one find_slot, without the bookkeeping between
        ubatches (a failed one restores no head: nothing was placed)."""
        if len(ubatches) == 1 and ubatches[0][2] is None:
            seqs = ubatches[0][1]
            k = self.one_stream(seqs)
            if k is not None:
                st = self.streams[k]
                got = self._find_slot(st, st.used, self._heads[k], len(seqs))
                if got is None:
                    return None
                return [Placement(np.full(len(seqs), k, dtype=np.int64), got, k)]
        return super().plan(ubatches)

    def take_appended(self) -> set[int]:
        """The sequences the last `apply` changed only past their last pair, and that
        nothing else changed since the last `take_touched` (cleared by the call)."""
        out, self._appended = self._appended, set()
        return out

    def take_added(self) -> Added | None:
        """What the last `apply` wrote past the pairs of sequences of `take_appended`
        when it was a step of parallel slots (a token a sequence, on one stream):
        (seq [m], off [m + 1], keys), seq[i]'s new pairs keys[off[i]:off[i + 1]]; None
        when it noted none (cleared by the call). A decode of one sequence notes none:
        its update is one sequence's steps anyway."""
        # a step of parallel slots is one stream's write (a unified cache): at most one
        added = next((st.added for st in self._compiled if st.added is not None), None)
        for st in self._compiled:
            st.added = None
        return added

    @staticmethod
    def _find_slot(st: Stream, used: int, head: int, n: int,
                   taken: np.ndarray | None = None) -> np.ndarray | None:
        """KvCache._find_slot: its head reset, then `kernels.find_slot`."""
        size = st.kv_size
        if n > size:
            return None
        if head > used + 2 * n or head >= size:
            head = 0
        out = np.empty(n, dtype=np.int64)
        got = k.find_slot(st.pos, head, n, _NO_CELLS if taken is None else taken, out)
        return out if got == n else None
