"""Kernel safety, the doors: every value kernel runs behind its checks, and is timed
when asked.

Owns: `GuardedKernels`, the one way the value backend runs a kernel (`write_rows`,
`scatter_fresh`, `gather`, `pools_differ` and, by rows, `rows_differ`, `fresh_groups`,
`stamp_winners`, the three of a scatter of single-entry groups at once:
`scatter_singles`, the pools a changed row dirties: `dirty_pools`, `pools_of_pairs`,
`held_pairs`, and the verification's choices: `recheck_ways`, `least_pair`, and of a
layout of one sequence, its way and verdicts at once: `recheck_one`, of many
sequences and one stream, every way and verdict at once: `recheck_many`), and the
time spent inside each once `time_kernels` asks (`time`, seconds by kernel name: the
benchmark's breakdown). The kernels come from `kernels.py` (numba) or `reference.py`
(numpy); both give bit-identical arrays.
The value kernels index the slot arrays (`slots.py`) with slots, never rows, and
check nothing. `rows_differ` and the last ten read a scatter's rows through
`slot_of`, its race groups and their slots, a sequence's pairs, a dirty-cell mask, a
stream's cells and holders, the layout's rep columns or its flat columns: their
doors check types and shapes, and the kernels check each index as they read it (a
pass over them at the door would cost what the kernels save), refusing with
`IndexError`, which the door turns into `PlanError` (`rows_differ`, `recheck_one`
and `recheck_many` answer None, and the verifier's general way says what).

Invariant: no kernel reads or writes outside its arrays. Each value kernel's door
checks what it is handed against those arrays before the kernel runs
(`SlotTable.check_tables`: float32, C-contiguous, n_embd wide, a row for every slot
handed out; `guards.checked_index`: slots in use, sources within the values, shapes
that agree, distinct slots where one iteration writes each) and raises `PlanError`
naming the step, the array and the element otherwise (the kernel-safety contract:
`guards.py`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from ..arrays import same_objects
from .guards import (
    ANY,
    FREE_OUTSIDE,
    I64,
    NO_ROOM,
    ROW_OUTSIDE,
    SLOT_OUTSIDE,
    WROTE,
    WROTE_NOTHING,
    PlanError,
    checked_index,
    outside_error,
)
from .slots import SlotTable

if TYPE_CHECKING:
    from ..engine.layout import FlatColumns


class GuardedKernels:
    """The kernels of module `k` on the arrays of `slots`, each behind its checks:
    slots in [first, slots in use)."""

    def __init__(self, k: ModuleType, state: np.uint64, slots: SlotTable) -> None:
        self.k = k
        self.state = state  # the keys' seed state (`keys.seed_state`)
        self.slots = slots
        self.n_embd, self.kpool = slots.n_embd, slots.kpool
        self.time: dict[str, float] = defaultdict(float)
        # `recheck_one`'s arrays of its one sequence, made here, filled each call: the
        # pool starts [0, n], its kept verdicts, its kept pools; whether it is known equal
        one = np.zeros(4, dtype=np.int64)
        self._one = one[:2], one[2:3], one[3:], np.zeros(1, dtype=np.bool_)
        # `recheck_many`'s arrays that stand from call to call (the stream's positions,
        # holders and their sequences, the layout's flat columns), as last checked
        self._many_checked: tuple[np.ndarray, ...] = ()

    def time_kernels(self) -> None:
        """From now on, add the seconds spent inside each kernel to `time` (the
        benchmark's breakdown; a replay does not pay the clock: two reads a call)."""
        self._timed = self._clocked  # type: ignore[method-assign]

    @staticmethod
    def _timed(name: str, fn, *args):
        return fn(*args)

    def _clocked(self, name: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.time[name] += time.perf_counter() - t0
        return out

    def write_rows(self, rows: np.ndarray, key_ids: np.ndarray, n_ubatch: int, kind: int
                   ) -> np.ndarray:
        """A decode's rows written (`kernels.write_rows`): a slot for each row that has
        none, its key and gate rows, a zeroed pooled row, the writer `kind` at
        `n_ubatch`. Returns the rows' slots. `rows`: distinct (the caller checks them
        against n_rows); the kernel checks each row, slot and free slot before its
        first write, and the slot arrays grow first when they lack the room."""
        where = "write_keys"
        t = self.slots
        t.check_tables(where)
        _one_d(where, ("rows", rows, I64), ("key ids", key_ids, I64))
        if key_ids.shape != rows.shape:
            raise PlanError(f"{where}: {key_ids.size} key ids for {rows.size} rows", where,
                            "key ids")
        out = np.empty(rows.size, dtype=np.int64)
        while True:
            why, at = self._timed(where, self.k.write_rows, self.state, rows, key_ids,
                                  t.slot_of, t.free, t.n_handed, t.pristine, t.gen, n_ubatch,
                                  kind, t.key, t.gate, t.pooled, t.slot_row, t.key_gen,
                                  t.pool_gen, t.w_kind, t.w_ubatch, t.w_a, t.w_b, out)
            if why != NO_ROOM:
                break
            t.make_room(at)
        if why == WROTE:
            t.handed_out(at)
            return out
        if why == ROW_OUTSIDE:
            raise outside_error(rows, at, 0, t.slot_of.size, where, "rows", "row")
        assert why in (SLOT_OUTSIDE, FREE_OUTSIDE), why
        name, a = ("slots", t.of(rows)) if why == SLOT_OUTSIDE else ("free slots", t.free)
        raise outside_error(a, at, 1, t.n_handed, where, name, "slot")

    def scatter_fresh(self, members: np.ndarray, reps: np.ndarray, keep: np.ndarray,
                      s: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A scatter's fresh groups (`kernels.scatter_fresh`): each entry's value (its
        rep slot's `reps[e]` where `keep[e]`, else the pooling of its member slots
        `members[e]`), then each group's row slot `s[g]` written with its last entry's
        value and pooling, `vals[src[g]]`, at the current generation. Returns (the
        entries' values, [groups] the row's bits changed)."""
        where = "scatter"
        t = self.slots
        t.check_tables(where)
        t.check_generations(where)
        members = checked_index(members, 0, t.n_handed, (None, self.kpool), False, where,
                                "member slots", "slot")
        reps = checked_index(reps, 0, t.n_handed, members.shape[:1], False, where,
                             "rep slots", "slot")
        if type(keep) is not np.ndarray or keep.dtype != np.bool_ \
                or keep.shape != reps.shape or not keep.flags.c_contiguous:
            raise PlanError(f"{where}: the kept flags are not a C-contiguous bool array of "
                            f"{reps.size}", where, "kept flags")
        s = checked_index(s, 1, t.n_handed, ANY, True, where, "slots", "slot")
        src = checked_index(src, 0, reps.size, s.shape, False, where, "sources", "entry")
        vals = np.empty((reps.size, self.n_embd), dtype=np.float32)
        changed = self._timed(where, self.k.scatter_fresh, t.key, t.gate, t.pooled, t.pool_of,
                              t.pool_gen, t.gen, members, reps, keep, s, src, vals)
        return vals, changed

    def gather(self, s: np.ndarray) -> np.ndarray:
        where = "gather"
        t = self.slots
        t.check_tables(where)
        s = checked_index(s, 0, t.n_handed, ANY, False, where, "slots", "slot")
        return self._timed(where, self.k.gather, t.pooled, s)

    def pools_differ(self, members: np.ndarray, reps: np.ndarray) -> np.ndarray:
        where = "check"
        t = self.slots
        t.check_tables(where)
        t.check_generations(where)
        members, reps = self._entries(where, members, reps)
        return self._timed(where, self.k.pools_differ, t.key, t.gate, t.pooled, t.pool_of,
                           t.pool_gen, t.key_gen, members, reps)

    def rows_differ(self, members: np.ndarray, reps: np.ndarray) -> np.ndarray | None:
        """`pools_differ` of entries given by their rows (member rows [n, kpool], rep
        rows [n]), read through the slot map in one kernel pass, which checks each row
        and its slot as it reads it. None, nothing done, when the arrays are not int64
        and C-contiguous of those shapes, or a row or its slot is outside its array:
        the caller then checks them the long way, which says what (`checked_rows`,
        `pools_differ`'s door)."""
        where = "check"
        t = self.slots
        t.check_tables(where)
        t.check_generations(where)
        if (type(members) is not np.ndarray or members.dtype != I64 or members.ndim != 2
                or members.shape[1] != self.kpool or not members.flags.c_contiguous
                or type(reps) is not np.ndarray or reps.dtype != I64
                or reps.shape != members.shape[:1] or not reps.flags.c_contiguous):
            return None
        return self._timed(where, self.k.rows_differ, t.slot_of, t.n_handed, t.key, t.gate,
                           t.pooled, t.pool_of, t.pool_gen, t.key_gen, members, reps)

    def fresh_groups(self, entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
                     starts: np.ndarray, rows: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """`kept` of every entry (member rows `entry_rows`, rep row `rep`) through the
        rows' slots, per race group `order[starts[g]:starts[g + 1]]` (writing
        `rows[g]`): (fresh groups, each entry kept, entries kept, each entry in a
        fresh group). The kernel checks
        each entry, row and slot as it reads it, and that the groups are race groups
        of `rep`."""
        where = "kept"
        t = self.slots
        t.check_generations(where)
        _one_d(where, ("rep rows", rep, I64), ("group entries", order, I64),
               ("group starts", starts, I64), ("group rows", rows, I64))
        self._member_rows(where, entry_rows, rep.size)
        try:
            return self._timed(where, self.k.fresh_groups, t.slot_of, t.pool_of, t.pool_gen,
                               t.key_gen, entry_rows, rep, order, starts, rows)
        except (IndexError, ValueError) as e:
            raise PlanError(f"{where}: {e}", where, "race groups") from None

    def stamp_winners(self, order: np.ndarray, starts: np.ndarray, entry_pool: np.ndarray,
                      pool_start: np.ndarray, slots: np.ndarray, n_ubatch: int, pooled: int,
                      padding: int) -> None:
        """The writer of each race group's row (`order[starts[g]:starts[g + 1]]`, in
        slot `slots[g]`): its last entry, of kind `pooled` with its pool's (seq, k)
        by `pool_start`, or `padding`, at ubatch `n_ubatch` (`writers.py`). The
        kernel checks each group's last entry, its pool and its slot before its
        first write."""
        where = "stamp"
        t = self.slots
        _one_d(where, ("group entries", order, I64), ("group starts", starts, I64),
               ("entry pools", entry_pool, I64), ("pool starts", pool_start, I64),
               ("slots", slots, I64))
        try:
            self._timed(where, self.k.stamp_winners, order, starts, entry_pool, pool_start,
                        slots, n_ubatch, pooled, padding, t.w_kind, t.w_ubatch, t.w_a, t.w_b)
        except (IndexError, ValueError) as e:
            raise PlanError(f"{where}: {e}", where, "race groups") from None

    def scatter_singles(self, entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
                        rows: np.ndarray, entry_pool: np.ndarray, pool_start: np.ndarray,
                        n_ubatch: int, pooled: int, padding: int
                        ) -> tuple[np.ndarray, np.ndarray, int] | None:
        """`fresh_groups`, `scatter_fresh` and `stamp_winners` of a scatter whose race
        groups hold one entry each (group g: entry `order[g]`, writing row `rows[g]`),
        in one kernel pass: (each group's row's slot, the groups whose row's bits
        changed, the entries kept), or None, nothing written, when a group's row has
        no slot yet. The kernel checks each entry, row, member row and slot as it
        reads it (each slot its row's alone, by `slot_row`), and that the groups are
        race groups of `rep`, before its first write."""
        where = "scatter"
        t = self.slots
        t.check_tables(where)
        t.check_generations(where)
        _one_d(where, ("rep rows", rep, I64), ("group entries", order, I64),
               ("group rows", rows, I64), ("entry pools", entry_pool, I64),
               ("pool starts", pool_start, I64))
        self._member_rows(where, entry_rows, rep.size)
        try:
            return self._timed(where, self.k.scatter_singles, t.slot_of, t.slot_row,
                               t.n_handed, t.key, t.gate, t.pooled, t.pool_of, t.pool_gen,
                               t.key_gen, t.gen, entry_rows, rep, order, rows, entry_pool,
                               pool_start, n_ubatch, pooled, padding, t.w_kind, t.w_ubatch,
                               t.w_a, t.w_b)
        except (IndexError, ValueError) as e:
            raise PlanError(f"{where}: {e}", where, "race groups") from None

    def dirty_pools(self, keys: np.ndarray, starts: np.ndarray, dirty: np.ndarray
                    ) -> np.ndarray:
        """The pools of `starts` (a sequence's, over its pairs `keys`) with a member
        whose cell is `dirty`. The numba kernel checks each start and cell as it reads
        them (a pass over every pool here would cost what the kernel saves); numpy's
        twin indexes safely."""
        where = "dirty pools"
        _one_d(where, ("pairs", keys, I64), ("pool starts", starts, I64),
               ("dirty cells", dirty, np.dtype(np.bool_)))
        try:
            return self._timed(where, self.k.dirty_pools, keys, starts, self.kpool, dirty)
        except IndexError as e:
            raise PlanError(f"{where}: {e}", where, "pool starts") from None

    def pools_of_pairs(self, keys: np.ndarray, starts: np.ndarray, members: np.ndarray,
                       reps: np.ndarray) -> np.ndarray | None:
        """The pools of `starts` over the pairs `keys` with a member among the pairs
        `members` or their rep among `reps`; None if one of those is not in `keys`. The
        kernel's binary searches read only inside the arrays, whatever they hold."""
        where = "pools of pairs"
        _one_d(where, ("pairs", keys, I64), ("pool starts", starts, I64),
               ("member pairs", members, I64), ("rep pairs", reps, I64))
        return self._timed(where, self.k.pools_of_pairs, keys, starts, self.kpool, members,
                           reps)

    def held_pairs(self, cells: np.ndarray, has: np.ndarray, pos: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Per column of a stream's `has`, the pairs of the cells `cells` it holds. The
        kernel checks each cell against the stream before it reads."""
        where = "held pairs"
        _one_d(where, ("cells", cells, I64), ("positions", pos, I64))
        if type(has) is not np.ndarray or has.dtype != np.bool_ or has.ndim != 2 \
                or not has.flags.c_contiguous or has.shape[1] != pos.size:
            raise PlanError(f"{where}: the holders are not a C-contiguous bool array of "
                            f"n x {pos.size}", where, "holders")
        try:
            return self._timed(where, self.k.held_pairs, cells, has, pos)
        except IndexError as e:
            raise PlanError(f"{where}: {e}", where, "cells") from None

    def recheck_ways(self, start: np.ndarray, n_bad: np.ndarray, kept: np.ndarray,
                     known: np.ndarray, rep_pos: np.ndarray, rep_rows: np.ndarray,
                     dirty: bool, too_many: bool, cells: np.ndarray, pos: np.ndarray,
                     least: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """How each sequence finds its pools to recheck, its kept tail (`recheck.py`),
        and whether the least changed pair (`least`, the other streams', and the pairs
        of one stream's changed cells `cells`, its positions `pos`) lies at or before
        some tail. The kernel checks each cell against the stream, and each last kept
        pool against the columns, as it reads it."""
        where = "recheck ways"
        _one_d(where, ("pool starts", start, I64), ("kept verdicts", n_bad, I64),
               ("kept pools", kept, I64), ("known-equal flags", known, np.dtype(np.bool_)),
               ("rep positions", rep_pos, I64), ("rep rows", rep_rows, I64),
               ("cells", cells, I64), ("positions", pos, I64))
        n = kept.size
        if start.size != n + 1 or n_bad.size != n or known.size != n:
            raise PlanError(f"{where}: {start.size} pool starts, {n_bad.size} kept verdicts "
                            f"and {known.size} known-equal flags for {n} sequences", where,
                            "kept pools")
        try:
            return self._timed(where, self.k.recheck_ways, start, n_bad, kept, known, rep_pos,
                               rep_rows, self.slots.kv_size, dirty, too_many, cells, pos,
                               least)
        except IndexError as e:
            raise PlanError(f"{where}: {e}", where,
                            "cells" if str(e).startswith("cells") else "kept pools") from None

    def recheck_one(self, n_pools: int, n_bad: int, kept: int, known: bool,
                    rep_pos: np.ndarray, rep_rows: np.ndarray, dirty: bool, too_many: bool,
                    cells: np.ndarray, pos: np.ndarray, keys: np.ndarray, pools: np.ndarray,
                    row0: int) -> tuple[int, np.ndarray] | None:
        """The verification of a layout of one sequence (`n_pools` pools, `n_bad`
        verdicts, `kept` pools kept by the update, `known` equal to the cache's, its
        rep columns, its pairs `keys`, its pools' first pairs `pools`, its rows from
        `row0`) in one pass where its way is NONE or NEW (`kernels.recheck_one`): the
        way and the verdicts of the pools past the kept ones, or None where the general
        way must answer. The door checks the arrays' types (the one sequence's counts
        go in arrays of its own); the kernel checks each cell, pair, row and slot as
        it reads it, and answers None for one outside its array (the general way then
        says which)."""
        where = "recheck one"
        t = self.slots
        t.check_tables(where)
        t.check_generations(where)
        _one_d(where, ("rep positions", rep_pos, I64), ("rep rows", rep_rows, I64),
               ("cells", cells, I64), ("positions", pos, I64), ("pairs", keys, I64),
               ("pools' first pairs", pools, I64))
        start, n_bad_a, kept_a, known_a = self._one_sequence(where, n_pools, n_bad, kept,
                                                             known)
        return self._timed(where, self.k.recheck_one, start, n_bad_a, kept_a, known_a,
                           rep_pos, rep_rows, t.kv_size, dirty, too_many, cells, pos, keys,
                           pools, row0, t.slot_of, t.n_handed, t.key, t.gate, t.pooled,
                           t.pool_of, t.pool_gen, t.key_gen)

    def recheck_many(self, start: np.ndarray, n_bad: np.ndarray, kept: np.ndarray,
                     known: np.ndarray, rep_pos: np.ndarray, rep_rows: np.ndarray, dirty: bool,
                     too_many: bool, cells: np.ndarray, pos: np.ndarray, has: np.ndarray,
                     ids: np.ndarray, cols: FlatColumns
                     ) -> tuple[np.ndarray, np.ndarray] | None:
        """The verification of a layout of many sequences and one stream (its pool
        starts, kept verdicts, kept pools, known-equal flags and rep columns; the
        stream's changed cells `cells`, its positions, its holders `has` and their
        sequences `ids`; every sequence's pairs and pools, `cols`) in one pass where
        every way is NONE or NEW (`kernels.recheck_many`): the ways and the verdicts of
        the pools past each sequence's kept ones, or None where the general way must
        answer. The door checks the arrays' types and that the per-sequence ones agree
        in size (`recheck_ways`' door), and holders of a column per sequence id and a
        cell per position; the kernel checks each cell, column, pair, pool, row and
        slot as it reads it, and answers None for one outside its array (the general
        way then says which)."""
        where = "recheck many"
        t = self.slots
        t.check_tables(where)
        t.check_generations(where)
        _one_d(where, ("pool starts", start, I64), ("kept pools", kept, I64),
               ("known-equal flags", known, np.dtype(np.bool_)),
               ("rep positions", rep_pos, I64), ("rep rows", rep_rows, I64),
               ("cells", cells, I64))
        standing = (n_bad, pos, has, ids, *cols)
        if not same_objects(self._many_checked, standing):  # checked when new (no array's
            # dtype, shape or layout changes in place)
            self._many_checked = ()
            _one_d(where, ("kept verdicts", n_bad, I64), ("positions", pos, I64),
                   ("sequence ids", ids, I64), ("live pairs", cols.n_keys, I64),
                   ("streams", cols.strm, I64))
            _one_d(where, ("pairs", cols.keys, I64), ("pools' first pairs", cols.pools, I64),
                   ("pools' rep rows", cols.rep_rows, I64),
                   ("holders", has, np.dtype(np.bool_)), ndim=2)
            if has.shape != (ids.size, pos.size):
                raise PlanError(f"{where}: holders of shape {has.shape} for {ids.size} "
                                f"sequence ids and {pos.size} cells", where, "holders")
            self._many_checked = standing
        n = kept.size
        if start.size != n + 1 or n_bad.size != n or known.size != n:
            raise PlanError(f"{where}: {start.size} pool starts, {n_bad.size} kept verdicts "
                            f"and {known.size} known-equal flags for {n} sequences", where,
                            "kept pools")
        return self._timed(where, self.k.recheck_many, start, n_bad, kept, known, rep_pos,
                           rep_rows, t.kv_size, dirty, too_many, cells, pos, has, ids,
                           cols.keys, cols.n_keys, cols.pools, cols.rep_rows, cols.strm,
                           t.slot_of, t.n_handed, t.key, t.gate, t.pooled, t.pool_of,
                           t.pool_gen, t.key_gen)

    def one_step(self, rows: np.ndarray, key_ids: np.ndarray, n_ubatch: int, decode_kind: int,
                 entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
                 grows: np.ndarray, entry_pool: np.ndarray, pool_start: np.ndarray,
                 pooled_kind: int, padding_kind: int, n_pools: int, n_bad: int, kept: int,
                 known: bool, rep_pos: np.ndarray, rep_rows: np.ndarray,
                 lookup_max: int, dirty_before: np.ndarray, pos: np.ndarray, keys: np.ndarray,
                 pools: np.ndarray, row0: int, scatter: bool) -> tuple | None:
        """A ubatch of one sequence in one pass (`kernels.one_step`): `write_rows`,
        `scatter_singles` (when `scatter`) and `recheck_one` in turn, at generations
        `gen + 1` and `gen + 2` (the caller takes them: `SlotTable.next_gen`), the slot
        arrays grown first when the write lacks the room and the slots the write handed
        out counted (`handed_out`). Returns the kernel's answer (how far it went:
        `guards.py`), or None, nothing done, where the parts must each run alone:
        shapes that do not agree or an array numba's signature does not take (the
        general way's doors then name the fault), or rows the pass does not take. The
        kernel checks the rows' distinctness and every index as each part's kernel
        does, before that part's first write."""
        where = "one step"
        t = self.slots
        if (key_ids.shape != rows.shape or entry_rows.shape != (rep.size, self.kpool)
                or entry_pool.shape != rep.shape):
            return None  # shapes that do not agree: the general way's doors say which
        start, n_bad_a, kept_a, known_a = self._one_sequence(where, n_pools, n_bad, kept,
                                                             known)
        while True:
            t.check_tables(where)
            t.check_generations(where)
            try:
                got = self._timed(where, self.k.one_step, self.state, rows, key_ids, t.slot_of,
                                  t.free, t.n_handed, t.pristine, t.gen + 1, n_ubatch,
                                  decode_kind, t.key, t.gate, t.pooled, t.slot_row, t.key_gen,
                                  t.pool_gen, t.pool_of, t.w_kind, t.w_ubatch, t.w_a, t.w_b,
                                  entry_rows, rep, order, grows, entry_pool, pool_start,
                                  pooled_kind, padding_kind, start, n_bad_a, kept_a, known_a,
                                  rep_pos, rep_rows, t.kv_size, lookup_max, dirty_before, pos,
                                  keys, pools, row0, scatter)
            except TypeError:  # numba's dispatch, before the kernel ran
                return None
            if got is None or got[0] != WROTE_NOTHING or got[1] != NO_ROOM:
                break
            t.make_room(got[2])
        if got is not None and got[0] != WROTE_NOTHING:
            t.handed_out(got[2])
        return got

    def _one_sequence(self, where: str, n_pools: int, n_bad: int, kept: int, known: bool
                      ) -> tuple[np.ndarray, ...]:
        """The one sequence's counts as the kernels read them, in this door's own
        arrays (`_one`): its pool starts [0, n_pools], its kept verdicts, its kept
        pools, whether it is known equal. A negative count is PlanError."""
        if min(n_pools, n_bad, kept) < 0:
            raise PlanError(f"{where}: {n_pools} pools, {n_bad} kept verdicts and {kept} kept "
                            "pools", where, "kept pools")
        start, n_bad_a, kept_a, known_a = self._one
        start[1], n_bad_a[0], kept_a[0], known_a[0] = n_pools, n_bad, kept, known
        return self._one

    def least_pair(self, cells: np.ndarray, pos: np.ndarray) -> int:
        """The least pair of a stream's cells `cells` (their positions `pos`). The
        kernel checks each cell against the stream before it reads."""
        where = "least pair"
        _one_d(where, ("cells", cells, I64), ("positions", pos, I64))
        try:
            return self._timed(where, self.k.least_pair, cells, pos)
        except IndexError as e:
            raise PlanError(f"{where}: {e}", where, "cells") from None

    def _member_rows(self, where: str, entry_rows: np.ndarray, n: int) -> None:
        """`entry_rows`: a C-contiguous int64 array of n entries x kpool, or PlanError."""
        if type(entry_rows) is not np.ndarray or entry_rows.dtype != I64 \
                or entry_rows.shape != (n, self.kpool) or not entry_rows.flags.c_contiguous:
            raise PlanError(f"{where}: the member rows are not a C-contiguous int64 array "
                            f"of {n} x {self.kpool}", where, "member rows")

    def _entries(self, where: str, members: np.ndarray, reps: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Entries as slots: `members` [n, kpool] and `reps` [n], every one in use."""
        n_handed = self.slots.n_handed
        members = checked_index(members, 0, n_handed, (None, self.kpool), False, where,
                                "member slots", "slot")
        reps = checked_index(reps, 0, n_handed, members.shape[:1], False, where,
                             "rep slots", "slot")
        return members, reps


def _one_d(where: str, *arrays: tuple[str, np.ndarray, np.dtype], ndim: int = 1) -> None:
    """Each (name, array, dtype): a C-contiguous 1-D array of that dtype (`ndim`-D where
    said), or PlanError."""
    for name, a, dt in arrays:
        if type(a) is not np.ndarray or a.dtype != dt or a.ndim != ndim \
                or not a.flags.c_contiguous:
            raise PlanError(f"{where}: the {name} are not a C-contiguous {ndim}-D {dt} "
                            "array", where, name)
