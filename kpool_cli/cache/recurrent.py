"""The hybrid memory's recurrent child, as `llama_memory_recurrent` keeps it
(ENGINE.md §3 "The recurrent child"; src/llama-memory-recurrent.cpp).

Owns: the child's `size == n_seq_max` state cells (each with the last position its
state has seen and the sequences that share it), its `head` and `used`, per
sequence its tail cell and its pending rollback (`rs_idx`: the snapshot plane a
rollback selected, 0 when none is pending), and the states saved by `state_write`.
kpool models no state values, only what changes what the k-pool engine sees:
- `seq_rm` may refuse, and then nothing changes anywhere: the hybrid memory asks
  this child first (`llama_memory_hybrid_idx::seq_rm`);
- `seq_pos_min(s)` / `seq_pos_max(s)` (the state's position, -1 without one),
  which the hybrid memory combines with the attention cache's for batch
  validation (`HybridPositions`).

Invariants:
- `tail[s]` is -1 or a cell, and every sequence is in at most one cell; a cell with
  no sequence has `pos == -1`. The tail's cell holds s, except after a `seq_rm` of a
  negative id: it empties cells and leaves their tails (the code resets a tail only
  for `seq_id >= 0`), so s's tail dangles until s leaves it, and find_slot asserts
  on a dangling tail (`RecurrentAssert`);
- `rs_idx[s]` is 0, or in `1..n_rs_seq` after a rollback not yet consumed;
- a sequence in a cell has that cell as its tail;
- `_dangling` is exactly the set of sequences whose tail dangles (what a scan of
  every tail finds, `_dangling_scan`): every mutator of the tails and the cells'
  sequences keeps it, so a decode asks no scan of `prepare`, and reading a state's
  position need not test the tail's cell while it is empty (no tail dangles);
- `_placed`, when not None, names sets of one sequence each that find_slot left in
  place (the sets' ids, their first cell: each alone in its cell, in order) with
  `used` counted since: every other mutator of the tails or the cells' sequences
  drops it, so a step of parallel slots that repeats the last one's sets is found
  in place, and `used` standing, without a scan of its sets or cells.
`check_invariants` checks them all (tests run it after random op sequences).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from ..wording import counted
from .aborts import RecurrentAssert
from .batch import SeqPositions
from .cells import llama_pos

_UINT32 = (1 << 32) - 1  # `used` and `head` are uint32_t

INT_MAX = 2**31 - 1


def n_keep_tail(n_rs_seq: int) -> int:
    """What the hybrid memory's init_batch asks split_equal to keep together: the
    trailing n_rs_seq + 1 tokens of each sequence (0: no constraint), so that the
    rollback snapshots stay valid (TAG_RECURRENT_ROLLBACK_SPLITS)."""
    return n_rs_seq + 1 if n_rs_seq > 0 else 0


@dataclass(slots=True)
class _Cell:
    pos: int = -1
    seqs: set[int] = field(default_factory=set)


class EditRefused(Exception):
    """`llama_memory_recurrent::seq_rm` returned false: nothing changed (KP008)."""


_FIRST = itemgetter(0)
_MANY = 8  # `seq_pos_maxes`: from this many sequences, the tails' cells read at once


class RecurrentChild:
    def __init__(self, n_seq_max: int, n_rs_seq: int, *,
                 negative_seq_rm_matches_any: bool = True) -> None:
        self.size, self.n_rs_seq = n_seq_max, n_rs_seq  # rs_size = n_seq_max
        # EngineVersion.recurrent_seq_rm_matches_any (docs/ENGINE-NOTES.md)
        self.negative_seq_rm_matches_any = negative_seq_rm_matches_any
        self.saved: dict[str, int | None] = {}  # state_write slot -> its pos, or None
        self.clear()

    @property
    def n_keep_tail(self) -> int:
        return n_keep_tail(self.n_rs_seq)

    def seq_pos(self, s: int) -> int | None:
        """s's state position, None without a state (a seq_add can move it below 0)."""
        return self._state_pos((s,))[0]

    def _state_pos(self, seqs: Iterable[int]) -> list[int | None]:
        """`seq_pos` of each of `seqs` (a step of parallel slots asks for each of its
        sequences at once)."""
        tail, cells, size = self.tail, self.cells, self.size
        out: list[int | None] = []
        for s in seqs:
            t = tail[s] if 0 <= s < size else -1
            # seq_pos_min/max scan the cells holding s: a dangling tail is no state
            out.append(cells[t].pos if t >= 0 and s in cells[t].seqs else None)
        return out

    def seq_pos_min(self, s: int) -> int:
        """llama_memory_recurrent::seq_pos_min: the state's pos, -1 without one."""
        p = self.seq_pos(s)
        return -1 if p is None else p

    def seq_pos_max(self, s: int) -> int:
        """llama_memory_recurrent::seq_pos_max: the state's pos, at least -1."""
        return self.seq_pos_maxes((s,))[0]

    def seq_pos_maxes(self, seqs: Sequence[int]) -> list[int]:
        """`seq_pos_max` of each of `seqs`. With no tail dangling (`_dangling`), a
        sequence's tail cell holds it: `_state_pos`'s test of the cell is true, and
        the tail's cell is read alone (for many: a few cost more in the tests)."""
        if (len(seqs) >= _MANY and not self._dangling and min(seqs) >= 0
                and max(seqs) < self.size):
            cells = self.cells
            out = [cells[t].pos if t >= 0 else -1 for t in map(self.tail.__getitem__, seqs)]
            if min(out) >= -1:  # else a state below -1 (a seq_add): max(p, -1) below
                return out
        return [-1 if p is None else max(p, -1) for p in self._state_pos(seqs)]

    # -- edits -------------------------------------------------------------------------

    def clear(self) -> None:
        """llama_memory_recurrent::clear: every cell empty, head 0, every pending
        rollback gone. States saved by state_write stay (they live outside)."""
        self.cells = [_Cell() for _ in range(self.size)]
        self.tail = [-1] * self.size
        self.rs_idx = [0] * self.size
        self.head = self.used = 0
        self.n = 0  # the cells [head, head + n) the last ubatch's graph reads
        self._dangling: set[int] = set()  # the sequences whose tail dangles
        # (each set's seq ids, their first cell) when find_slot left those sets in place
        # and nothing has changed a tail or a cell's sequences since; else None
        self._placed: tuple[list[tuple[int, ...]], int] | None = None

    def seq_rm(self, s: int, p0: int, p1: int) -> None:
        """llama_memory_recurrent::seq_rm; raises EditRefused, having changed nothing,
        when it returns false:
        - a seq id at or above n_seq_max; a negative one too where the version refuses
          it (`(uint32_t) seq_id >= n_seq_max`, ggml-org/llama.cpp 0054ee8), else a
          negative id matches every sequence (`seq_id >= 0 && ...`, angt/llama.cpp
          d5437c2) over a range that holds every position or none (`p0 == p1`);
        - a removal that cuts into the state, `0 < p0 <= pos < p1` (pos: the state's),
          unless it is a rollback of 1..n_rs_seq tokens with none pending: then the
          state's pos becomes p0 - 1 and the rollback is pending (`rs_idx`).
        A whole-range removal (p0 <= 0, p1 < 0) clears the pending rollback first (of
        every sequence for a negative id). A negative id empties the cells in range
        and leaves the tails: they dangle (see the module's invariants)."""
        p0 = max(p0, 0)
        p1 = INT_MAX if p1 < 0 else p1
        if s >= self.size or (s < 0 and not self.negative_seq_rm_matches_any):
            raise EditRefused(f"llama_memory_recurrent::seq_rm refuses seq_id {s}: it must "
                              f"be in [0, {self.size}) (the recurrent state is per sequence)")
        whole = p0 == 0 and p1 == INT_MAX
        if whole:
            if s >= 0:
                self.rs_idx[s] = 0
            else:  # set_rs_idx(-1, 0): every pending rollback
                self.rs_idx = [0] * self.size
        if s < 0:
            if p0 != p1 and not whole:
                end = "inf" if p1 == INT_MAX else str(p1)
                raise EditRefused(f"llama_memory_recurrent::seq_rm refuses seq_id {s} over "
                                  f"{p0}..{end}: for every sequence the range must hold "
                                  "every position or none (a state cannot be cut)")
        elif (t := self.tail[s]) >= 0:
            cell = self.cells[t]
            if 0 < p0 <= cell.pos < p1:
                rollback = cell.pos - (p0 - 1)
                pending = self.rs_idx[s] != 0
                if not pending and 1 <= rollback <= self.n_rs_seq:
                    self.rs_idx[s] = rollback
                    cell.pos = p0 - 1
                    return
                why = ("a rollback is already pending (one per decode)" if pending else
                       f"a rollback of {counted(rollback, 'token', number=str)} needs "
                       f"n_rs_seq >= {rollback} (n_rs_seq is {self.n_rs_seq})")
                end = "inf" if p1 == INT_MAX else str(p1)
                raise EditRefused(f"the recurrent state of seq {s} is at pos {cell.pos}: "
                                  f"removing {p0}..{end} would cut it, and {why}")
            if p0 <= cell.pos < p1:
                self.tail[s] = -1
                self._dangling.discard(s)
        self._placed = None
        new_head = self.size
        for k, c in enumerate(self.cells):
            if p0 <= c.pos < p1 and (s < 0 or s in c.seqs):
                if s < 0:
                    c.seqs = set()
                else:
                    c.seqs.discard(s)
                if not c.seqs:
                    self._used_less()
                    c.pos = -1
                    new_head = min(new_head, k)
        if s < 0:  # the tails of the emptied cells dangle now
            self._dangling = self._dangling_scan()
        if new_head < self.head:
            self.head = new_head

    def seq_cp(self, src: int, dst: int) -> None:
        """llama_memory_recurrent::seq_cp: the range is ignored; dst leaves its cell
        and shares src's tail cell. Pending rollbacks are untouched."""
        if src == dst:
            return
        self._placed = None
        self._leave(dst)
        t = self.tail[src]
        if t >= 0:
            self.cells[t].seqs.add(dst)
            self.tail[dst] = t

    def seq_keep(self, s: int) -> None:
        """llama_memory_recurrent::seq_keep: cells without s empty out; s's cell keeps
        only s; every other tail is gone (a cell of s shared with others keeps its pos)."""
        new_head = self.size
        self._dangling &= {s}  # every other tail is gone; s's cell keeps it, if any
        self._placed = None
        for k, c in enumerate(self.cells):
            if k != s:
                self.tail[k] = -1
            if s not in c.seqs:
                if c.pos >= 0:
                    self._used_less()
                c.pos, c.seqs = -1, set()
                new_head = min(new_head, k)
            else:
                c.seqs = {s}
        if new_head < self.head:
            self.head = new_head

    def seq_add(self, s: int, p0: int, p1: int, shift: int) -> None:
        """llama_memory_recurrent::seq_add: s's state pos moves when it is in
        [p0, p1) (for every sequence sharing the cell), in int32 (`llama_pos`)."""
        if shift != 0:
            self._move_tail(s, p0, p1, lambda pos: llama_pos(pos + shift))

    def seq_div(self, s: int, p0: int, p1: int, d: int) -> None:
        """llama_memory_recurrent::seq_div: as seq_add, pos /= d (C division)."""
        if d != 1:
            self._move_tail(s, p0, p1, lambda pos: pos // d)  # pos >= 0 and d > 0

    def state_write(self, s: int, slot: str) -> None:
        """llama_memory_recurrent::state_write of s: its cell's pos (whatever its sign),
        or none."""
        self.saved[slot] = self.seq_pos(s)

    def state_read(self, s: int, slot: str) -> None:
        """llama_memory_recurrent::state_read into s: `seq_rm(s, -1, -1)` (so an empty
        saved state leaves s without one), then find_slot for the saved cell, and no
        rollback pending."""
        self.seq_rm(s, -1, -1)
        pos = self.saved[slot]
        if pos is not None:
            self.find_slot([((s,), pos)])
        self.rs_idx[s] = 0

    def state_drop(self, s: int) -> None:
        """llama_memory_hybrid_idx::state_drop calls seq_rm(s, -1, -1) on this child
        directly, ignoring a refusal (s < 0 is the caller's `clear`)."""
        with contextlib.suppress(EditRefused):
            self.seq_rm(s, -1, -1)

    # -- a decode ----------------------------------------------------------------------

    def apply_ubatch(self, sets: list[tuple[tuple[int, ...], int]]) -> None:
        """One ubatch: `sets` lists its sequence sets in ubatch order, each as (seq ids
        of its first token, in the token's order; pos of its last token). find_slot,
        then the graph input `s_copy` reads and consumes the pending rollbacks."""
        self.find_slot(sets)
        if self.n_rs_seq:
            self._consume_rollbacks()

    def prepare(self, ubatches: Iterable[Iterable[tuple[int, ...]]]) -> None:
        """llama_memory_recurrent::prepare, which the hybrid memory's init_batch runs
        before the attention cache's: find_slot for every ubatch (each given as its
        tokens' seq ids) on a copy of the cells. Its one failure is find_slot's assert
        on a dangling tail (RecurrentAssert): a sequence whose first appearance in the
        decode is as the first id of a set; appearing coupled after the first id, it
        leaves its cell instead, and once placed its tail holds it."""
        if not self._dangling:
            return
        placed: set[int] = set()
        for seq_sets in ubatches:
            sets = list(dict.fromkeys(seq_sets))
            placed.update(s for ss in sets for s in ss[1:])
            for ss in sets:
                if ss[0] not in placed and self._dangles(ss[0]):
                    raise RecurrentAssert(_dangling_message(ss[0], self.tail[ss[0]]))
                placed.update(ss)

    def find_slot(self, sets: list[tuple[tuple[int, ...], int]]) -> None:
        """llama_memory_recurrent::find_slot (every seq id is below size, checked by
        the loader). Coupled ids after the first leave their cells; the first id of
        each set gets a cell it owns alone (from the next empty cell after `head`,
        copying its old pos), where a dangling tail is its `GGML_ASSERT(cell.
        has_seq_id(seq_id))` (RecurrentAssert); the sets' cells are swapped into
        `[min, min + n_sets)` in set order; each takes the set's last pos and exactly
        its seq ids. Then head = min, n = max - min + 1 (max: before the swaps)."""
        n_seqs = len(sets)
        # in uint32, as the code's `head > used + 2*n_seqs` (`_used_less`)
        if self.head > (self.used + 2 * n_seqs) & _UINT32:
            self.head = 0
        ids = list(map(_FIRST, sets))  # each set's seq ids
        placed = self._placed
        kept = placed is not None and placed[0] == ids  # `_placed`: no scan
        lo = placed[1] if placed is not None and kept else self._in_place(sets)
        if lo is not None:  # nothing leaves, moves or swaps: each set takes its last pos
            cells = self.cells
            for cell, (_seqs, last) in zip(cells[lo:lo + n_seqs], sets, strict=True):
                cell.pos = last
            self.head, self.n = lo, n_seqs
            if not kept:  # else no cell's sequences changed since the last count
                self.used = self._n_used()
                self._placed = (ids, lo)
            return
        self._placed = None
        for seqs, _ in sets:
            for s in seqs[1:]:
                self._leave(s)
        nxt = self._next_empty(self.head)
        lo, hi = self.size - 1, 0
        for k, (seqs, _) in enumerate(sets):
            s = seqs[0]
            t = self.tail[s]
            if self._dangles(s):
                raise RecurrentAssert(_dangling_message(s, t))
            if t < 0 or len(self.cells[t].seqs) != 1:
                empty = self.cells[nxt]
                assert not empty.seqs, "one cell per sequence always leaves an empty one"
                if t >= 0:
                    orig = self.cells[t]
                    empty.pos = orig.pos
                    orig.seqs.discard(s)
                    empty.seqs.add(s)
                self.tail[s] = nxt
                if k + 1 < n_seqs:
                    nxt = self._next_empty(nxt + 1)
            lo, hi = min(lo, self.tail[s]), max(hi, self.tail[s])
        for k, (seqs, _) in enumerate(sets):
            dst, src = k + lo, self.tail[seqs[0]]
            if dst != src:
                a, b = self.cells[dst], self.cells[src]
                a.pos, b.pos = b.pos, a.pos
                a.seqs, b.seqs = b.seqs, a.seqs
                self.tail = [dst if x == src else src if x == dst else x for x in self.tail]
        for k, (seqs, last) in enumerate(sets):
            cell = self.cells[k + lo]
            cell.pos, cell.seqs = last, set(seqs)
            for s in seqs:
                self.tail[s] = k + lo
        self.head, self.n = lo, hi - lo + 1
        self.used = self._n_used()
        self._placed = (ids, lo) if all(len(ss) == 1 for ss in ids) else None

    # -- private -----------------------------------------------------------------------

    def _consume_rollbacks(self) -> None:
        """llama_memory_recurrent_context::s_copy, for each cell of [head, head + n):
        the smallest seq id of the cell has its pending rollback read and reset. So a
        sequence sharing a cell with a smaller id keeps its own, and a cell inside the
        range that the ubatch did not use consumes its sequence's."""
        for c in self.cells[self.head:self.head + self.n]:
            if c.seqs:
                self.rs_idx[min(c.seqs)] = 0

    def _in_place(self, sets: list[tuple[tuple[int, ...], int]]) -> int | None:
        """find_slot's first cell when the sets are already where it would put them
        (a step of parallel slots after the first): each set one sequence, alone in
        its own cell (its tail), those cells consecutive in set order. Else None."""
        if not sets:
            return None
        lo = self.tail[sets[0][0][0]]
        for k, (seqs, _) in enumerate(sets):
            t = self.tail[seqs[0]]
            if len(seqs) != 1 or t < 0 or t != lo + k or self.cells[t].seqs != {seqs[0]}:
                return None
        return lo

    def _used_less(self) -> None:
        """A cell emptied: `used -= 1`, in the code's `uint32_t` (ENGINE.md §3 "The
        recurrent child"). It is decremented whenever a sequence leaves a cell and
        the cell is empty after, even one a `seq_rm` of a negative id had emptied
        already (a dangling tail's), so it can pass below 0 and wrap to 2^32 - k."""
        self.used = (self.used - 1) & _UINT32

    def _n_used(self) -> int:
        """find_slot's count of the cells holding a sequence."""
        return sum(1 for c in self.cells if c.seqs)

    def _dangles(self, s: int) -> bool:
        t = self.tail[s]
        return t >= 0 and s not in self.cells[t].seqs

    def _dangling_scan(self) -> set[int]:
        """The sequences whose tail dangles, from every tail (what `_dangling` holds)."""
        return {s for s in range(self.size) if self._dangles(s)}

    # -- checks ------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """The module's invariants, each from scratch."""
        for k, c in enumerate(self.cells):
            assert c.seqs or c.pos == -1, f"empty cell {k} at pos {c.pos}"
            for s in c.seqs:
                assert 0 <= s < self.size and self.tail[s] == k, \
                    f"seq {s} in cell {k} has tail {self.tail[s]}"
        assert all(-1 <= t < self.size for t in self.tail), "a tail out of range"
        assert all(0 <= r <= self.n_rs_seq for r in self.rs_idx), "rs_idx out of range"
        assert self._dangling == self._dangling_scan(), "_dangling out of sync"
        if self._placed is not None:
            ids, lo = self._placed
            assert self._in_place([(ss, 0) for ss in ids]) == lo, "_placed is not in place"
            assert self.used == self._n_used(), "_placed with used out of date"

    def _leave(self, s: int) -> None:
        """s leaves its tail cell, which empties if s was its last sequence."""
        t = self.tail[s]
        if t >= 0:
            cell = self.cells[t]
            cell.seqs.discard(s)
            self.tail[s] = -1
            self._dangling.discard(s)
            self._placed = None
            if not cell.seqs:
                cell.pos = -1
                self._used_less()

    def _next_empty(self, start: int) -> int:
        """find_slot's scan: the first empty cell from `start`, wrapping once. There is
        always one when a set needs it (a sequence is in one cell at most)."""
        for k in range(start, start + self.size):
            if not self.cells[k % self.size].seqs:
                return k % self.size
        return start % self.size

    def _move_tail(self, s: int, p0: int, p1: int, move: Callable[[int], int]) -> None:
        lo, hi = max(p0, 0), INT_MAX if p1 < 0 else p1
        if lo == hi or not 0 <= s < self.size or self.tail[s] < 0:
            return
        cell = self.cells[self.tail[s]]
        if s in cell.seqs and lo <= cell.pos < hi:
            cell.pos = move(cell.pos)


def _dangling_message(s: int, t: int) -> str:
    return (f"GGML_ASSERT(cell.has_seq_id(seq_id)) in llama_memory_recurrent::find_slot: "
            f"seq {s}'s tail is state cell {t}, which no longer holds it (a seq_rm of "
            "every sequence emptied the cell and left the tail)")


class HybridPositions:
    """The hybrid memory's `seq_pos_min` / `seq_pos_max`, which batch validation reads
    (llama_batch_allocr::init asks the memory): the min of the whole memory is the
    max of its two children's mins, its max the min of their maxes
    (llama_memory_hybrid::seq_pos_min / seq_pos_max). With a recurrent state both
    are its position, once the attention cache holds the sequence; a sequence with
    cells but no state has max -1 (it may start anywhere)."""

    def __init__(self, kv: SeqPositions, recurrent: RecurrentChild) -> None:
        self.kv, self.recurrent = kv, recurrent

    def seq_pos_min(self, s: int) -> int:
        return max(self.kv.seq_pos_min(s), self.recurrent.seq_pos_min(s))

    def seq_pos_max(self, s: int) -> int:
        return min(self.kv.seq_pos_max(s), self.recurrent.seq_pos_max(s))

    def seq_pos_maxes(self, seqs: Sequence[int]) -> list[int]:
        kv, rec = self.kv.seq_pos_maxes(seqs), self.recurrent.seq_pos_maxes(seqs)
        if len(kv) == 1:  # a decode of one sequence
            return [min(kv[0], rec[0])]
        # min of each pair, compared inline: a call of min a pair costs more than it
        return [a if a < b else b for a, b in zip(kv, rec, strict=True)]
