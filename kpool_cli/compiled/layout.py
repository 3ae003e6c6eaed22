"""The compiled core's layout: engine/layout.py's `Layout` over flat columns
(`SeqColumns`: every sequence's pairs and pool columns in arenas, compiled/arena.py,
and its scalars in arrays), so that kernels read and write many sequences at once.

Owns: `CompiledLayout`, `SeqColumns` and `ArenaSeq` (a sequence's `SeqLayout` read
and written in the columns, so the reference's steps run on it unchanged).
Invariants: the columns after `update` are the reference's, pair for pair and pool
for pool, and so is the returned `LayoutChange`.

`update` runs ENGINE.md §5 for the sequences a step of parallel slots only appended
to (the cache's `take_added`: the pairs the last apply wrote past theirs, which
equalled the cache's) in one `kernels.layout_appends` call: step 1 (the append),
step 3 (the sharing scan) and step 4 (the pool scan) of every slot at once. Any
other sequence it reads (decoded alone, stale, edited, first filled) runs its steps
alone (`_update_one`): one it knows equal to the cache's that the last apply only
appended to, whose new pairs close no pool, takes them with no kernel (the same
test as `layout_appends`', and no pool to scan); a stale one under an engine
without the fork's truncate, whose pairs below its stale position are the cache's,
takes step 2's rebuild and steps 3 and 4 in one `kernels.layout_rebuild_step` call
(`_rebuild_run`); else step 2 (the rebuild, the fork's truncate) is the reference's
own `Layout.step_2`, steps 1, 3 and 4 one `kernels.layout_step` call. The
whole-layout columns are the arenas' rows joined (`kernels.joined_rows` for many),
and the members of any pools one `kernels.members` call.

`pool_members` (every pool's member rows, what a re-pool-all plan is built from) is
built again after the pools change, as the reference builds it, but the pools each
update kept (`LayoutChange.kept`: same pairs, so the same member rows) take their
rows from the columns built before (`_every_members`): under cache-safe, slot 0's
one new pool costs its own look-up and a copy, not a look-up of every pool.
"""
from __future__ import annotations

import numpy as np

from ..arrays import all_set, any_set
from ..cache.cells import CELL_BITS, NO_PAIR
from ..cache.kv import KvCache
from ..engine.layout import (
    POS_CLEAN,
    FlatColumns,
    Layout,
    LayoutChange,
    PoolGrowth,
    SeqLayout,
    all_clean,
    pools_past,
)
from . import kernels as k
from .arena import Arena, ArenaRow
from .cache import CompiledKvCache

# no stream's seq_count: no sharing scan, or a scan that can find no shared cell
# (`CompiledLayout._counts`)
_NO_COUNT = np.zeros(0, dtype=np.int32)
# Layout._column's names -> the arena (SeqColumns) that holds that column
_ARENA_OF = {"rep_rows": "rep_rows", "first_pos_": "first_pos", "rep_pos_": "rep_pos"}


class SeqColumns:
    """Every sequence's layout, flat: its five columns in arenas (compiled/arena.py)
    and its scalars in arrays, indexed by seq id. What `kernels.layout_appends`
    updates for many sequences in one call; `ArenaSeq` is one sequence's part.
    Invariant: the four pool columns have one width (`reserve` widens them
    together) and a sequence's four lengths are equal (each writer sets all four)."""

    def __init__(self, n_seq_max: int, kpool: int, kv_size: int) -> None:
        self.keys = Arena(n_seq_max, kv_size)
        n_pools = kv_size // kpool + 1
        self.pools, self.rep_rows, self.rep_pos, self.first_pos = (
            Arena(n_seq_max, n_pools) for _ in range(4))
        self.strm = np.zeros(n_seq_max, dtype=np.int64)
        self.pos_min = np.zeros(n_seq_max, dtype=np.int64)
        self.j_next = np.zeros(n_seq_max, dtype=np.int64)
        self.shared = np.zeros(n_seq_max, dtype=bool)
        self.settled = np.zeros(n_seq_max, dtype=bool)

    def scalars(self) -> tuple[np.ndarray, ...]:
        """strm, pos_min, j_next, shared, settled (ArenaSeq's `_scalar` order)."""
        return self.strm, self.pos_min, self.j_next, self.shared, self.settled

    def reserve(self, n_keys: int, kpool: int) -> None:
        """Room in every row for n_keys pairs and the pools they can hold."""
        self.keys.reserve(n_keys)
        for col in (self.pools, self.rep_rows, self.rep_pos, self.first_pos):
            col.reserve(n_keys // kpool + 1)


def _scalar(i: int, kind: type) -> property:
    """ArenaSeq's scalar `SeqColumns.scalars()[i]`, a `kind`."""
    def get(self: ArenaSeq) -> object:
        return kind(self._scalars[i][self._s])

    def put(self: ArenaSeq, value: object) -> None:
        self._scalars[i][self._s] = value

    return property(get, put)


class ArenaSeq(SeqLayout):
    """engine/layout.py's `SeqLayout` of sequence s, read and written in `SeqColumns`:
    its columns are arena rows (GrowArrays), its scalars elements of the arrays, so
    the reference layout's steps run on it unchanged."""

    __slots__ = ("_s", "_scalars")

    def __init__(self, cols: SeqColumns, s: int) -> None:  # no SeqLayout.__init__
        self._s = s
        self._scalars = cols.scalars()
        # SeqLayout's own fields, each the sequence's row of its arena
        self.keys, self.pools = ArenaRow(cols.keys, s), ArenaRow(cols.pools, s)
        self.rep_rows, self.rep_pos_ = ArenaRow(cols.rep_rows, s), ArenaRow(cols.rep_pos, s)
        self.first_pos_ = ArenaRow(cols.first_pos, s)

    strm = _scalar(0, int)
    pos_min = _scalar(1, int)
    j_next = _scalar(2, int)
    shared = _scalar(3, bool)
    settled = _scalar(4, bool)


class CompiledLayout(Layout):
    def __init__(self, n_seq_max: int, kpool: int, by_order: bool, kv_size: int,
                 n_rows: int) -> None:
        super().__init__(n_seq_max, kpool, by_order, kv_size)
        self.cols = SeqColumns(n_seq_max, kpool, kv_size)
        self.seqs = [ArenaSeq(self.cols, s) for s in range(n_seq_max)]
        self.n_rows = n_rows
        self._seen = np.zeros(0, dtype=bool)
        # per sequence: its pairs equal the cache's as of the last update (so, while
        # nothing has touched it since, it has no drift: `drift` is O(1))
        self._equal = np.ones(n_seq_max, dtype=bool)
        self._strm_set = False  # cols.strm holds the cache's streams (the first update)
        self._clean = np.ones(n_seq_max, dtype=bool)  # every sequence clean
        self._clean.flags.writeable = False
        # `_append_all`'s per-entry flags (a sequence at most once an apply)
        self._took = np.empty(n_seq_max, dtype=bool)
        self._grew = np.empty(n_seq_max, dtype=bool)
        # the pool_members built before the pools last changed, the pool_start they
        # were built with and the pools the change kept (`_every_members`); None when
        # none were built since the change before
        self._carry: tuple[np.ndarray, list[int], tuple[int, ...]] | None = None
        # what the every-pool columns as they stand were built from (`every_growth`)
        self._growth: PoolGrowth | None = None

    def scratch(self, n_pool: int) -> np.ndarray:
        """An all-False bool array for marking's first-wins test, indexed by a rep row
        (< n_rows) or a pool (< n_pool); the kernel leaves it all False."""
        need = max(self.n_rows, n_pool)
        if self._seen.size < need:
            self._seen = np.zeros(max(need, 2 * self._seen.size), dtype=bool)
        return self._seen

    def update(self, cache: KvCache, stale: list[int], track_sharing: bool,
               truncate: str | None = None) -> LayoutChange:
        """Layout.update, step for step (its docstring); see the module docstring."""
        unified = cache.config.unified
        touched = cache.take_touched()
        appended: set[int] = set()
        added = None
        if isinstance(cache, CompiledKvCache):
            appended, added = cache.take_appended(), cache.take_added()
        cols = self.cols
        sharing = track_sharing and unified
        if not self._strm_set:
            cols.strm[:] = cache.strm_of
            self._strm_set = True
        every_clean = all_clean(stale)
        kept = cols.pools.lens.copy()
        scanned = 0
        changed: set[int] = set()
        ran: set[int] = set()  # the sequences whose steps ran (`_run`, step 2)
        took: set[int] = set()
        if added is not None:
            clean = (self._clean if every_clean
                     else np.asarray(stale, dtype=np.int64) == POS_CLEAN)
            seq_count = self._counts(cache, 0) if sharing else _NO_COUNT
            took, scanned = self._append_all(added, clean, sharing, seq_count, changed)
            if sharing:  # step 3 ran
                ran |= took
        # the others it reads: all but the clean, untouched and settled (Layout.update)
        others = touched - took
        if not every_clean:
            others.update(s for s, p in enumerate(stale) if p != POS_CLEAN and s not in took)
        if not all_set(cols.settled):
            others.update(s for s in np.flatnonzero(~cols.settled).tolist() if s not in took)
        for s in sorted(others):
            scanned += self._update_one(s, cache, stale[s], touched, appended, sharing,
                                        truncate, changed, ran, kept)
        return self._end_update(kept.tolist(), took | others if others else took, changed,
                                scanned, ran)

    def _append_all(self, added: tuple[np.ndarray, np.ndarray, np.ndarray],
                    clean: np.ndarray, sharing: bool, seq_count: np.ndarray,
                    changed: set[int]) -> tuple[set[int], int]:
        """Steps 1, 3 and 4 of every sequence whose pairs the last apply only extended
        (`added`: its new pairs), when they equalled the cache's before (so the count
        check of step 2 holds), it is clean and settled, and holds pairs: one
        `kernels.layout_appends` call. They stay equal and settled. Returns the
        sequences it took, and the cells scanned."""
        seq, off, keys = added
        cols = self.cols
        m = seq.size
        took, grew = self._took[:m], self._grew[:m]
        while True:
            got, n_took, n_grew = k.layout_appends(
                seq, off, keys, clean, self._equal, cols.settled, took,
                cols.keys.buf, cols.keys.lens, cols.pools.buf, cols.pools.lens,
                cols.rep_rows.buf, cols.rep_rows.lens, cols.rep_pos.buf, cols.rep_pos.lens,
                cols.first_pos.buf, cols.first_pos.lens, cols.j_next, cols.pos_min,
                cols.strm, cols.shared, self.kpool, self.by_order, self.kv_size, seq_count,
                sharing, grew)
            if got >= 0:
                break
            cols.reserve(-got, self.kpool)
        if n_grew:
            changed.update(seq[grew].tolist())
        return set((seq if n_took == m else seq[took]).tolist()), int(got)

    def _update_one(self, s: int, cache: KvCache, stale: int, touched: set[int],
                    appended: set[int], sharing: bool, truncate: str | None,
                    changed: set[int], ran: set[int], kept: np.ndarray) -> int:
        """Layout.update's steps for sequence s, which it reads; returns the cells
        scanned, sets kept[s]."""
        sq, cols = self.seqs[s], self.cols
        clean = stale == POS_CLEAN
        sp = cache.seq_indices[s].view  # cache.seq_keys(s)
        n = int(cols.keys.lens[s])
        settled, pos_min = bool(cols.settled[s]), int(cols.pos_min[s])
        if (clean and s in appended and self._equal[s] and settled and n
                and sp.size - self.kpool < cols.j_next[s] and (cols.shared[s] or not sharing)):
            # the last apply only wrote past s's pairs, which equalled the cache's:
            # step 1 appends sp[n:], step 3 has nothing to scan, and the pairs close
            # no pool past j_next (step 4); s stays equal and settled
            sq.keys.extend(sp[n:])
            return int(sp.size - n)
        scanned = 0
        ran.add(s)
        n_before = int(cols.pools.lens[s])
        append = bool(clean and n and sp.size and pos_min == int(sp[0] >> CELL_BITS))
        n_pools = n_before
        n_kept = 0
        rebuilt = False
        ran_all = None  # step 2's rebuild, then steps 3 and 4, in one call: what it kept
        if not append:
            # the pairs equalled the cache's at the last update that read them: below
            # the least pair changed since, they still do (`Stream.changed_from`)
            known = cache.changed_from.get(s, NO_PAIR) if self._equal[s] else -1
            if truncate is None and not clean:
                ran_all = self._rebuild_run(s, sp, stale, known, cache, sharing)
            if ran_all is None:
                n_pools, n_kept, copied, rebuilt = self.step_2(cache, sq, sp, stale, truncate,
                                                               n_pools, 0, known)
                scanned += copied
        if ran_all is not None:
            n_pools, got = ran_all
            rebuilt = True
            scanned += int(sp.size)  # step 2's copy of sp
        else:
            got = self._run(s, sp, append, n_kept, cache, sharing)
        if got < 0:  # the appended count is off: step 2 rebuilds, then on
            # the kernel counted the pairs the append copies but kept none of them:
            # step 2's count check must fail, as the reference's does on them
            cols.keys.lens[s] = 0
            n_pools, n_kept, copied, rebuilt = self.step_2(cache, sq, sp, stale, truncate,
                                                           n_pools, 0)
            scanned += -got - 1 + copied
            got = self._run(s, sp, False, n_kept, cache, sharing)
        scanned += got
        n_keys = int(cols.keys.lens[s])
        # a rebuild copies sp; an append to pairs that were equal, when the cells
        # changed only past them, copies exactly what was added; else compare
        self._equal[s] = (rebuilt or (append and self._equal[s]
                                      and (s in appended or s not in touched))
                          or int(k.first_difference(cols.keys.buf[s, :n_keys], sp)) < 0)
        kept[s] = n_pools
        if n_pools < n_before or n_pools < cols.pools.lens[s]:
            changed.add(s)
        cols.settled[s] = (n_keys == sp.size
                           and (n_keys == 0 or int(cols.pos_min[s]) == int(sp[0] >> CELL_BITS)))
        return scanned

    def _end_update(self, kept: list[int], read: set[int], changed: set[int], scanned: int,
                    reshared: set[int] | None = None) -> LayoutChange:
        """Layout._end_update, after noting what `_every_members` carries over. The
        appends of the fast path change no `shared` flag: only the sequences whose
        steps ran are `reshared`."""
        if changed:
            every, start = self._every, self._pool_start
            self._carry = (None if every is None or start is None
                           else (every[2], start.tolist(), tuple(kept)))
            self._growth = None
        return super()._end_update(kept, read, changed, scanned, reshared)

    def every_growth(self) -> PoolGrowth | None:
        """Layout.every_growth: what `_every_members` carried the kept pools' rows from,
        while the columns it built stand."""
        return self._growth if self._every is not None else None

    def flat_columns(self) -> FlatColumns:
        """Layout.flat_columns: the arenas themselves (and the scalars' arrays)."""
        cols = self.cols
        return FlatColumns(cols.keys.buf, cols.keys.lens, cols.pools.buf, cols.rep_rows.buf,
                           cols.strm)

    def pool_counts(self) -> np.ndarray:
        """Layout.pool_counts: the pools arena's row lengths themselves."""
        return self.cols.pools.lens

    def _any_shared(self) -> bool:
        """Layout._any_shared: the flags' array."""
        return any_set(self.cols.shared)

    def _every_members(self, every: np.ndarray) -> np.ndarray:
        """Layout._every_members: the kept pools' rows copied from the members built
        before the change (`kernels.carried_rows`, every sequence in one call: W2's 64
        slices cost more than the rows), the other pools' looked up."""
        carry, self._carry = self._carry, None
        self._growth = None
        if carry is None:
            return super()._every_members(every)
        old, before_l, kept_l = carry
        start = self.pool_start()
        before, kept = np.array(before_l, dtype=np.int64), np.array(kept_l, dtype=np.int64)
        # the kernel reads and writes what these bound: the old rows, each sequence's
        # kept pools within its pools then and now
        assert old.shape == (before_l[-1], self.kpool) and int(start[-1]) == every.size
        assert kept.size == before.size - 1 == start.size - 1 and all_set(
            kept <= np.minimum(np.diff(before), np.diff(start)))
        self._growth = PoolGrowth(old, before, kept, start)
        members = np.empty((every.size, self.kpool), dtype=np.int64)
        k.carried_rows(old.reshape(-1), before, kept, start, self.kpool, members.reshape(-1))
        fresh = pools_past(start, kept)
        if fresh.size:
            members[fresh] = self._look_up_members(fresh)
        return members

    def _every_k(self, every: np.ndarray) -> np.ndarray:
        """Layout._every_k, with `pool_seq` (when not built) in the same pass
        (`kernels.seq_and_k`)."""
        start = self.pool_start()
        assert int(start[-1]) == every.size  # the kernel writes start[-1] items of each
        seq, kk = np.empty(every.size, dtype=np.int64), np.empty(every.size, dtype=np.int64)
        k.seq_and_k(start, seq, kk)
        if self._pool_seq is None:
            self._pool_seq = seq
        return kk

    def _counts(self, cache: KvCache, strm: int) -> np.ndarray:
        """What the sharing scan (ENGINE.md §5 step 3, `kernels._share_scan`) reads of
        stream strm: each cell's count of sequences; none (`_NO_COUNT`) where the cache
        holds one sequence at most (n_seq_max 1: W1's, W3's), whose cells no second
        sequence can hold, so the scan finds none and its count of cells scanned is
        all it gives (a stale sequence's rebuild scans every cell from the first)."""
        return _NO_COUNT if cache.config.n_seq_max == 1 else cache.streams[strm].seq_count

    def _run(self, s: int, sp: np.ndarray, append: bool, n_kept: int, cache: KvCache,
             sharing: bool) -> int:
        """One `kernels.layout_step` call on sequence s's columns; returns the cells it
        scanned, or -(scanned + 1) when the append left the count off (a rebuild is
        due and nothing past the append ran)."""
        cols, kpool = self.cols, self.kpool
        keys = cols.keys
        n = int(keys.lens[s])
        # room for the pairs the append keeps (sp's, when its count holds: the kernel
        # copies nothing when it does not) and the pools they can hold (pools never
        # overlap): no row past a sequence's pairs (arena.py's bound)
        cols.reserve(max(n, sp.size) if append else n, kpool)
        n_pools0 = int(cols.pools.lens[s])
        strm = int(cols.strm[s])
        n_keys, _kept, j_next, n_pools, shared, scanned, rebuild = k.layout_step(
            sp, keys.buf[s], n, append, n_kept, int(cols.j_next[s]), int(cols.pos_min[s]),
            kpool, self.by_order, strm, self.kv_size, cols.pools.buf[s],
            cols.rep_rows.buf[s], cols.rep_pos.buf[s], cols.first_pos.buf[s], n_pools0,
            self._counts(cache, strm), sharing, bool(cols.shared[s]))
        keys.lens[s] = n_keys
        if rebuild:
            return -(scanned + 1)
        self._ran(s, n_pools, j_next, shared)
        return int(scanned)

    def _ran(self, s: int, n_pools: int, j_next: int, shared: bool) -> None:
        """What a step kernel left of sequence s's pools: the four pool columns'
        length, j_next and the sharing flag."""
        cols = self.cols
        for col in (cols.pools, cols.rep_rows, cols.rep_pos, cols.first_pos):
            col.lens[s] = n_pools
        cols.j_next[s], cols.shared[s] = j_next, shared

    def _rebuild_run(self, s: int, sp: np.ndarray, stale: int, known_below: int,
                     cache: KvCache, sharing: bool) -> tuple[int, int] | None:
        """Layout.step_2 of a stale sequence under an engine without the fork's
        truncate, whose pairs below the stale position are its cache's: the rebuild
        that keeps the pools below it (`Layout._rebuild`), then steps 3 and 4, in one
        `kernels.layout_rebuild_step` call. Returns (the pools the rebuild kept, the
        cells steps 3 and 4 scanned), or None, nothing changed, where the full rebuild
        is due (`step_2` then runs it)."""
        cols, kpool = self.cols, self.kpool
        cols.reserve(int(sp.size), kpool)
        keys = cols.keys
        strm = int(cols.strm[s])
        n_keys, j_next, kept, n_pools, shared, scanned, done = k.layout_rebuild_step(
            sp, keys.buf[s], int(keys.lens[s]), min(stale, POS_CLEAN) << CELL_BITS,
            known_below, int(cols.pos_min[s]), kpool, self.by_order, strm, self.kv_size,
            cols.pools.buf[s], cols.rep_rows.buf[s], cols.rep_pos.buf[s],
            cols.first_pos.buf[s], int(cols.pools.lens[s]), self._counts(cache, strm),
            sharing)
        if not done:
            return None
        keys.lens[s] = n_keys
        self._ran(s, n_pools, j_next, shared)
        return int(kept), int(scanned)

    def _look_up_members(self, ips: np.ndarray) -> np.ndarray:
        """Layout._look_up_members: every pool's in one `kernels.members` call over
        the flat columns."""
        out = np.empty((ips.size, self.kpool), dtype=np.int64)
        cols = self.cols
        k.members(cols.keys.buf, cols.pools.buf, self.pool_start(), cols.strm,
                  np.ascontiguousarray(ips, dtype=np.int64), self.kpool, self.kv_size, out)
        return out

    def _column(self, name: str, view: bool = False) -> np.ndarray:
        """Layout._column: the arena's rows joined, a few that hold pools as copies
        (one sequence: one copy, or its row itself with `view`), more in one
        `kernels.joined_rows` call (W2's 64: the copies' own calls would cost more
        than the kernel's loop)."""
        arena = getattr(self.cols, _ARENA_OF[name])
        lens = arena.lens
        held = lens.nonzero()[0]  # lens is flat: flatnonzero's ravel is a call more
        if held.size <= 8:
            parts = [arena.buf[s, :lens[s]] for s in held.tolist()]
            return ((parts[0] if view else parts[0].copy()) if len(parts) == 1
                    else np.concatenate(parts) if parts else np.empty(0, dtype=np.int64))
        out = np.empty(int(lens.sum()), dtype=np.int64)
        k.joined_rows(arena.buf, lens, out)
        return out

    def columns(self, ips: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Layout.columns: a few pools' positions read in the arenas, at (seq, k), not in
        the whole-layout columns (a decode's listing: no copy of every pool's)."""
        if self.is_every_pool(ips) or not self._few(ips):
            return super().columns(ips)
        seq, k = self.locate(ips)
        return seq, k, self.cols.first_pos.buf[seq, k], self.cols.rep_pos.buf[seq, k]

    def known_equal(self, cache: KvCache, s: int) -> bool:
        """The update found s's pairs equal to the cache's, and nothing touched s since."""
        return bool(self._equal[s]) and s not in cache.stream(s).touched

    def known_equal_seqs(self, cache: KvCache) -> np.ndarray:
        """`known_equal` of every sequence: a stream's `touched` holds its own."""
        eq = np.array(self._equal, dtype=bool)
        for st in cache.streams:
            if st.touched:
                eq[list(st.touched)] = False
        return eq

    def drift(self, cache: KvCache, s: int) -> tuple[int, tuple[int, int] | None,
                                                     tuple[int, int] | None] | None:
        """Layout.drift: none while the pairs are known equal to the cache's (the
        update's flag, and nothing touched s since); else `kernels.first_difference`."""
        if self.known_equal(cache, s):
            return None
        have = self.seqs[s].keys.view
        want = cache.seq_keys(s)
        j = int(k.first_difference(have, want))
        if j < 0:
            return None
        return super().drift(cache, s)
