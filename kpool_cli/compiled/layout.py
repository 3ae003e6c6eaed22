"""The compiled core's layout: engine/layout.py's `Layout`, whose update runs step 1
(the append), step 3 (the sharing scan) and step 4 (the pool scan) of ENGINE.md §5
for a sequence in one kernel call (`kernels.layout_step`), over the same columns.

Owns: `CompiledLayout`. Step 2 (the rebuild, the fork's truncate) is the
reference's own `Layout.step_2`: it runs when a sequence is stale or its count is
off, rare next to the decodes. Invariants: the columns after `update` are the reference's,
pair for pair and pool for pool, and so is the returned `LayoutChange`.

`pool_members` (every pool's member rows, what a re-pool-all plan is built from) is
built again after the pools change, as the reference builds it, but the pools each
update kept (`LayoutChange.kept`: same pairs, so the same member rows) take their
rows from the columns built before (`_every_members`): under cache-safe, slot 0's
one new pool costs its own look-up and a copy, not a look-up of every pool.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..cache.cells import CELL_BITS
from ..cache.kv import KvCache
from ..engine.layout import POS_CLEAN, Layout, LayoutChange, SeqLayout
from . import KEPT_MEMBER_ROWS
from . import kernels as k
from .cache import CompiledKvCache


class CompiledLayout(Layout):
    def __init__(self, n_seq_max: int, kpool: int, by_order: bool, kv_size: int,
                 n_rows: int) -> None:
        super().__init__(n_seq_max, kpool, by_order, kv_size)
        self.n_rows = n_rows
        self._seen = np.zeros(0, dtype=bool)
        # per sequence: its pairs equal the cache's as of the last update (so, while
        # nothing has touched it since, it has no drift: `drift` is O(1))
        self._equal = [True] * n_seq_max
        # the pool_members built before the pools last changed, the pool_start they
        # were built with and the pools the change kept (`_every_members`); None when
        # none were built since the change before
        self._carry: tuple[np.ndarray, list[int], tuple[int, ...]] | None = None
        # the last few pools' members looked up, while the pools stand (`_end_update`
        # drops them): a step's plan and its verification ask for the same new pools
        self._looked_up: tuple[np.ndarray, np.ndarray] | None = None

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
        appended = cache.take_appended() if isinstance(cache, CompiledKvCache) else set()
        scanned = 0
        kept: list[int] = []
        read: set[int] = set()
        ran: set[int] = set()  # the sequences whose steps ran (`_run`, step 2)
        changed: set[int] = set()
        sharing = track_sharing and unified
        equal, kpool = self._equal, self.kpool
        indices, strm_of = cache.seq_indices, cache.strm_of
        for s, sq in enumerate(self.seqs):
            clean = stale[s] == POS_CLEAN
            if clean and s not in touched and sq.settled:
                kept.append(len(sq.pools))
                continue
            read.add(s)
            sp = indices[s].view  # cache.seq_keys(s)
            sq.strm = strm_of[s]
            keys = sq.keys
            n = len(keys)
            if (clean and s in appended and equal[s] and sq.settled and n
                    and sp.size - kpool < sq.j_next and (sq.shared or not sharing)):
                # the last apply only wrote past s's pairs, which equalled the cache's:
                # step 1 appends sp[n:], step 3 has nothing to scan, and the pairs
                # close no pool past j_next (step 4); s stays equal and settled
                if sp.size == n + 1:  # a decode step's one token
                    keys.append(int(sp[n]))
                else:
                    keys.extend(sp[n:])
                scanned += sp.size - n
                kept.append(len(sq.pools))
                continue
            ran.add(s)
            n_before = len(sq.pools)
            append = bool(clean and n and sp.size and sq.pos_min == int(sp[0] >> CELL_BITS))
            n_pools = n_before
            n_kept = 0
            rebuilt = False
            if not append:
                n_pools, n_kept, copied, rebuilt = self.step_2(cache, sq, sp, stale[s],
                                                               truncate, n_pools, 0)
                scanned += copied
            got = self._run(sq, sp, append, n_kept, cache, sharing)
            if got < 0:  # the appended count is off: step 2 rebuilds, then on
                n_pools, n_kept, copied, rebuilt = self.step_2(cache, sq, sp, stale[s],
                                                               truncate, n_pools, 0)
                scanned += -got - 1 + copied
                got = self._run(sq, sp, False, n_kept, cache, sharing)
            scanned += got
            # a rebuild copies sp; an append to pairs that were equal, when the cells
            # changed only past them, copies exactly what was added; else compare
            self._equal[s] = (rebuilt or (append and self._equal[s]
                                          and (s in appended or s not in touched))
                              or int(k.first_difference(sq.keys.view, sp)) < 0)
            kept.append(n_pools)
            if n_pools < n_before or n_pools < len(sq.pools):
                changed.add(s)
            n_keys = len(sq.keys)
            sq.settled = (n_keys == sp.size
                          and (n_keys == 0 or sq.pos_min == int(sp[0] >> CELL_BITS)))
        return self._end_update(kept, read, changed, scanned, ran)

    def _end_update(self, kept: list[int], read: set[int], changed: set[int], scanned: int,
                    reshared: set[int] | None = None) -> LayoutChange:
        """Layout._end_update, after noting what `_every_members` carries over. The
        appends of the fast path change no `shared` flag: only the sequences whose
        steps ran are `reshared`."""
        if changed:
            self._looked_up = None
            every, start = self._every, self._pool_start
            self._carry = (None if every is None or start is None
                           else (every[2], start.tolist(), tuple(kept)))
        return super()._end_update(kept, read, changed, scanned, reshared)

    def _every_members(self, every: np.ndarray) -> np.ndarray:
        """Layout._every_members: the kept pools' rows copied from the members built
        before the change, a sequence at a time, the other pools' looked up."""
        carry, self._carry = self._carry, None
        if carry is None:
            return super()._every_members(every)
        old, before, kept = carry
        start = self.pool_start().tolist()
        members = np.empty((every.size, self.kpool), dtype=np.int64)
        fresh = []
        for s, n_kept in enumerate(kept):
            a, b = start[s], start[s + 1]
            if n_kept:
                members[a:a + n_kept] = old[before[s]:before[s] + n_kept]
            if a + n_kept < b:
                fresh.append(every[a + n_kept:b])
        if fresh:
            ips = np.concatenate(fresh)
            members[ips] = self._look_up_members(ips)
        return members

    def _run(self, sq: SeqLayout, sp: np.ndarray, append: bool, n_kept: int,
             cache: KvCache, sharing: bool) -> int:
        """One `kernels.layout_step` call on sq's columns; returns the cells it
        scanned, or -(scanned + 1) when the append left the count off (a rebuild is
        due and nothing past the append ran)."""
        kpool = self.kpool
        keys = sq.keys
        n = len(keys)
        # room for the append (exactly, as GrowArray.extend grows), and for the pools
        # those pairs can hold (pools never overlap)
        n_cap = n + sp.size if append else n
        if n_cap > keys.capacity:
            last = keys.last()
            # sp is strictly increasing: when it holds the last pair at the same index
            # (a decode appended past it: the common case), sp[n:] is what is new
            n_cap -= (n if n <= sp.size and sp[n - 1] == last
                      else int(np.searchsorted(sp, last, side="right")))
        p_cap = n_cap // kpool + 1
        pools, rep_rows, rep_pos, first_pos = sq.pools, sq.rep_rows, sq.rep_pos_, sq.first_pos_
        n_pools0 = len(pools)
        n_keys, _kept, j_next, n_pools, shared, scanned, rebuild = k.layout_step(
            sp, keys.spare(n_cap), n, append, n_kept, sq.j_next, sq.pos_min, kpool,
            self.by_order, sq.strm, self.kv_size, pools.spare(p_cap), rep_rows.spare(p_cap),
            rep_pos.spare(p_cap), first_pos.spare(p_cap), n_pools0,
            cache.streams[sq.strm].seq_count, sharing, sq.shared)
        keys.set_len(n_keys)
        if rebuild:
            return -(scanned + 1)
        if n_pools != n_pools0:
            pools.set_len(n_pools)
            rep_rows.set_len(n_pools)
            rep_pos.set_len(n_pools)
            first_pos.set_len(n_pools)
        sq.j_next, sq.shared = j_next, shared
        return int(scanned)

    def _runs(self, ips: np.ndarray) -> list[tuple[int, int, int]] | None:
        """(seq, a, b): ips[a:b] are sequence seq's pools, for ips in layout order
        (ascending); None when ips are not."""
        if ips.size > 1 and bool((ips[1:] < ips[:-1]).any()):
            return None
        cut = np.searchsorted(ips, self.pool_start()).tolist()
        return [(s, a, b) for s, (a, b) in enumerate(itertools.pairwise(cut)) if a < b]

    def _look_up_members(self, ips: np.ndarray) -> np.ndarray:
        """Layout._look_up_members, a sequence's pools at a time through
        `kernels.members`; the last look-up of up to `KEPT_MEMBER_ROWS` member rows
        again (a copy) for the same pools while they stand (W2's closing step: the plan's
        and the verification's 64 new pools, 64 kernel calls each)."""
        last = self._looked_up
        if last is not None and last[0].size == ips.size and np.array_equal(last[0], ips):
            return last[1].copy()
        runs = self._runs(ips)
        if runs is None:
            return super()._look_up_members(ips)
        out = np.empty((ips.size, self.kpool), dtype=np.int64)
        start = self.pool_start().tolist()
        seqs, kpool, kv_size = self.seqs, self.kpool, self.kv_size
        for s, a, b in runs:
            sq = seqs[s]
            k.members(sq.keys.view, sq.pools.view, ips, a, b, start[s], kpool, sq.strm,
                      kv_size, out)
        if len(runs) > 1 and out.size <= KEPT_MEMBER_ROWS:
            self._looked_up = (ips.copy(), out.copy())
        return out

    def known_equal(self, cache: KvCache, s: int) -> bool:
        """The update found s's pairs equal to the cache's, and nothing touched s since."""
        return self._equal[s] and s not in cache.stream(s).touched

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
