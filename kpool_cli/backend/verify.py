"""The bad pools of every sequence, rechecked only where something changed.

Owns: the bad pools of every sequence (`bad_of(s)`, bool [n_pools of s]; `bad_seqs`,
the sequences with one; `n_checked`, how many pools of each have a verdict), what
changed since they were last checked (`touch`: per-row masks of the rows whose
key/gate changed and of the rows whose pooled slot changed, 2 bytes a row next to the
cache's ~37, and the rows set in them; or everything, after a clear), the incremental
verification (`verify`: the sequences whose bad pools may have changed, found for all
at once; of those, the new or regrouped pools, and those whose member keys or rep row
changed, found by looking the changed cells up where the layout knows a sequence's
pairs equal the cache's, else by a pass over its pools; a layout of one sequence whose
only pools to recheck are new ones, or none, in one kernel call: `_one_sequence`; a
layout of many sequences on one stream whose every sequence is so, a step of
parallel slots that closes pools, in one kernel call too: `_many_sequences`) and the
full check of given pools (`differ`, the oracle the tests hold `verify` to).
`pools_checked` counts the pools rechecked.

Invariants:
- after `verify` (the value backend runs it every ubatch), `bad_of(s)[k]` is True
  exactly when the rep row of pool k of s differs from the pooling of the pool's
  current members with their current keys and gates, or is in `alt` (a race of
  different values: `writers.py`); tests/test_backend_incremental.py recomputes that
  from scratch (`differ` over every pool) and holds the two equal; `bad_seqs` is
  the sequences s with `bad_of(s).any()`;
- a sequence's verdicts are held (`_bad[s]`, `n_checked[s]` of them) only while it
  has a bad pool: every verdict of a sequence outside `bad_seqs` is False, and its
  held array may be short or stale. So a step whose every slot adds a pool and
  none is bad (W2's closing step) keeps 64 counts, not 64 arrays, and its one-call
  verification (`_many_sequences`) touches no sequence's array;
- the one-call verifications answer exactly what the general way (`_sequences`,
  `_recheck`) would set, or hand back having set nothing: the same rule (recheck.py),
  the same pools checked by the same test (`rows_differ`); tests hold the two equal
  on random traces (test_backend_incremental.py);
- every write of a key, gate or pooled row between two checks is `touch`ed (or
  `all_changed`): a pool none of whose rows changed keeps its verdict;
- a mask is True only at rows of its dirty-row list, so `verify` resets it at
  those rows alone (O(rows changed), not O(n_rows)): all False after `verify`.

Memory: `bytes_held` (the masks), `bytes_bound` (the masks, a ubatch's dirty rows
and the pairs a verification looks up).
"""

from __future__ import annotations

import numpy as np

from ..arrays import any_set, ranges, union, unique
from ..cache.cells import Stream, global_row, make_keys
from ..cache.kv import KvCache, Reach
from ..engine.layout import Layout, LayoutChange
from ..trace.model import CacheConfig
from .guarded import GuardedKernels
from .guards import checked_rows
from .recheck import LOOK, NEW, NO_PAIR, NO_TAIL, NONE, SCAN
from .slots import SlotTable
from .writers import Writers


class Verifier:
    """Dirty tracking and the incremental verification of bad pools."""

    # bytes per global row: the two dirty masks
    ROW_BYTES = 2

    def __init__(self, config: CacheConfig, slots: SlotTable, kernels: GuardedKernels,
                 writers: Writers) -> None:
        self.slots, self.kernels, self.writers = slots, kernels, writers
        self.kpool, self.kv_size, self.n_rows = config.kpool, config.kv_size, config.n_rows
        # per sequence: its verdicts while it is in `bad_seqs` (module docstring), and
        # how many of its pools have one
        self._bad = [np.zeros(0, dtype=bool) for _ in range(config.n_seq_max)]
        self.n_checked = np.zeros(config.n_seq_max, dtype=np.int64)
        # what changed since the last check: rows whose key/gate changed, rows whose
        # pooled slot changed (masks and the rows set in them), or everything
        self._kdirty = np.zeros(self.n_rows, dtype=bool)
        self._pdirty = np.zeros(self.n_rows, dtype=bool)
        self._kdirty_rows: list[np.ndarray] = []
        self._pdirty_rows: list[np.ndarray] = []
        self._all_dirty = False
        # what was touched since the last scatter (`scattered`), for the standing plan
        self._since_scatter: list[np.ndarray] = []
        self._all_since_scatter = False
        self.pools_checked = 0
        self.bad_seqs: set[int] = set()  # the sequences with a bad pool
        # `Stream.seq_ids` of the stream last verified in one call, and it as an array
        self._ids: tuple[list[int], np.ndarray] | None = None

    def bad_of(self, s: int) -> np.ndarray:
        """[n_checked[s]] bool: which pools of sequence s are bad (all False outside
        `bad_seqs`)."""
        if s in self.bad_seqs:
            return self._bad[s]
        return np.zeros(int(self.n_checked[s]), dtype=bool)

    @property
    def bad(self) -> list[np.ndarray]:
        """`bad_of` of every sequence."""
        return [self.bad_of(s) for s in range(self.n_checked.size)]

    # -- memory --------------------------------------------------------------------------

    @classmethod
    def bytes_bound(cls, config: CacheConfig, reach: Reach) -> int:
        """Bytes the masks hold (per global row), a ubatch's dirty rows, and the pairs
        a verification looks up (at most `LOOKUP_MAX_ROWS` rows in both lists, each
        held by up to every sequence)."""
        return (config.n_rows * cls.ROW_BYTES + 8 * 8 * reach.decode_tokens
                + 8 * LOOKUP_MAX_ROWS * config.n_seq_max)

    def bytes_held(self) -> int:
        """Bytes of the masks (the dirty-row lists of one ubatch not counted)."""
        return self._kdirty.nbytes + self._pdirty.nbytes

    # -- change tracking -------------------------------------------------------------------

    def touch(self, rows: np.ndarray, key: bool, pooled: bool) -> None:
        """`rows` got new keys and gates (`key`), new pooled rows (`pooled`)."""
        if key:
            self._kdirty[rows] = True
            self._kdirty_rows.append(rows)
        if pooled:
            self._pdirty[rows] = True
            self._pdirty_rows.append(rows)
        self._since_scatter.append(rows)

    def all_changed(self) -> None:
        """Every row changed (a clear): the next `verify` rechecks every pool."""
        self._all_dirty = self._all_since_scatter = True

    def scattered(self) -> None:
        """A scatter ended (what it wrote, it touched first): `touched` starts again."""
        self._since_scatter.clear()
        self._all_since_scatter = False

    def touched(self) -> np.ndarray | None:
        """The rows touched since the last scatter (`scattered`; some maybe twice),
        whenever `verify` ran; None when every row changed. O(rows touched)."""
        if self._all_since_scatter:
            return None
        rows = self._since_scatter
        return np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)

    def touched_with(self, rows: np.ndarray) -> np.ndarray | None:
        """`touched` as it will be once `rows` are touched too (a write not yet made)."""
        got = self.touched()
        return None if got is None else np.concatenate((got, rows))

    # -- verification (only what changed) -----------------------------------------------------

    def differ(self, members: np.ndarray, reps: np.ndarray) -> np.ndarray:
        """[n] bool: rep row differs from the pooling, or raced with different values
        (then one of them differs from any pooling). A rep row whose slot holds the
        pooling of the members' slots, none written since, is judged by those
        generations (`kernels.pools_differ`). The rows are read through the slot map
        in the same kernel pass (`rows_differ`); rows it does not take (another dtype,
        a row or slot outside its array) are checked and looked up here, which says
        what is wrong with them."""
        bad = self.kernels.rows_differ(members, reps)
        if bad is None:
            members = checked_rows(members, self.n_rows, (None, self.kpool), False, "check",
                                   "member rows")
            reps = checked_rows(reps, self.n_rows, members.shape[:1], False, "check",
                                "rep rows")
            bad = self.kernels.pools_differ(self.slots.of(members), self.slots.of(reps))
        if self.writers.alt:
            bad |= self.writers.raced(reps)
        return bad

    def _sequences(self, layout: Layout, change: LayoutChange, cache: KvCache,
                   dirty: _DirtyPairs) -> tuple[np.ndarray, np.ndarray]:
        """(seqs, how): the sequences whose bad pools may have changed (ascending) and
        how each finds its pools to recheck, decided for all at once: `NEW`, the
        pools the update cut, regrouped or added alone; `LOOK`, those and the pools
        holding a changed pair, looked up by their pairs (`pools_of_pairs`), where the
        layout knows s's pairs equal the cache's (`Layout.known_equal`) and a changed
        pair lies at or before the last pair of the pools the update kept (past them,
        a pair is in a new pool or in none: the tail a decode just appended, most
        ubatches' only change); `SCAN`, those and the pools a pass over s's pools
        finds changed (`_scanned`), elsewhere while a row changed. A sequence left out
        has no pool to recheck."""
        n = len(layout.seqs)
        kept = np.asarray(change.kept, dtype=np.int64)
        changed = bool(self._kdirty_rows or self._pdirty_rows)
        known, rep_pos, rep_rows = _tails(layout, cache, changed)
        how, tail, before = self.kernels.recheck_ways(
            layout.pool_start(), self.n_checked, kept, known, rep_pos, rep_rows, changed,
            dirty.too_many, *dirty.least_parts())
        if before:
            # a changed pair may lie at or before a kept tail: whose, by sequence
            how[(tail != NO_TAIL) & (dirty.lowest(n) <= tail)] = LOOK
        seqs = (how != NONE).nonzero()[0]
        return seqs, how[seqs]

    def _candidates(self, layout: Layout, change: LayoutChange, s: int, how: int,
                    dirty: _DirtyPairs) -> np.ndarray:
        """Pools of s to recheck (ascending, distinct), found as `how` (`_sequences`)
        says.

        Looked up, the pools whose member key or rep row changed are found from the
        changed rows alone: each changed cell s holds is the pair (its pos, the cell)
        among s's, found by binary search (`pools_of_pairs`): O(rows changed),
        whatever the context. Scanned, by a pass over s's pooled pairs and rep rows
        (`dirty_pools`, `_rep_dirty`)."""
        sq = layout.seqs[s]
        n_p = len(sq.pools)
        parts = []
        if change.kept[s] < n_p:
            parts.append(change.new_pools(s, n_p))
        found = None
        if how == LOOK:
            pairs = dirty.of(s)
            if pairs is not None:
                found = self.kernels.pools_of_pairs(sq.keys.view, sq.pools.view, *pairs)
            if found is None:  # a pair not found: scan
                how = SCAN
        if how == SCAN:
            found = self._scanned(layout, s, dirty)
        if found is not None and found.size:
            parts.append(found)
        return union(parts)

    def _scanned(self, layout: Layout, s: int, dirty: _DirtyPairs) -> np.ndarray:
        """s's pools with a changed member key (a pass over its pooled pairs) or a
        changed rep row (`_rep_dirty`, one pass over every pool's rep row)."""
        sq = layout.seqs[s]
        found = []
        if self._kdirty_rows:
            first = global_row(sq.strm, 0, self.kv_size)
            found.append(self.kernels.dirty_pools(sq.keys.view, sq.pools.view,
                                                  self._kdirty[first:first + self.kv_size]))
        if dirty.rep_scan is None:
            dirty.rep_scan = self._rep_dirty(layout)
        rep = dirty.rep_scan[s]
        if rep is not None:
            found.append(rep)
        return union(found)

    def _rep_dirty(self, layout: Layout) -> list[np.ndarray | None]:
        """Per sequence, its pools whose rep row's pooled slot changed (one look-up over
        every pool's rep row, `pool_cells`), or None where none did."""
        out: list[np.ndarray | None] = [None] * len(layout.seqs)
        if not self._pdirty_rows:
            return out
        hit = np.flatnonzero(self._pdirty[layout.pool_cells()])
        if hit.size:
            start = layout.pool_start()
            cut = hit.searchsorted(start).tolist()
            for s in range(len(layout.seqs)):
                if cut[s] < cut[s + 1]:
                    out[s] = hit[cut[s]:cut[s + 1]] - start[s]
        return out

    def verify(self, layout: Layout, change: LayoutChange, cache: KvCache,
               one_tried: bool = False) -> None:
        """Recheck the pools whose verdict may have changed since the last ubatch: the
        new or regrouped ones, and those whose member keys or rep row changed. `cache`:
        the cache the layout was updated from (as it is now).

        A sequence whose only pools to recheck are those past the ones the update kept
        (`NEW`, or every sequence after a clear: a step of parallel slots closes a
        pool in each of its 64) is handled with the others of its kind at once: its
        candidates are a range, and its verdict is the kept part's with the range's
        appended. The others (`LOOK`, `SCAN`) find their candidates one by one. A
        layout of one sequence whose way is `NONE` or `NEW` (a decode that appends:
        every step of one slot) takes the way and the verdicts in one kernel call
        (`_one_sequence`), unless `one_tried` says that call handed back already
        (`ValueBackend`'s one pass, `GuardedKernels.one_step`); a layout of many
        sequences on one stream whose update changed pools and whose every way is so
        (a step of parallel slots that closes pools) takes every way and verdict in
        one kernel call too (`_many_sequences`)."""
        if (one_tried or not self._one_sequence(layout, change, cache)) \
                and not self._many_sequences(layout, change, cache):
            dirty = _DirtyPairs(cache, self.kernels, self._kdirty_rows, self._pdirty_rows)
            n_seq = len(layout.seqs)
            if self._all_dirty:
                seqs = np.arange(n_seq, dtype=np.int64)
                how = np.full(n_seq, NEW, dtype=np.int64)
            else:
                seqs, how = self._sequences(layout, change, cache, dirty)
            if seqs.size:
                self._recheck(layout, change, dirty, seqs, how)
        self._settle()

    def _settle(self) -> None:
        """What changed is verified: the dirty masks and lists start again."""
        for rows in self._kdirty_rows:
            self._kdirty[rows] = False
        for rows in self._pdirty_rows:
            self._pdirty[rows] = False
        self._kdirty_rows.clear()
        self._pdirty_rows.clear()
        self._all_dirty = False

    def one_open(self, layout: Layout, cache: KvCache) -> bool:
        """The one-call verification may answer (`_one_sequence`): a layout and a cache
        of one sequence and one stream, no clear since the last verification, no
        race remembered."""
        return (not self._all_dirty and len(layout.seqs) == 1 and len(cache.streams) == 1
                and not self.writers.alt)

    def one_args(self, layout: Layout, change: LayoutChange, cache: KvCache, dirty: bool
                 ) -> tuple:
        """What the one-call verification of a layout of one sequence reads (`one_open`),
        `GuardedKernels.recheck_one`'s arguments but `dirty` and `too_many`, in its
        order: its pools, its verdicts kept, the pools the update kept, whether its
        pairs are known equal to the cache's (asked only when a row changed:
        `dirty`), its rep columns, the one stream's cells changed so far, that
        stream's positions, its pairs, its pools' first pairs, its first row."""
        rows = self._kdirty_rows + self._pdirty_rows  # its one stream's changed cells
        cells = rows[0] if len(rows) == 1 else np.concatenate(rows) if rows else _NO_PAIRS
        sq = layout.seqs[0]
        return (len(sq.pools), int(self.n_checked[0]), change.kept[0],
                dirty and layout.known_equal(cache, 0), sq.rep_pos(), sq.rep_rows.view,
                cells, cache.streams[0].pos, sq.keys.view, sq.pools.view,
                global_row(sq.strm, 0, self.kv_size))

    def _one_sequence(self, layout: Layout, change: LayoutChange, cache: KvCache) -> bool:
        """`verify` of a layout of one sequence in one kernel call
        (`GuardedKernels.recheck_one`: `_sequences`' way, by the same rule, then
        `_checked` of the pools the update did not keep), where that way is `NONE` or
        `NEW` and no race is remembered: the verdicts `_recheck` would set. False,
        nothing done, where the general way must answer (the kernel's None: a look-up,
        a scan, or something outside its array, which that way says)."""
        if not self.one_open(layout, cache):
            return False
        dirty = bool(self._kdirty_rows or self._pdirty_rows)
        n, n_bad, kept, known, rep_pos, rep_rows, cells, pos, keys, pools, row0 = \
            self.one_args(layout, change, cache, dirty)
        got = self.kernels.recheck_one(n, n_bad, kept, known, rep_pos, rep_rows, dirty,
                                       cells.size > LOOKUP_MAX_ROWS, cells, pos,
                                       keys, pools, row0)
        if got is None:
            return False
        self.took_one(layout, change, *got)
        return True

    def took_one(self, layout: Layout, change: LayoutChange, way: int, verdicts: np.ndarray
                 ) -> None:
        """The one-call verification answered: way `way` (`NONE` or `NEW`) and, for
        `NEW`, the verdicts of the pools past those the update kept."""
        if way == NEW:
            n = len(layout.seqs[0].pools)
            cand = change.new_pools(0, n)
            self.pools_checked += cand.size
            self._rechecked(0, n, cand, verdicts, change)

    def verified_one(self, layout: Layout, change: LayoutChange, way: int,
                     verdicts: np.ndarray) -> None:
        """`verify`, whose one-call verification answered elsewhere (`took_one`)."""
        self.took_one(layout, change, way, verdicts)
        self._settle()

    def _many_sequences(self, layout: Layout, change: LayoutChange, cache: KvCache) -> bool:
        """`verify` of a layout of several sequences and a cache of one stream in one
        kernel call (`GuardedKernels.recheck_many`: `_sequences`' ways, by the same rule
        and the same lowest pair each sequence holds, then `_checked` of the pools past
        each `NEW` sequence's kept ones, their rows read in the layout's flat columns,
        `Layout.flat_columns`), where every way is `NONE` or `NEW`, no race is
        remembered and no clear came since the last verification: what `_recheck` would
        set. False, nothing done, where the general way must answer: a layout without
        flat columns (the reference's), or the kernel's None (a look-up, a scan, or
        something outside its array, which that way says); and where the update changed
        no sequence's pools, so that no pool is new and the general way's `_sequences`
        alone (every way NONE, as a verification leaves each count its pools') costs
        less than this call's door (W2's steps that close no pool: 31 us against 42)."""
        if (self._all_dirty or not change.changed or len(layout.seqs) < 2
                or len(cache.streams) != 1 or self.writers.alt):
            return False
        cols = layout.flat_columns()
        if cols is None:
            return False
        kd, pd = self._kdirty_rows, self._pdirty_rows
        same = _same_rows(kd, pd)
        rows = kd if same else kd + pd  # the one stream's changed cells
        cells = rows[0] if len(rows) == 1 else np.concatenate(rows) if rows else _NO_PAIRS
        dirty = bool(kd or pd)
        # `_DirtyPairs.too_many`: the rows of both lists (one list twice, where one)
        too_many = (2 if same else 1) * cells.size > LOOKUP_MAX_ROWS
        known, rep_pos, rep_rows = _tails(layout, cache, dirty)
        start, kept = layout.pool_start(), np.asarray(change.kept, dtype=np.int64)
        st = cache.streams[0]
        got = self.kernels.recheck_many(start, self.n_checked, kept, known, rep_pos, rep_rows,
                                        dirty, too_many, cells, st.pos, st.has,
                                        self._seq_ids(st), cols)
        if got is None:
            return False
        how, verdicts = got
        self.pools_checked += verdicts.size
        if self.bad_seqs or any_set(verdicts):
            self._many_rechecked(start, kept, how, verdicts)
        # a NONE sequence kept every pool and checked them all: each has its pools' count
        np.subtract(start[1:], start[:-1], out=self.n_checked)
        return True

    def _many_rechecked(self, start: np.ndarray, kept: np.ndarray, how: np.ndarray,
                        verdicts: np.ndarray) -> None:
        """`_rechecked` of the `NEW` sequences that have or had a bad pool (before
        `n_checked` moves on): `verdicts` are those of each `NEW` sequence's pools past
        its kept ones, sequence after sequence (`recheck_many`)."""
        n_new = np.where(how == NEW, start[1:] - start[:-1] - kept, 0)
        ends = np.cumsum(n_new)
        hit = ends.searchsorted(np.flatnonzero(verdicts), side="right")
        for s in sorted({*hit.tolist(), *(s for s in self.bad_seqs if how[s] == NEW)}):
            k, n, b = int(kept[s]), int(start[s + 1] - start[s]), int(ends[s])
            old = self.bad_of(s)[:k]
            got = np.zeros(n, dtype=bool)
            got[:old.size] = old
            got[k:] = verdicts[b - (n - k):b]
            self._bad[s] = got
            if got.any():
                self.bad_seqs.add(s)
            else:
                self.bad_seqs.discard(s)

    def _seq_ids(self, st: Stream) -> np.ndarray:
        """The sequence of each of stream `st`'s columns (`Stream.seq_ids`) as an int64
        array, made again only when the stream's list is another."""
        held = self._ids
        if held is None or held[0] is not st.seq_ids:
            held = self._ids = (st.seq_ids, np.array(st.seq_ids, dtype=np.int64))
        return held[1]

    def _recheck(self, layout: Layout, change: LayoutChange, dirty: _DirtyPairs,
                 seqs: np.ndarray, how: np.ndarray) -> None:
        """`verify` of sequences `seqs` (ascending), whose pools to recheck are found
        as `how` says (`_sequences`). From `_RANGED_FROM` sequences on (and after a
        clear), the `NEW` ones whose kept verdicts are there to keep are rechecked as
        ranges, together; the others (and a sequence alone) one by one."""
        start, all_new = layout.pool_start(), self._all_dirty
        if seqs.size == 1 and not all_new:  # one sequence (a decode's), its pools alone
            s = int(seqs[0])
            cand = self._candidates(layout, change, s, int(how[0]), dirty)
            got = self._checked(layout, start[s] + cand) if cand.size else _NO_VERDICTS
            self._rechecked(s, len(layout.seqs[s].pools), cand, got, change)
            return
        bad, n_checked, bad_seqs = self._bad, self.n_checked, self.bad_seqs
        ips: list[np.ndarray] = []  # the range sequences' candidates, then the others'
        r_seqs = r_kept = r_n = r_ends = np.empty(0, dtype=np.int64)
        rest = zip(seqs.tolist(), how.tolist(), strict=True)
        if all_new or seqs.size >= _RANGED_FROM:  # after a clear, every pool is new
            kept = (np.zeros(len(layout.seqs), dtype=np.int64) if all_new
                    else np.asarray(change.kept, dtype=np.int64))
            ranged = (how == NEW) & (kept[seqs] <= n_checked[seqs])
            r_seqs = seqs[ranged]
            r_kept = kept[r_seqs]
            r_n = start[r_seqs + 1] - start[r_seqs] - r_kept
            r_ends = np.cumsum(r_n)
            if r_seqs.size:
                ips.append(ranges(start[r_seqs] + r_kept, r_n))
            rest = zip(seqs[~ranged].tolist(), how[~ranged].tolist(), strict=True)
        # (s, its pools, its pools to recheck)
        one_by_one: list[tuple[int, int, np.ndarray]] = []
        for s, h in rest:
            cand = self._candidates(layout, change, s, h, dirty)
            one_by_one.append((s, len(layout.seqs[s].pools), cand))
            ips.append(start[s] + cand)
        every = np.concatenate(ips) if ips else np.empty(0, dtype=np.int64)
        verdict = np.empty(0, dtype=bool)
        if every.size:  # one check of every sequence's candidates, by their global indices
            # each kind alone is in the layout's order already; both: sort them into it
            order = np.argsort(every, kind="stable") if one_by_one and r_seqs.size else None
            got = self._checked(layout, every if order is None else every[order])
            if order is None:
                verdict = got
            else:
                verdict = np.empty_like(got)
                verdict[order] = got
        # a range sequence has a bad pool when its range has one, or its kept part;
        # one with neither, outside `bad_seqs` before and after, keeps only its count
        at = int(r_ends[-1]) if r_seqs.size else 0
        if r_seqs.size:
            hits = np.zeros(at + 1, dtype=np.int64)
            np.cumsum(verdict[:at], out=hits[1:])
            range_bad = hits[r_ends] > hits[r_ends - r_n]
            held = [i for i, s in enumerate(r_seqs.tolist()) if s in bad_seqs]
            for i in sorted({*held, *np.flatnonzero(range_bad).tolist()}):
                s, k, b = int(r_seqs[i]), int(r_kept[i]), int(r_ends[i])
                old = self.bad_of(s)
                bad[s] = np.concatenate((old[:k], verdict[b - int(r_n[i]):b]))
                if range_bad[i] or bool(old[:k].any()):
                    bad_seqs.add(s)
                else:
                    bad_seqs.discard(s)
            n_checked[r_seqs] = r_kept + r_n
        for s, n, cand in one_by_one:
            self._rechecked(s, n, cand, verdict[at:at + cand.size], change)
            at += cand.size

    def _checked(self, layout: Layout, ips: np.ndarray) -> np.ndarray:
        """`differ` of the pools `ips` (global indices, ascending), counted."""
        self.pools_checked += ips.size
        return self.differ(layout.members_of(ips), layout.pool_cells()[ips])

    def _rechecked(self, s: int, n: int, cand: np.ndarray, got: np.ndarray,
                   change: LayoutChange) -> None:
        """Sequence s, of n pools now, has verdicts `got` for its pools `cand` (the
        others as they were, those past its kept pools none bad)."""
        if s in self.bad_seqs or any_set(got):  # else: no bad pool before or now, a count
            verdicts = self.bad_of(s)[:change.kept[s]]
            if verdicts.size < n:
                verdicts = np.concatenate((verdicts, np.zeros(n - verdicts.size,
                                                              dtype=bool)))
            verdicts[cand] = got
            self._bad[s] = verdicts
            if verdicts.any():
                self.bad_seqs.add(s)
            else:
                self.bad_seqs.discard(s)
        self.n_checked[s] = n


_NO_PAIRS = np.empty(0, dtype=np.int64)
# past this many changed rows a pass over the pairs costs less than look-ups
# (`_DirtyPairs`, and the one-call verification's `too_many`)
LOOKUP_MAX_ROWS = 4096
_NO_VERDICTS = np.empty(0, dtype=bool)
# from this many sequences to recheck (and after a clear), `NEW` ones are rechecked as
# ranges, together (`Verifier._recheck`); one alone (W4's slot closing a pool) costs
# less by itself
_RANGED_FROM = 2


def _tails(layout: Layout, cache: KvCache, dirty: bool
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What recheck.py's rule reads of the sequences' kept tails: which sequences are
    known equal to the cache's (asked only once a row changed: `dirty`), and the rep
    columns, read only for a tail, a known sequence's."""
    known = (layout.known_equal_seqs(cache) if dirty
             else np.zeros(len(layout.seqs), dtype=bool))
    if not any_set(known):
        return known, _NO_PAIRS, _NO_PAIRS
    return known, layout.pool_rep_pos_now(), layout.pool_cells()


def _same_rows(kdirty: list[np.ndarray], pdirty: list[np.ndarray]) -> bool:
    """The changed rows' two lists hold the very same arrays (a decode's rows are
    touched as keys and as pooled rows alike): one of them says every changed cell."""
    return len(kdirty) == len(pdirty) and all(
        a is b for a, b in zip(kdirty, pdirty, strict=True))


class _DirtyPairs:
    """One verification's changed rows as pairs per sequence: for each changed cell,
    the sequences holding it now and its pair (pos << CELL_BITS | cell), for the
    member keys and the rep rows apart, built on first use (`held_pairs`, a stream at
    a time). Past `LOOKUP_MAX_ROWS` changed rows (a copy of a long prompt, say) it is
    `too_many`: `of` gives None and `lowest` is not asked, as a pass over the pairs
    costs less than that many look-ups. `least_parts` and `lowest` share one split of
    the changed cells by stream (`_by_stream`): `recheck_ways` reads one stream's
    least pair in its own pass (several streams: `least_pair`, each in one), `lowest`
    pairs them all (`_changed`, the rare case: a changed pair at or before a kept
    tail). `rep_scan`: the scan's `_rep_dirty`, once some sequence needs it."""

    def __init__(self, cache: KvCache, kernels: GuardedKernels, kdirty: list[np.ndarray],
                 pdirty: list[np.ndarray]) -> None:
        self.cache, self.kernels, self.kdirty, self.pdirty = cache, kernels, kdirty, pdirty
        # past this many changed rows a pass over the pairs costs less than look-ups
        self.too_many = (sum(r.size for r in kdirty) + sum(r.size for r in pdirty)
                         > LOOKUP_MAX_ROWS)
        self._same = _same_rows(kdirty, pdirty)
        self._by_seq: dict[int, tuple[np.ndarray, np.ndarray]] | None = None
        self._streams: list[tuple[Stream, np.ndarray]] | None = None
        self._cells: list[tuple[Stream, np.ndarray, np.ndarray]] | None = None
        self.rep_scan: list[np.ndarray | None] | None = None

    def of(self, s: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(member pairs, rep pairs) of sequence s, in no order; None: scan instead."""
        if self.too_many:
            return None
        if self._by_seq is None:
            members = self._pairs(self.kdirty)
            self._by_seq = self._split(members, members if self._same else
                                       self._pairs(self.pdirty))
        return self._by_seq.get(s, (_NO_PAIRS, _NO_PAIRS))

    def lowest(self, n_seq: int) -> np.ndarray:
        """[n_seq] each sequence's lowest changed pair, member or rep (INT64_MAX where it
        holds none), for all at once: a cell's pair is the same in every sequence that
        holds it, so a stream's changed cells are paired once and each column takes the
        least of those it holds. Asked only when not `too_many` (else: scan)."""
        low = np.full(n_seq, NO_PAIR, dtype=np.int64)
        for st, cells, pairs in self._changed():
            # a stream's columns are distinct sequences, held by no other stream
            ids = np.asarray(st.seq_ids, dtype=np.int64)
            mins = np.where(st.has[:, cells], pairs, NO_PAIR).min(axis=1)
            low[ids] = np.minimum(low[ids], mins)
        return low

    def least_parts(self) -> tuple[np.ndarray, np.ndarray, int]:
        """What `recheck_ways` reads the least pair of any changed cell from, whoever
        holds it (INT64_MAX without one; no sequence's `lowest` is below it): the
        changed cells of the one stream that has some and its positions, in the
        kernel's own pass (5.5 us less a W4 ubatch than `least_pair`'s door and the
        tails' max after it); of several streams, their least pair (`least_pair`, a
        stream at a time, asked whether or not a tail needs it). O(rows changed),
        with no look at who holds what: when every
        changed pair lies past every sequence's kept tail (a step of slots at one
        length, each appending its new pair: W2's), this alone says so; slots at
        different lengths, or a changed cell that was freed (pos -1), leave it to
        `lowest`."""
        if not (self.kdirty or self.pdirty):
            return _NO_PAIRS, _NO_PAIRS, NO_PAIR
        parts = self._by_stream()
        if len(parts) == 1:
            st, cells = parts[0]
            return cells, st.pos, NO_PAIR
        return _NO_PAIRS, _NO_PAIRS, min(
            (self.kernels.least_pair(cells, st.pos) for st, cells in parts), default=NO_PAIR)

    def _by_stream(self) -> list[tuple[Stream, np.ndarray]]:
        """Per stream with a changed row: the stream and its changed cells (member and
        rep lists end to end)."""
        if self._streams is None:
            rows = self.kdirty if self._same else [*self.kdirty, *self.pdirty]
            rows_a = (rows[0] if len(rows) == 1 else np.concatenate(rows) if rows
                      else np.empty(0, dtype=np.int64))
            streams = self.cache.streams
            if len(streams) == 1:  # a row is its cell (global_row's)
                by_stream = [(0, rows_a)]
            else:
                strm, cells = np.divmod(rows_a, self.cache.config.kv_size)  # global_row's
                by_stream = [(t, cells[strm == t]) for t in unique(strm).tolist()]
            self._streams = [(streams[t], c) for t, c in by_stream if c.size]
        return self._streams

    def _changed(self) -> list[tuple[Stream, np.ndarray, np.ndarray]]:
        """`_by_stream`, with the changed cells' pairs."""
        if self._cells is None:
            self._cells = [(st, c, make_keys(st.pos[c], c)) for st, c in self._by_stream()]
        return self._cells

    def _split(self, members: dict[int, tuple[np.ndarray, np.ndarray]],
               reps: dict[int, tuple[np.ndarray, np.ndarray]]
               ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per sequence holding a changed cell, its (member pairs, rep pairs)."""
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for which, held in enumerate((members, reps)):
            for t, (off, pairs) in held.items():
                ids = self.cache.streams[t].seq_ids
                for c in np.flatnonzero(off[1:] > off[:-1]).tolist():
                    got = pairs[off[c]:off[c + 1]]
                    m, r = out.get(ids[c], (_NO_PAIRS, _NO_PAIRS))
                    out[ids[c]] = (got, r) if which == 0 else (m, got)
        return out

    def _pairs(self, rows_list: list[np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per stream with a changed row: `held_pairs` of its changed cells."""
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if not rows_list:
            return out
        rows = rows_list[0] if len(rows_list) == 1 else np.concatenate(rows_list)
        streams = self.cache.streams
        if len(streams) == 1:
            st = streams[0]
            out[0] = self.kernels.held_pairs(rows, st.has, st.pos)
            return out
        kv = self.cache.config.kv_size
        strm = rows // kv
        for t in unique(strm).tolist():
            st = streams[t]
            out[t] = self.kernels.held_pairs(rows[strm == t] - global_row(t, 0, kv), st.has,
                                             st.pos)
        return out
