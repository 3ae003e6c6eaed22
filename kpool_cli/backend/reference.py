"""The numpy twin of `kernels.py`: the same kernels, in plain numpy, and `kept`,
the rule by slots that its `fresh_groups` is built on.

Owns nothing but functions. Each has the signature, the dtypes and the result of
its numba twin, and the tests hold the two equal bit for bit (float32 arrays
compared as uint32). The arithmetic order is the one `keys.py` fixes: an explicit
loop over the kpool axis, vectorised over entries and dimensions, never `np.sum`.

Wrappers (`guarded.py`, `GuardedKernels`) check dtypes, contiguity, shapes and
that every index is inside its array (`PlanError` otherwise). The value kernels
here do not (numpy would raise on most bad indices, but wrap a negative one
silently); those whose numba twins check each index as they read it (`fresh_groups`,
`stamp_winners`, `dirty_pools`, `held_pairs`, `recheck_ways`, `least_pair`) refuse
what their twins refuse, with the same `IndexError` or `ValueError`, and
`recheck_one` and `recheck_many` answer None where their twins do.
"""

from __future__ import annotations

import numpy as np

from ..arrays import ranges, rows_equal, rows_max, unique
from ..cache.cells import CELL_BITS, CELL_MASK, make_keys
from .guards import (
    FREE_OUTSIDE,
    NO_ROOM,
    NOT_DISTINCT,
    NOT_RACE_GROUPS,
    ONE_STEP_MAX_ROWS,
    OUTSIDE,
    RECHECKED,
    ROW_OUTSIDE,
    ROWS_WRITTEN,
    SCATTERED,
    SLOT_OUTSIDE,
    WROTE,
    WROTE_NOTHING,
    group_refusal,
)
from .keys import POW2, key_rows_from_state
from .recheck import NEW, NO_PAIR, NO_TAIL, NONE, SCAN


def write_keys(state: np.uint64, rows: np.ndarray, key_ids: np.ndarray, key: np.ndarray,
               gate: np.ndarray) -> None:
    """Write the key and gate rows of the writes `key_ids` into `rows`.

    Parameters
    ----------
    state : uint64
        `keys.seed_state(trace.seed)`.
    rows : array of int64, shape (n,)
        Slots (rows of `key`, `gate`), distinct.
    key_ids : array of int64, shape (n,)
        Key ids (0 = a zeroed row).
    key, gate : arrays of float32 and int8, shape (n_slots, n_embd), C-contiguous
        Updated in place.
    """
    k, g = key_rows_from_state(state, key_ids, key.shape[1])
    key[rows] = k
    gate[rows] = g


def write_rows(state: np.uint64, rows: np.ndarray, key_ids: np.ndarray, slot_of: np.ndarray,
               free: np.ndarray, n_handed: int, pristine: int, gen: int, n_ubatch: int,
               kind: int, key: np.ndarray, gate: np.ndarray, pooled: np.ndarray,
               slot_row: np.ndarray, key_gen: np.ndarray, pool_gen: np.ndarray,
               w_kind: np.ndarray, w_ubatch: np.ndarray, w_a: np.ndarray, w_b: np.ndarray,
               out: np.ndarray) -> tuple[int, int]:
    """`kernels.write_rows`: the slots handed out, keys written, pooled rows zeroed
    and the writer stamped, or what it refuses, before it writes."""
    inside = (rows >= 0) & (rows < slot_of.size)
    s = np.where(inside, slot_of[np.where(inside, rows, 0)], 0).astype(np.int64)
    wrong = ~inside | ((s != 0) & ((s < 1) | (s >= n_handed)))
    if wrong.any():
        j = int(np.argmax(wrong))
        return (ROW_OUTSIDE if not inside[j] else SLOT_OUTSIDE), j
    new = np.flatnonzero(s == 0)
    k = min(new.size, free.size)
    reused = free[free.size - k:]
    bad = (reused < 1) | (reused >= n_handed)
    if bad.any():
        return FREE_OUTSIDE, free.size - k + int(np.argmax(bad))
    room = min(key.shape[0], gate.shape[0], pooled.shape[0], slot_row.size, key_gen.size,
               pool_gen.size, w_kind.size, w_ubatch.size, w_a.size, w_b.size)
    if n_handed > room or n_handed + new.size - k > room:
        return NO_ROOM, new.size
    ids = np.concatenate((reused, np.arange(n_handed, n_handed + new.size - k,
                                            dtype=np.int64)))
    slot_of[rows[new]] = ids
    slot_row[ids] = rows[new]
    s[new] = ids
    write_keys(state, s, key_ids, key, gate)
    pooled[s[s < pristine]] = 0
    key_gen[s] = gen
    pool_gen[s] = 0
    w_kind[s] = kind
    w_ubatch[s] = n_ubatch
    w_a[s] = -1
    w_b[s] = -1
    out[:] = s
    return WROTE, int(new.size)


def _weights(g: np.ndarray) -> list[np.ndarray]:
    """Base-2 gate softmax over axis 1 of g [n, kpool, n_embd] -> kpool arrays [n, n_embd]."""
    mx = g.max(axis=1)  # exact: a max does not round
    kpool = g.shape[1]
    p = [POW2[(mx - g[:, i]).astype(np.int64)] for i in range(kpool)]
    s = p[0]
    for i in range(1, kpool):
        s = s + p[i]
    return [p[i] / s for i in range(kpool)]


def pool(key: np.ndarray, gate: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Pooled values of the entries `members`.

    Parameters
    ----------
    key, gate : arrays of float32 and int8, shape (n_slots, n_embd)
    members : array of int64, shape (n, kpool)
        The member slots of each entry.

    Returns
    -------
    array of float32, shape (n, n_embd)
        Per dimension `sum_i w_i * key[members[e, i]]`, accumulated in member order.
    """
    n, kpool = members.shape
    out = np.zeros((n, key.shape[1]), dtype=np.float32)
    if n == 0:
        return out
    w = _weights(gate[members])
    for i in range(kpool):
        out = out + w[i] * key[members[:, i]]
    return out


def scatter_fresh(key: np.ndarray, gate: np.ndarray, pooled: np.ndarray,
                  pool_of: np.ndarray, pool_gen: np.ndarray, gen: int, members: np.ndarray,
                  reps: np.ndarray, keep: np.ndarray, st: np.ndarray, src: np.ndarray,
                  vals: np.ndarray) -> np.ndarray:
    """`kernels.scatter_fresh`: the entries' values (their rep slots' where kept, else
    pooled), then each group's row written with its last entry's value and pooling;
    which rows' bits changed."""
    vals[keep] = pooled[reps[keep]]
    vals[~keep] = pool(key, gate, members[~keep])
    before = pooled[st].view(np.uint32).copy()
    pooled[st] = vals[src]
    pool_of[st] = members[src]
    pool_gen[st] = gen
    return np.any(pooled[st].view(np.uint32) != before, axis=1)


def scatter_singles(slot_of: np.ndarray, slot_row: np.ndarray, n_handed: int,
                    key: np.ndarray, gate: np.ndarray, pooled: np.ndarray,
                    pool_of: np.ndarray, pool_gen: np.ndarray, key_gen: np.ndarray, gen: int,
                    entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
                    rows: np.ndarray, entry_pool: np.ndarray, pool_start: np.ndarray,
                    n_ubatch: int, pooled_kind: int, padding_kind: int, w_kind: np.ndarray,
                    w_ubatch: np.ndarray, w_a: np.ndarray, w_b: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, int] | None:
    """kernels.scatter_singles: this module's `kept`, `scatter_fresh` and
    `stamp_winners` of race groups of one entry each, in turn, after the kernel's
    checks group by group (None, nothing written, at a group whose row has no slot)."""
    n, n_rows = rep.size, slot_of.size
    room = min(key.shape[0], gate.shape[0], pooled.shape[0], pool_of.shape[0], pool_gen.size,
               key_gen.size, slot_row.size, w_kind.size, w_ubatch.size, w_a.size, w_b.size)
    if order.size != n or rows.size != n or n_handed > room or pool_start.size == 0:
        raise group_refusal(0, NOT_RACE_GROUPS)
    for g, (e, r) in enumerate(zip(order.tolist(), rows.tolist(), strict=True)):
        if not 0 <= e < n or not 0 <= r < n_rows or not -1 <= entry_pool[e] < pool_start[-1]:
            raise group_refusal(g, OUTSIDE)
        if rep[e] != r or (g > 0 and r <= rows[g - 1]):
            raise group_refusal(g, NOT_RACE_GROUPS)
        st = int(slot_of[r])
        if st == 0:
            return None
        m = entry_rows[e]
        if (not 1 <= st < n_handed or slot_row[st] != r or (m < 0).any()
                or (m >= n_rows).any() or (slot_of[m] >= n_handed).any()
                or (slot_of[m] < 0).any()):
            raise group_refusal(g, OUTSIDE)
    s = slot_of[rows].astype(np.int64)
    members = slot_of[entry_rows[order]].astype(np.int64)
    keep = kept(pool_of, pool_gen, key_gen, members, s)
    fresh = np.flatnonzero(~keep)
    vals = np.empty((fresh.size, pooled.shape[1]), dtype=np.float32)
    wrote_new = scatter_fresh(key, gate, pooled, pool_of, pool_gen, gen,
                              np.ascontiguousarray(members[fresh]), s[fresh],
                              np.zeros(fresh.size, dtype=bool), s[fresh],
                              np.arange(fresh.size), vals)
    stamp_winners(order, np.arange(n + 1), entry_pool, pool_start, s, n_ubatch, pooled_kind,
                  padding_kind, w_kind, w_ubatch, w_a, w_b)
    return s, fresh[wrote_new], int(np.count_nonzero(keep))


def gather(pooled: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`pooled[rows]`: array of float32, shape (m, n_embd)."""
    return pooled[rows]


def pools_differ(key: np.ndarray, gate: np.ndarray, pooled: np.ndarray, pool_of: np.ndarray,
                 pool_gen: np.ndarray, key_gen: np.ndarray, members: np.ndarray,
                 rows: np.ndarray) -> np.ndarray:
    """Whether row `rows[e]` of `pooled` differs from the pooling of `members[e]`, every
    entry pooled again: the oracle of the numba twin, which skips the entries whose
    generations (`pool_of`, `pool_gen`, `key_gen`) say they hold their pooling; this
    twin takes them and reads none.

    Returns
    -------
    array of bool, shape (n,)
    """
    if rows.size == 0:
        return np.zeros(0, dtype=bool)
    return np.any(pooled[rows] != pool(key, gate, members), axis=1)


def rows_differ(slot_of: np.ndarray, n_handed: int, key: np.ndarray, gate: np.ndarray,
                pooled: np.ndarray, pool_of: np.ndarray, pool_gen: np.ndarray,
                key_gen: np.ndarray, members: np.ndarray, reps: np.ndarray
                ) -> np.ndarray | None:
    """kernels.rows_differ: the rows' slots looked up and checked, then this module's
    `pools_differ`; None when a row or its slot is outside its array."""
    n_rows = slot_of.size
    if ((members < 0) | (members >= n_rows)).any() or ((reps < 0) | (reps >= n_rows)).any():
        return None
    ms, rs = slot_of[members].astype(np.int64), slot_of[reps].astype(np.int64)
    if ((ms < 0) | (ms >= n_handed)).any() or ((rs < 0) | (rs >= n_handed)).any():
        return None
    return pools_differ(key, gate, pooled, pool_of, pool_gen, key_gen, ms, rs)


def kept(pool_of: np.ndarray, pool_gen: np.ndarray, key_gen: np.ndarray, members: np.ndarray,
         reps: np.ndarray) -> np.ndarray:
    """Whether rep slot `reps[e]` holds the pooling of the member slots `members[e]`,
    none of them written since: array of bool, shape (n,)."""
    gen = pool_gen[reps]
    keep = (gen > 0) & rows_equal(pool_of[reps], members)
    keep[keep] &= rows_max(key_gen[members[keep]]) < gen[keep]
    return keep


def fresh_groups(slot_of: np.ndarray, pool_of: np.ndarray, pool_gen: np.ndarray,
                 key_gen: np.ndarray, entry_rows: np.ndarray, rep: np.ndarray,
                 order: np.ndarray, starts: np.ndarray, rows: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """`kept` of every entry by its rows (`slot_of`), per race group
    order[starts[g]:starts[g + 1]] writing rows[g]: (fresh: a group with an entry not
    kept, keep: each entry of a group kept, the entries kept, in_fresh: each entry of
    a fresh group). Refuses the first group
    with an entry, row or slot outside its array (IndexError), or else that is not a
    race group of `rep` (ValueError): `guards.group_refusal`."""
    n, n_rows, n_groups = rep.size, slot_of.size, rows.size
    if starts.size != n_groups + 1 or (n_groups == 0 and n > 0):
        raise group_refusal(0, NOT_RACE_GROUPS)
    n_slots = min(pool_gen.size, key_gen.size, pool_of.shape[0])
    a, b = starts[:n_groups], starts[1:]
    outside = (a < 0) | (b > n) | (a > b)
    sizes = np.where(outside, 0, b - a)
    ends = np.cumsum(sizes)
    group = np.repeat(np.arange(n_groups), sizes)
    e = order[np.repeat(a - (ends - sizes), sizes) + np.arange(group.size)]
    # each entry of a group, its rows and their slots, inside its array
    e_ok = (e >= 0) & (e < n)
    entry = np.concatenate((rep[:, None], entry_rows), axis=1)[e[e_ok]]
    r_ok = ((entry >= 0) & (entry < n_rows)).all(axis=1)
    slots = slot_of[entry[r_ok]].astype(np.int64)
    s_ok = ((slots >= 0) & (slots < n_slots)).all(axis=1)
    ok = e_ok.copy()
    ok[e_ok] = r_ok
    ok[np.flatnonzero(e_ok)[r_ok]] = s_ok
    outside[group[~ok]] = True
    # race groups: non-empty, end to end, rows ascending, each entry writing its row
    ungrouped = a == b
    if n_groups:
        ungrouped[0] |= a[0] != 0
        ungrouped[-1] |= b[-1] != n
        ungrouped[1:] |= rows[1:] <= rows[:-1]
    e_in = np.clip(e, 0, max(n - 1, 0))
    ungrouped[group[e_ok & (rep[e_in] != rows[group])]] = True
    bad = outside | ungrouped
    if bad.any():
        g = int(np.argmax(bad))
        raise group_refusal(g, OUTSIDE if outside[g] else NOT_RACE_GROUPS)
    kept_e = kept(pool_of, pool_gen, key_gen, np.ascontiguousarray(slots[:, 1:]), slots[:, 0])
    fresh = np.zeros(n_groups, dtype=bool)
    np.logical_or.at(fresh, group, ~kept_e)
    keep = np.zeros(n, dtype=bool)
    keep[e] = kept_e  # an entry listed twice is kept or not alike
    in_fresh = np.zeros(n, dtype=bool)
    in_fresh[e] = fresh[group]
    return fresh, keep, int(np.count_nonzero(kept_e)), in_fresh


def stamp_winners(order: np.ndarray, starts: np.ndarray, entry_pool: np.ndarray,
                  pool_start: np.ndarray, slots: np.ndarray, n_ubatch: int, pooled: int,
                  padding: int, w_kind: np.ndarray, w_ubatch: np.ndarray, w_a: np.ndarray,
                  w_b: np.ndarray) -> None:
    """kernels.stamp_winners: each race group's last entry, stamped in its row's slot
    as its writer (`pooled` with its pool's seq and k by `pool_start`, or `padding`
    with -1, -1), at ubatch `n_ubatch`; refuses as the kernel does, before the first
    write."""
    n, n_groups = order.size, slots.size
    n_slots = min(w_kind.size, w_ubatch.size, w_a.size, w_b.size)
    if starts.size != n_groups + 1 or pool_start.size == 0:
        raise group_refusal(0, NOT_RACE_GROUPS)
    b = starts[1:]
    bad = (b < 1) | (b > n)
    e = np.where(bad, -1, order[np.clip(b - 1, 0, max(n - 1, 0))] if n else -1)
    bad |= (e < 0) | (e >= entry_pool.size)
    p = np.where(bad, 0, entry_pool[np.clip(e, 0, max(entry_pool.size - 1, 0))]
                 if entry_pool.size else 0)
    bad |= (p >= pool_start[-1]) | (slots < 1) | (slots >= n_slots)
    if bad.any():
        raise group_refusal(int(np.argmax(bad)), OUTSIDE)
    real = p >= 0
    seq = np.searchsorted(pool_start, p[real], side="right") - 1
    w_ubatch[slots] = n_ubatch
    w_kind[slots[~real]], w_a[slots[~real]], w_b[slots[~real]] = padding, -1, -1
    w_kind[slots[real]], w_a[slots[real]] = pooled, seq
    w_b[slots[real]] = p[real] - pool_start[seq]


def dirty_pools(keys: np.ndarray, starts: np.ndarray, kpool: int, dirty: np.ndarray
                ) -> np.ndarray:
    """The pools (indices into `starts`) one of whose members' cells is `dirty`:
    ascending, distinct. `keys[starts[k]:+kpool]` are pool k's members."""
    j = starts[:, None] + np.arange(kpool)
    bad = (starts < 0) | (starts > keys.size - kpool)
    cells = np.zeros(j.shape, dtype=np.int64)
    cells[~bad] = keys[j[~bad]] & CELL_MASK
    bad |= (cells >= dirty.size).any(axis=1)
    if bad.any():  # what the kernel refuses (it stops at a pool's first dirty member)
        raise IndexError(f"pool {int(np.argmax(bad))}: a member pair or cell outside the "
                         "arrays")
    return np.flatnonzero(dirty[cells].any(axis=1)).astype(np.int64)


def pools_of_pairs(keys: np.ndarray, starts: np.ndarray, kpool: int, members: np.ndarray,
                   reps: np.ndarray) -> np.ndarray | None:
    """The pools with one of the pairs `members` among their members, or one of `reps`
    as their rep: ascending, distinct; None when a pair asked for is not in `keys`."""
    found = []
    for wanted, rep_only in ((members, False), (reps, True)):
        j = np.searchsorted(keys, wanted)
        if wanted.size and (j.max() >= keys.size or (keys[j] != wanted).any()):
            return None
        if starts.size == 0:
            continue
        k = np.searchsorted(starts, j, side="right") - 1
        last = starts[np.maximum(k, 0)] + kpool - 1
        ok = (k >= 0) & ((j == last) if rep_only else (j <= last))
        found.append(k[ok])
    return unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)


def held_pairs(cells: np.ndarray, has: np.ndarray, pos: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per column of `has`, the pairs of the cells `cells` it holds, in the order of
    `cells`: column c's are pairs[off[c]:off[c + 1]]."""
    outside = np.flatnonzero((cells < 0) | (cells >= has.shape[1]))
    if outside.size:
        k = int(outside[0])
        raise IndexError(f"cells[{k}] is cell {cells[k]}, outside the stream")
    col, i = np.nonzero(has[:, cells])  # column by column, each in the order of cells
    off = np.concatenate(([0], np.cumsum(np.bincount(col, minlength=has.shape[0]))))
    held = cells[i]
    return off.astype(np.int64), make_keys(pos[held], held)


def recheck_ways(start: np.ndarray, n_bad: np.ndarray, kept: np.ndarray, known: np.ndarray,
                 rep_pos: np.ndarray, rep_rows: np.ndarray, kv_size: int, dirty: bool,
                 too_many: bool, cells: np.ndarray, pos: np.ndarray, least: int
                 ) -> tuple[np.ndarray, np.ndarray, bool]:
    """How each sequence finds its pools to recheck, its kept tail (recheck.py's rule,
    vectorised over the sequences), and whether the least changed pair (of `least` and
    `cells`' pairs, `least_pair`) lies at or before some tail."""
    least = min(least, least_pair(cells, pos))
    n_pools = np.diff(start)
    how = np.where((kept < n_bad) | (n_bad < n_pools), NEW, NONE).astype(np.int64)
    tail = np.full(kept.size, NO_TAIL, dtype=np.int64)
    if dirty:
        look = known & (kept > 0)
        scan = (n_pools > 0) & ~known
        if too_many:
            scan |= look
        elif look.any():
            last = (start[:-1] + kept - 1)[look]
            outside = (last < 0) | (last >= min(rep_pos.size, rep_rows.size))
            if outside.any():
                s = int(np.flatnonzero(look)[np.argmax(outside)])
                raise IndexError(f"sequence {s}: its last kept pool is outside the layout's "
                                 "columns")
            tail[look] = (rep_pos[last] << CELL_BITS) | (rep_rows[last] % kv_size)
        how[scan] = SCAN
    before = bool(((tail != NO_TAIL) & (least <= tail)).any())
    return how, tail, before


def recheck_one(start: np.ndarray, n_bad: np.ndarray, kept: np.ndarray, known: np.ndarray,
                rep_pos: np.ndarray, rep_rows: np.ndarray, kv_size: int, dirty: bool,
                too_many: bool, cells: np.ndarray, pos: np.ndarray, keys: np.ndarray,
                pools: np.ndarray, row0: int, slot_of: np.ndarray, n_handed: int,
                key: np.ndarray, gate: np.ndarray, pooled: np.ndarray, pool_of: np.ndarray,
                pool_gen: np.ndarray, key_gen: np.ndarray
                ) -> tuple[int, np.ndarray] | None:
    """kernels.recheck_one: this module's `recheck_ways` of the one sequence, then for
    `NEW` its `rows_differ` of the pools past the kept ones; None where either refuses
    (or asks for a look-up or a scan)."""
    try:
        how, _tail, before = recheck_ways(start, n_bad, kept, known, rep_pos, rep_rows,
                                          kv_size, dirty, too_many, cells, pos, NO_PAIR)
    except IndexError:
        return None
    way = int(how[0])
    if before or way not in (NONE, NEW):
        return None
    if way == NONE:
        return way, np.zeros(0, dtype=np.bool_)
    ks = np.arange(kept[0], start[1] - start[0], dtype=np.int64)  # the pools past the kept
    kpool = pool_of.shape[1]
    if ks.size and int(ks[-1]) >= min(pools.size, rep_rows.size):
        return None
    j0 = pools[ks]
    if ((j0 < 0) | (j0 > keys.size - kpool)).any():
        return None
    members = row0 + (keys[j0[:, None] + np.arange(kpool)] & CELL_MASK)
    verdicts = rows_differ(slot_of, n_handed, key, gate, pooled, pool_of, pool_gen, key_gen,
                           members, rep_rows[ks])
    return None if verdicts is None else (way, verdicts)



def recheck_many(start: np.ndarray, n_bad: np.ndarray, kept: np.ndarray, known: np.ndarray,
                 rep_pos: np.ndarray, rep_rows: np.ndarray, kv_size: int, dirty: bool,
                 too_many: bool, cells: np.ndarray, pos: np.ndarray, has: np.ndarray,
                 ids: np.ndarray, keys: np.ndarray, n_keys: np.ndarray, pools: np.ndarray,
                 reps: np.ndarray, strm: np.ndarray, slot_of: np.ndarray, n_handed: int,
                 key: np.ndarray, gate: np.ndarray, pooled: np.ndarray, pool_of: np.ndarray,
                 pool_gen: np.ndarray, key_gen: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """kernels.recheck_many: this module's `recheck_ways` of every sequence, the lowest
    changed pair each holds (as `Verifier`'s `_DirtyPairs.lowest` pairs them), then its
    `rows_differ` of the NEW sequences' pools past their kept ones, their rows read in
    the flat columns; None where the numba twin refuses (a scan, a look-up, a sequence
    that kept more pools than it holds, an index outside its array)."""
    try:
        how, tail, before = recheck_ways(start, n_bad, kept, known, rep_pos, rep_rows,
                                         kv_size, dirty, too_many, cells, pos, NO_PAIR)
    except IndexError:
        return None
    n_pools = np.diff(start)
    if ((how != NEW) & (how != NONE)).any() or (kept < 0).any() or (kept > n_pools).any():
        return None
    if before:
        if has.shape[1] < pos.size or has.shape[0] > ids.size:
            return None
        col_ids = ids[:has.shape[0]]
        if ((col_ids < 0) | (col_ids >= kept.size)).any():
            return None
        low = np.full(kept.size, NO_PAIR, dtype=np.int64)
        if cells.size:
            pairs = make_keys(pos[cells], cells)
            np.minimum.at(low, col_ids, np.where(has[:, cells], pairs, NO_PAIR).min(axis=1))
        if ((tail != NO_TAIL) & (low <= tail)).any():
            return None
    seqs = np.flatnonzero(how == NEW)
    counts = (n_pools - kept)[seqs]
    seq, k = np.repeat(seqs, counts), ranges(kept[seqs], counts)
    kpool = pool_of.shape[1]
    if seqs.size and (int(seqs[-1]) >= min(keys.shape[0], n_keys.size, pools.shape[0],
                                           reps.shape[0], strm.size)
                      or (n_keys[seqs] > keys.shape[1]).any()):
        return None
    if seq.size:
        if int(k.max()) >= min(pools.shape[1], reps.shape[1]):
            return None
        j0 = pools[seq, k]
        if ((j0 < 0) | (j0 > n_keys[seq] - kpool)).any():
            return None
    else:
        j0 = seq
    members = (strm[seq][:, None] * kv_size
               + (keys[seq[:, None], j0[:, None] + np.arange(kpool)] & CELL_MASK))
    verdicts = rows_differ(slot_of, n_handed, key, gate, pooled, pool_of, pool_gen, key_gen,
                           np.ascontiguousarray(members, dtype=np.int64), reps[seq, k])
    return None if verdicts is None else (how, verdicts)


def one_step(state: np.uint64, rows: np.ndarray, key_ids: np.ndarray, slot_of: np.ndarray,
             free: np.ndarray, n_handed: int, pristine: int, gen: int, n_ubatch: int,
             decode_kind: int, key: np.ndarray, gate: np.ndarray, pooled: np.ndarray,
             slot_row: np.ndarray, key_gen: np.ndarray, pool_gen: np.ndarray,
             pool_of: np.ndarray, w_kind: np.ndarray, w_ubatch: np.ndarray, w_a: np.ndarray,
             w_b: np.ndarray, entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
             grows: np.ndarray, entry_pool: np.ndarray, pool_start: np.ndarray,
             pooled_kind: int, padding_kind: int, start: np.ndarray, n_bad: np.ndarray,
             kept: np.ndarray, known: np.ndarray, rep_pos: np.ndarray, rep_rows: np.ndarray,
             kv_size: int, lookup_max: int, dirty_before: np.ndarray, pos: np.ndarray,
             keys: np.ndarray, pools: np.ndarray, row0: int, scatter: bool = True
             ) -> tuple | None:
    """kernels.one_step: this module's `write_rows`, `scatter_singles` (when `scatter`)
    and `recheck_one` in turn, the first that hands back or refuses ending the pass."""
    n = rows.size
    if n > ONE_STEP_MAX_ROWS:
        return None
    no = np.empty(0, dtype=np.int64)
    if unique(rows).size != n:
        return WROTE_NOTHING, NOT_DISTINCT, 0, no, no, 0, NONE, np.zeros(0, dtype=np.bool_)
    out = np.empty(n, dtype=np.int64)
    why, at = write_rows(state, rows, key_ids, slot_of, free, n_handed, pristine, gen,
                         n_ubatch, decode_kind, key, gate, pooled, slot_row, key_gen,
                         pool_gen, w_kind, w_ubatch, w_a, w_b, out)
    if why != WROTE:
        return WROTE_NOTHING, why, at, no, no, 0, NONE, np.zeros(0, dtype=np.bool_)
    handed = n_handed + at - min(at, free.size)
    got: tuple | None = (no, no, 0)
    if scatter:
        try:
            got = scatter_singles(slot_of, slot_row, handed, key, gate, pooled, pool_of,
                                  pool_gen, key_gen, gen + 1, entry_rows, rep, order, grows,
                                  entry_pool, pool_start, n_ubatch, pooled_kind,
                                  padding_kind, w_kind, w_ubatch, w_a, w_b)
        except (IndexError, ValueError):
            got = None
    if got is None:
        return ROWS_WRITTEN, why, at, no, no, 0, NONE, np.zeros(0, dtype=np.bool_)
    s, changed, n_kept = got
    cells = np.concatenate((dirty_before, rows, rows, grows[changed]))
    way = recheck_one(start, n_bad, kept, known, rep_pos, rep_rows, kv_size, True,
                      cells.size > lookup_max, cells, pos, keys, pools, row0, slot_of, handed,
                      key, gate, pooled, pool_of, pool_gen, key_gen)
    if way is None:
        return SCATTERED, why, at, s, changed, n_kept, NONE, np.zeros(0, dtype=np.bool_)
    return (RECHECKED, why, at, s, changed, n_kept, *way)


def least_pair(cells: np.ndarray, pos: np.ndarray) -> int:
    """The least pair `pos << CELL_BITS | cell` of the cells `cells` of a stream whose
    cells have the positions `pos` (INT64_MAX for no cell)."""
    outside = np.flatnonzero((cells < 0) | (cells >= pos.size))
    if outside.size:
        k = int(outside[0])
        raise IndexError(f"cells[{k}] is cell {cells[k]}, outside the stream")
    return int(make_keys(pos[cells], cells).min()) if cells.size else NO_PAIR
