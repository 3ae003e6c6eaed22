"""The pool layout and its incremental update (ENGINE.md §5).

Owns: per sequence its copy of the (pos, cell) pairs, its pools (start indices into
those pairs), the rep row of each pool, `j_next` and `pos_min`, and (versions that
track sharing) its `shared` flag; the layout's `n_pool_real`, `cache_safe` and the
count of its updates (`n_updates`, each `LayoutChange`'s `serial`); and the form in
which a layout may say how its every-pool columns grew (`PoolGrowth`) and hands
every sequence's columns to a kernel (`FlatColumns`, the compiled layout's alone), and
the pools past each sequence's kept ones (`pools_past`) and the count of pools by
rep row that follows them (`RepRowCounts`).

Invariants:
- a sequence's pairs are a *copy*: the cache may change under them (a seq_add of a
  shared cell) and the layout keeps what it read, as llama.cpp's does; that gap is
  layout drift (KP007), detected by `drift`, never repaired here;
- pools are in increasing start order, so their first and rep positions are
  strictly increasing (position mode) and pools never overlap;
- `rep_rows[k]` = `strm * kv_size + cell` of pool k's last member.

Pools are numbered globally in layout order: sequence 0's pools, then 1's, ...
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..arrays import ranges, unique
from ..cache.cells import CELL_BITS, CELL_MASK, GrowArray, global_row
from ..cache.kv import KvCache

POS_CLEAN = (1 << 31) - 1  # llama.cpp's POS_CLEAN: no position of the sequence is stale


def all_clean(stale: list[int]) -> bool:
    """Every sequence of a staleness snapshot is clean (`POS_CLEAN`): a step of
    parallel slots, known in one pass in C."""
    return stale.count(POS_CLEAN) == len(stale)


@dataclass(slots=True)
class SeqLayout:
    """One sequence's part of the layout (llama.cpp's kpool_layout::seq). Beside the
    real engine's `pools` it keeps, per pool, columns derived once when the pool is
    found (the pairs under a pool never change until the sequence is rebuilt)."""

    strm: int = 0
    pos_min: int = 0
    keys: GrowArray = field(default_factory=GrowArray)  # [n_cells] | j | pos << 32 | cell
    pools: GrowArray = field(default_factory=GrowArray)  # [n_pools] | k | start index j
    rep_rows: GrowArray = field(default_factory=GrowArray)  # [n_pools] | k | global rep row
    rep_pos_: GrowArray = field(default_factory=GrowArray)  # [n_pools] | k | rep's pos
    first_pos_: GrowArray = field(default_factory=GrowArray)  # [n_pools] | k | first pos
    j_next: int = 0
    shared: bool = False
    # an update with no new cell and no staleness would change nothing and scan
    # nothing (the append path applies): see Layout.update
    settled: bool = False

    def rebuild(self, sp: np.ndarray) -> None:
        """ENGINE.md §5 step 2: cells = sp, pools cleared, j_next = 0, pos_min = the
        first pos (0 if empty), shared = False."""
        self.keys.assign(sp)
        for col in (self.pools, self.rep_rows, self.rep_pos_, self.first_pos_):
            col.assign(np.empty(0, dtype=np.int64))
        self.j_next = 0
        self.pos_min = int(sp[0] >> CELL_BITS) if sp.size else 0
        self.shared = False

    def cut(self, n_keys: int, n_pools: int, kpool: int) -> None:
        """Keep the first n_keys pairs and the first n_pools pools (whose members lie in
        them); the scan resumes after the last kept pool."""
        self.keys.truncate(n_keys)
        for col in (self.pools, self.rep_rows, self.rep_pos_, self.first_pos_):
            col.truncate(n_pools)
        self.j_next = int(self.pools.view[-1]) + kpool if n_pools else 0
        self.shared = False

    def add_pools(self, starts: np.ndarray, kpool: int, kv_size: int) -> None:
        keys = self.keys.view
        reps = keys[starts + kpool - 1]
        self.pools.extend(starts)
        self.rep_rows.extend(global_row(self.strm, reps & CELL_MASK, kv_size))
        self.rep_pos_.extend(reps >> CELL_BITS)
        self.first_pos_.extend(keys[starts] >> CELL_BITS)

    @property
    def pos(self) -> np.ndarray:
        return self.keys.view >> CELL_BITS

    @property
    def cells(self) -> np.ndarray:
        return self.keys.view & CELL_MASK

    def first_pos(self) -> np.ndarray:
        """[n_pools] the first member's pos of each pool."""
        return self.first_pos_.view

    def rep_pos(self) -> np.ndarray:
        """[n_pools] the rep's (last member's) pos of each pool (kept with the pools:
        the pairs never change under a pool until the sequence is rebuilt)."""
        return self.rep_pos_.view

    def members(self, ks: np.ndarray, kpool: int, kv_size: int) -> np.ndarray:
        """[len(ks), kpool] global rows of the members of pools ks."""
        j = self.pools.view[ks][:, None] + np.arange(kpool)[None, :]
        return global_row(self.strm, self.keys.view[j] & CELL_MASK, kv_size)


def by_sequence(seq: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The indices of `seq` (a sequence id each: tokens, pairs, pools) grouped by
    sequence, ascending, each group in its original order."""
    if seq.size == 0:
        return []
    if bool((seq == seq[0]).all()):
        return [(int(seq[0]), np.arange(seq.size, dtype=np.int64))]
    order = np.argsort(seq, kind="stable")
    ids = seq[order]
    cut = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), seq.size]
    first = ids[cut[:-1]].tolist()
    return [(s, order[a:b]) for s, a, b in zip(first, cut[:-1], cut[1:], strict=True)]


def scan_pools(keys: np.ndarray, j_from: int, pos_min: int, kpool: int, by_order: bool
               ) -> tuple[np.ndarray, int]:
    """ENGINE.md §5 step 4, from `j_from` over a sequence's pairs `keys`.

    Returns (pool starts, j_next). The scan is llama.cpp's greedy loop; it is
    computed at once because a start candidate can never fall inside an accepted
    pool (its pos would be pos_j + i with 0 < i < kpool, so not a multiple of kpool
    past pos_min), which makes the greedy scan accept exactly every candidate."""
    n = keys.size
    last = n - kpool  # the last j with j + kpool <= n
    if last < j_from:
        return np.empty(0, dtype=np.int64), j_from
    if by_order:
        starts = np.arange(j_from, last + 1, kpool, dtype=np.int64)
        return starts, j_from + kpool * starts.size
    seg = keys[j_from:] >> CELL_BITS  # only the pairs the scan has not passed yet
    t = np.arange(last - j_from + 1)
    ok = (seg[t] - pos_min) % kpool == 0
    if kpool > 1:
        broken = np.concatenate(([0], np.cumsum(np.diff(seg) != 1)))
        ok &= broken[t + kpool - 1] == broken[t]
    starts = j_from + np.flatnonzero(ok).astype(np.int64)
    j_next = max(int(starts[-1]) + kpool if starts.size else j_from, last + 1)
    return starts, j_next


def pools_past(start: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The global indices (ascending) of each sequence's pools past its first kept[s]
    (`pool_start` `start`): the pools an update added or regrouped."""
    return ranges(start[:-1] + kept, np.diff(start) - kept)


class RepRowCounts:
    """How many pools are on each rep row (a row without a pool has no entry, so this
    holds what a layout holds, never a count per row of the cache), kept from the
    pools each update took away and brought: one by one, or, when those are a quarter
    of the pools or more (a seq_keep or a whole seq_cp at each step replaces them
    all), counted afresh from every pool's rep row in C, and the rows compared as key
    sets, not pool by pool in Python. `held_twice` asks the rows two or more pools
    are on of the count a recount made, in C, or of the dict."""

    __slots__ = ("_twice", "on")

    def __init__(self) -> None:
        self.on: Counter[int] = Counter()  # rep row -> its pools (> 0)
        # the rows two or more pools are on, as the last recount found them (None: the
        # counts followed an update since)
        self._twice: np.ndarray | None = None

    def recount(self, rows: np.ndarray) -> tuple[set[int], set[int]]:
        """Counted afresh from `rows`, every pool's rep row: (the rows no pool is on
        any more, the rows a pool is on where none was)."""
        held, n = np.unique(rows, return_counts=True)
        was = self.on
        self.on = Counter(dict(zip(held.tolist(), n.tolist(), strict=True)))
        self._twice = held[n > 1]
        return set(was.keys() - self.on.keys()), set(self.on.keys() - was.keys())

    def follow(self, gone: np.ndarray, came: np.ndarray, rows: np.ndarray
               ) -> tuple[set[int], set[int]]:
        """The pools on rows `gone` taken away and those on rows `came` brought, `rows`
        being every pool's rep row after: (the rows no pool is on any more, the rows a
        pool is on where none was). Every row gone is counted (each old pool once), so
        taking them all away before adding leaves the counts any other order leaves."""
        if 4 * (gone.size + came.size) >= rows.size:
            return self.recount(rows)
        self._twice = None
        on = self.on
        emptied, held = set(), set()
        for r in gone.tolist():
            n = on[r] - 1
            if n:
                on[r] = n
            else:
                del on[r]
                emptied.add(r)
        for r in came.tolist():
            n = on[r]
            on[r] = n + 1
            if not n:
                held.add(r)
        return emptied, held

    def held_twice(self, rows: np.ndarray) -> list[int]:
        """Those of `rows` (distinct) that two or more pools are on."""
        if self._twice is not None:
            return self._twice[np.isin(self._twice, rows)].tolist()
        on = self.on
        return [r for r in rows.tolist() if on[r] > 1]


class PoolGrowth(NamedTuple):
    """How a layout's every-pool columns grew from those built before its pools last
    changed (`Layout.every_growth`): sequence s's first kept[s] pools are the pools
    before[s].. of those columns and now start[s].., the same pools (the same pairs:
    the same members, positions and rep rows); its other pools are new. A reader that
    holds what it built from `old_members` (by identity) may grow it."""

    old_members: np.ndarray  # the `pool_members` array built before
    before: np.ndarray  # [n_seq_max + 1] the `pool_start` it was built with
    kept: np.ndarray  # [n_seq_max] the pools each sequence kept (`LayoutChange.kept`)
    start: np.ndarray  # [n_seq_max + 1] `pool_start` now


class FlatColumns(NamedTuple):
    """Every sequence's pairs and pools flat, row s of each array sequence s's (the
    compiled layout's arenas, `Layout.flat_columns`): what a kernel reads to find the
    member and rep rows of any sequence's pools without a look-up of its own. Borrowed,
    not copied: stale once the layout updates (or an arena grows)."""

    keys: np.ndarray  # [n_seq_max, cap] int64 | s, j | pos << CELL_BITS | cell (n_keys[s] live)
    n_keys: np.ndarray  # [n_seq_max] int64 | s | its live pairs
    pools: np.ndarray  # [n_seq_max, cap_p] int64 | s, k | pool k's first pair's index j
    rep_rows: np.ndarray  # [n_seq_max, cap_p] int64 | s, k | pool k's global rep row
    strm: np.ndarray  # [n_seq_max] int64 | s | its stream


@dataclass(frozen=True, slots=True)
class LayoutChange:
    """What a `Layout.update` changed (or the updates `then` joins: a decode's memory
    update and its first ubatch's, ENGINE.md §3), for the value backend and the
    verdicts: per sequence, `kept[s]` pools are the same pools (same pairs, same rep
    rows) as before the update, and pools `kept[s]..` are new or regrouped; `read` are
    the sequences whose pairs the update read (the others' cells did not change, so
    neither did their layout nor its drift); `changed` those whose pools differ from
    before; `cells_scanned` is what the real engine scanned (ENGINE.md §8), whatever
    kpool itself looked at; `serial` counts the layout's updates, the last one
    included (so a reader that kept what an update left can tell that this change is
    the very next one)."""

    kept: tuple[int, ...]
    read: frozenset[int]
    changed: frozenset[int]
    cells_scanned: int
    serial: int = 0

    def new_pools(self, s: int, n_pools: int) -> np.ndarray:
        """Sequence s's pools that are new or regrouped."""
        return np.arange(self.kept[s], n_pools, dtype=np.int64)

    def then(self, later: LayoutChange) -> LayoutChange:
        """This update and `later`, the next one, as one change since the layout before
        this one (the memory update's, ENGINE.md §3, and the ubatch's after it): the
        pools both kept, the sequences either read or changed, the cells both scanned;
        `serial` is later's, so a reader that kept what the update before this one left
        sees that an update came between and does not take the two for one step."""
        return LayoutChange(tuple(map(min, self.kept, later.kept)), self.read | later.read,
                            self.changed | later.changed,
                            self.cells_scanned + later.cells_scanned, later.serial)

    @staticmethod
    def joined(earlier: LayoutChange | None, later: LayoutChange) -> LayoutChange:
        """`earlier.then(later)`, or `later` when there was none."""
        return later if earlier is None else earlier.then(later)


class Layout:
    """Every sequence's pools (llama.cpp's kpool_layout), updated once per ubatch."""

    def __init__(self, n_seq_max: int, kpool: int, by_order: bool, kv_size: int) -> None:
        self.kpool = kpool
        self.by_order = by_order
        self.kv_size = kv_size
        self.seqs = [SeqLayout() for _ in range(n_seq_max)]
        self.n_pool_real = 0
        self.cache_safe = True
        self.n_updates = 0  # `LayoutChange.serial` of the last update
        self._pool_start: np.ndarray | None = None
        self._pool_seq: np.ndarray | None = None
        self._pool_cells: np.ndarray | None = None
        self._pool_first_pos: np.ndarray | None = None
        self._pool_rep_pos: np.ndarray | None = None
        self._every: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def update(self, cache: KvCache, stale: list[int], track_sharing: bool,
               truncate: str | None = None) -> LayoutChange:
        """ENGINE.md §5: extend each clean sequence by the pairs past its last one, or
        rebuild it; then scan for new pools. Returns what changed, with the cells the
        real engine scans (pairs copied into the layout, plus the sharing scan of step
        3).

        A clean sequence whose cells did not change since the last update (the cache's
        `take_touched`) and that is `settled` (the append path applies: its pairs
        match the cells' count and pos_min) is skipped: the engine's update of it
        copies and scans nothing and changes nothing, so skipping it is exact, cost
        counters included."""
        kpool, unified = self.kpool, cache.config.unified
        touched = cache.take_touched()
        scanned = 0
        kept: list[int] = []
        read: set[int] = set()
        changed: set[int] = set()
        for s, sq in enumerate(self.seqs):
            n_before = len(sq.pools)
            if stale[s] == POS_CLEAN and s not in touched and sq.settled:
                kept.append(n_before)
                continue
            read.add(s)
            sp = cache.seq_keys(s)
            sq.strm = cache.stream_of(s)
            n_kept = 0
            n_pools = n_before
            clean = stale[s] == POS_CLEAN
            # step 1: the append path
            if clean and len(sq.keys) and sp.size and sq.pos_min == int(sp[0] >> CELL_BITS):
                n_kept = len(sq.keys)
                tail = sp[sp.searchsorted(sq.keys.view[-1], side="right"):]
                sq.keys.extend(tail)
                scanned += tail.size
            n_pools, n_kept, copied, _rebuilt = self.step_2(cache, sq, sp, stale[s],
                                                             truncate, n_pools, n_kept)
            scanned += copied
            kept.append(n_pools)
            # step 3 (versions that track sharing, unified only)
            if track_sharing and unified and not sq.shared and len(sq.keys) > n_kept:
                cells = sq.cells[n_kept:]
                counts = cache.seq_counts(0, cells)
                hit = np.flatnonzero(counts > 1)
                sq.shared = hit.size > 0
                scanned += int(hit[0]) + 1 if hit.size else cells.size
            # step 4: the pool scan
            starts, sq.j_next = scan_pools(sq.keys.view, sq.j_next, sq.pos_min, kpool,
                                           self.by_order)
            if starts.size:
                sq.add_pools(starts, kpool, self.kv_size)
            if n_pools < n_before or n_pools < len(sq.pools):
                changed.add(s)
            n = len(sq.keys)
            sq.settled = (n == sp.size and (n == 0 or sq.pos_min == int(sp[0] >> CELL_BITS)))
        return self._end_update(kept, read, changed, scanned)

    def _end_update(self, kept: list[int], read: set[int], changed: set[int], scanned: int,
                    reshared: set[int] | None = None) -> LayoutChange:
        """An update's end, whatever ran it: the whole-layout columns of a layout whose
        pools changed are built again on their next read, and what changed is told.
        `n_pool_real` can move only with the pools of `changed`, `cache_safe` only with
        the `shared` flags of `reshared` (default `read`: the sequences whose steps
        ran), so each is summed again only then."""
        if changed:
            self._pool_start = self._pool_seq = self._pool_cells = None
            self._pool_first_pos = self._pool_rep_pos = None
            self._every = None
            self.n_pool_real = int(self.pool_counts().sum())
        if read if reshared is None else reshared:
            self.cache_safe = not self._any_shared()
        self.n_updates += 1
        return LayoutChange(tuple(kept), frozenset(read), frozenset(changed), scanned,
                            self.n_updates)

    def step_2(self, cache: KvCache, sq: SeqLayout, sp: np.ndarray, stale: int,
               truncate: str | None, n_pools: int, n_kept: int, known_below: int = -1
               ) -> tuple[int, int, int, bool]:
        """ENGINE.md §5 step 2 for one sequence, after step 1: the fork's truncate (a
        stale sequence it does not spare is cut at its stale position and extended by
        the append path, its kept pairs unchecked), then the rebuild when the count is
        off or the sequence is stale (and not truncated). `truncate`: None (no
        truncate), or which sequences it spares (`EngineVersion.truncate_spares`).
        `n_pools`, `n_kept`: the pools and pairs kept so far. `known_below`: a key
        below which the layout's pairs are known to be the cache's (`_rebuild`; -1:
        none). Returns (pools kept, pairs kept, pairs copied, rebuilt)."""
        clean = stale == POS_CLEAN
        copied = 0
        # the fork's condition (patch.py `_TRUNCATE`): stale, `!sq.shared` (or the
        # port's test), `!sq.cells.empty() && !sp.empty() && sq.pos_min ==
        # sp.begin()->first`; a stale position at or below pos_min cuts nothing and
        # rebuilds (`_truncate`)
        truncated = (truncate is not None and not clean and len(sq.keys) > 0
                     and sp.size > 0 and sq.pos_min == int(sp[0] >> CELL_BITS)
                     and not self._spared(cache, sq, truncate))
        if truncated:
            n_pools, n_kept, copied = self._truncate(sq, sp, stale)
        rebuilt = len(sq.keys) != sp.size or (not clean and not truncated)
        if rebuilt:
            n_pools = self._rebuild(sq, sp, stale, -1 if truncated else known_below)
            n_kept = 0
            copied += sp.size
        return n_pools, n_kept, copied, rebuilt

    def _spared(self, cache: KvCache, sq: SeqLayout, spares: str) -> bool:
        """Whether the truncate spares sq (which then rebuilds): "flagged-shared", the
        fork's `!sq.shared` gate on the cache-safe base (the flag of step 3, as of the
        last update); "no-shared-cell", the port's: some cell of the layout's pairs is
        held by another sequence too."""
        if spares == "flagged-shared":
            return sq.shared
        return bool((cache.seq_counts(sq.strm, sq.cells) > 1).any())

    def _truncate(self, sq: SeqLayout, sp: np.ndarray, stale: int) -> tuple[int, int, int]:
        """The fork's step 2 for a stale, unshared sequence: keep the layout's pairs
        whose pos is below `stale` and the pools that end in them (without checking
        them against the cells: the staleness contract of §4 says they did not
        change), then append every pair of sp that sorts after the last kept one.
        Nothing kept: the full rebuild. Returns (pools kept, pairs kept, pairs copied)."""
        have = sq.keys.view
        n = int(have.searchsorted(np.int64(min(stale, POS_CLEAN)) << CELL_BITS))
        if n == 0:
            sq.rebuild(sp)
            return 0, 0, int(sp.size)
        n_pools = int(sq.pools.view.searchsorted(n - self.kpool, side="right"))
        last = have[n - 1]
        sq.cut(n, n_pools, self.kpool)
        tail = sp[sp.searchsorted(last, side="right"):]
        sq.keys.extend(tail)
        return n_pools, n, int(tail.size)

    def _rebuild(self, sq: SeqLayout, sp: np.ndarray, stale: int, known_below: int = -1
                 ) -> int:
        """ENGINE.md §5 step 2, the engine's rebuild from sp; returns how many of the
        old pools the rebuild reproduces. The result is the full rebuild's, but when
        the pairs below the stale position are the layout's own (the staleness
        contract of §4: nothing below it changed, and no drift) the pools inside them
        are kept rather than found again: a pool is a function of its kpool pairs and
        pos_min alone (scan_pools), so the full scan would find the same ones. Whether
        they are is compared, unless the caller knows it: the stale position's key is
        at or below `known_below`, below which the layout's pairs are the cache's."""
        if (stale == POS_CLEAN or not len(sq.keys) or not sp.size
                or sq.pos_min != int(sp[0] >> CELL_BITS)):
            sq.rebuild(sp)
            return 0
        cut = np.int64(min(stale, POS_CLEAN)) << CELL_BITS
        have = sq.keys.view
        n = int(have.searchsorted(cut))
        if cut > known_below and (int(sp.searchsorted(cut)) != n
                                  or not np.array_equal(have[:n], sp[:n])):
            sq.rebuild(sp)
            return 0
        n_pools = int(sq.pools.view.searchsorted(n - self.kpool, side="right"))
        sq.cut(n, n_pools, self.kpool)
        sq.keys.extend(sp[n:])
        return n_pools

    # -- whole-layout views ------------------------------------------------------------

    # The whole-layout arrays below change only in `update`, which drops them; they
    # are built on first use after it (several readers per ubatch share one build).
    # Nothing writes them: the scatter plan and the records hold them as they are.

    def pool_counts(self) -> np.ndarray:
        """[n_seq_max] each sequence's pools (read it, never write it: the compiled
        layout's is its own)."""
        return np.fromiter((len(sq.pools) for sq in self.seqs), dtype=np.int64,
                           count=len(self.seqs))

    def _any_shared(self) -> bool:
        """Some sequence's `shared` flag is set (ENGINE.md §5 step 3)."""
        return any(sq.shared for sq in self.seqs)

    def pool_start(self) -> np.ndarray:
        """[n_seq_max + 1] global index of each sequence's first pool (and the total)."""
        if self._pool_start is None:
            counts = self.pool_counts()
            start = np.empty(counts.size + 1, dtype=np.int64)
            start[0] = 0
            np.add.accumulate(counts, out=start[1:])  # cumsum's, without its wrapper
            self._pool_start = start
        return self._pool_start

    def pool_seq(self) -> np.ndarray:
        """[n_pool_real] the seq id of every pool, in layout order."""
        if self._pool_seq is None:
            start = self.pool_start()
            self._pool_seq = np.repeat(np.arange(start.size - 1, dtype=np.int64),
                                       np.diff(start))
        return self._pool_seq

    def pool_cells(self) -> np.ndarray:
        """[n_pool_real] global rep row of every pool, in layout order (ENGINE.md §7)."""
        if self._pool_cells is None:
            self._pool_cells = self._column("rep_rows")
        return self._pool_cells

    def pool_cells_until_update(self) -> Callable[[], np.ndarray]:
        """`pool_cells`, built when first called (a plan that did not need the column
        gives it to a reader that asks: KP004), which must be before the next update."""
        serial = self.n_updates

        def column() -> np.ndarray:
            assert self.n_updates == serial, "pool_cells read after the next update"
            return self.pool_cells()

        return column

    def pool_first_pos(self) -> np.ndarray:
        """[n_pool_real] the first member's pos of every pool, in layout order."""
        if self._pool_first_pos is None:
            self._pool_first_pos = self._column("first_pos_")
        return self._pool_first_pos

    def pool_rep_pos(self) -> np.ndarray:
        """[n_pool_real] the rep's pos of every pool, in layout order."""
        if self._pool_rep_pos is None:  # apart from first_pos: the verification's alone
            self._pool_rep_pos = self._column("rep_pos_")
        return self._pool_rep_pos

    def pool_rep_pos_now(self) -> np.ndarray:
        """`pool_rep_pos` for a reader done with it before the next update: the column
        when it is built, else the one sequence's own array when one holds every pool
        (a view: a decode of one sequence copies no column), else the column."""
        if self._pool_rep_pos is not None:
            return self._pool_rep_pos
        return self._column("rep_pos_", view=True)

    def _column(self, name: str, view: bool = False) -> np.ndarray:
        """[n_pool_real] the per-pool column `name` of every sequence (a SeqLayout
        GrowArray: rep_rows, first_pos_, rep_pos_), end to end: in layout order.
        `view`: one sequence's own array as it is, when it holds every pool."""
        parts = [a for a in (getattr(sq, name).view for sq in self.seqs) if a.size]
        if view and len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def every_pool(self) -> np.ndarray:
        """[n_pool_real] every pool's global index, in layout order (what a re-pool-all
        ubatch marks). One array until the pools change, so a reader that is handed
        it again knows, by identity, that nothing it was built from moved."""
        return self._every_columns()[0]

    def pool_members(self) -> np.ndarray:
        """[n_pool_real, kpool] every pool's global member rows, in layout order
        (`members_of(every_pool())`)."""
        return self._every_columns()[2]

    def every_growth(self) -> PoolGrowth | None:
        """How the every-pool columns as they stand grew from those built before the
        pools last changed (`PoolGrowth`); None when not known (the reference layout
        builds its columns anew)."""
        return None

    def flat_columns(self) -> FlatColumns | None:
        """Every sequence's pairs and pools as flat arrays a kernel reads
        (`FlatColumns`), valid until the next update; None where the layout keeps each
        sequence's columns apart (the reference's: the value backend's one-call
        verification of many sequences then leaves them to the general way)."""
        return None

    def is_every_pool(self, ips: np.ndarray) -> bool:
        """Whether `ips` is the `every_pool` array of the layout as it stands (never
        builds it)."""
        return self._every is not None and ips is self._every[0]

    def _every_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(every_pool, each pool's k within its sequence, pool_members)."""
        if self._every is None:
            every = np.arange(self.n_pool_real, dtype=np.int64)
            self._every = (every, self._every_k(every), self._every_members(every))
        return self._every

    def _every_k(self, every: np.ndarray) -> np.ndarray:
        """Each pool's k within its sequence, in layout order (`every_pool`'s)."""
        return every - self.pool_start()[self.pool_seq()]

    def _every_members(self, every: np.ndarray) -> np.ndarray:
        """`pool_members` as it is built again after the pools changed: looked up."""
        return self._look_up_members(every)

    def known_equal_seqs(self, cache: KvCache) -> np.ndarray:
        """[n_seq_max] bool: `known_equal` of every sequence (none, here)."""
        return np.zeros(len(self.seqs), dtype=bool)

    def known_equal(self, cache: KvCache, s: int) -> bool:
        """Whether sequence s's pairs are known, without a look, to equal the cache's
        (its cells as they are now). The reference never claims it: its readers look
        (`drift`) or scan. A True lets a reader find a cell's pair by its pos in the
        cache (the value backend's verification)."""
        return False

    def drift(self, cache: KvCache, s: int) -> tuple[int, tuple[int, int] | None,
                                                     tuple[int, int] | None] | None:
        """ENGINE.md §8 KP007: where sequence s's pairs differ from a rebuild from its
        cells, or None when they agree. Equal pairs imply equal pools: the pools are a
        function of the pairs (and pos_min, which is the first pair's pos)."""
        have = self.seqs[s].keys.view
        want = cache.seq_keys(s)
        if have.size == want.size and np.array_equal(have, want):
            return None
        n = min(have.size, want.size)
        diff = np.flatnonzero(have[:n] != want[:n])
        j = int(diff[0]) if diff.size else n

        def pair(keys: np.ndarray) -> tuple[int, int] | None:
            return (int(keys[j] >> CELL_BITS), int(keys[j] & CELL_MASK)) if j < keys.size else None

        return j, pair(have), pair(want)

    def locate(self, ips: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global pool indices (each in [0, n_pool_real)) -> (seq, k) arrays: a look-up
        in `pool_seq`, or for a few pools while that column is not built (the layout
        changed since it was), a binary search in `pool_start` each."""
        if self.is_every_pool(ips):
            return self.pool_seq(), self._every_columns()[1]
        if len(self.seqs) == 1:  # one sequence's pools: k is the global index
            return np.zeros(ips.size, dtype=np.int64), ips.astype(np.int64)
        start = self.pool_start()
        if self._pool_seq is None and self._few(ips):
            seq = start.searchsorted(ips, side="right") - 1
        else:
            seq = self.pool_seq()[ips]
        return seq, ips - start[seq]

    def _few(self, ips: np.ndarray) -> bool:
        """`ips` are few enough of the pools to be looked up one by one rather than
        through a whole-layout column."""
        return ips.size < self.n_pool_real // 8

    def members_of(self, ips: np.ndarray) -> np.ndarray:
        """[len(ips), kpool] global member rows of the pools with global indices ips: read
        in `pool_members` while it is built for the pools as they stand (a re-pool-all
        ubatch's plan, its verification and its listing ask again for what marking had
        built), else looked up (a new array either way)."""
        if self._every is not None:
            return self._every[2][ips]
        return self._look_up_members(ips)

    def _look_up_members(self, ips: np.ndarray) -> np.ndarray:
        """`members_of`, from each sequence's pairs."""
        seq, k = self.locate(ips)
        out = np.empty((ips.size, self.kpool), dtype=np.int64)
        for s in unique(seq).tolist():
            sel = np.flatnonzero(seq == s)
            out[sel] = self.seqs[s].members(k[sel], self.kpool, self.kv_size)
        return out

    def columns(self, ips: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(seq, k, first_pos, last_pos) arrays of the pools with global indices ips."""
        seq, k = self.locate(ips)
        if self.is_every_pool(ips):
            return seq, k, self.pool_first_pos(), self.pool_rep_pos()
        return seq, k, self.pool_first_pos()[ips], self.pool_rep_pos()[ips]

