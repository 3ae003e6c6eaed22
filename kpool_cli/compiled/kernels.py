"""The compiled core's numba kernels: the per-ubatch steps of the cache model and the
engine over flat arrays: the reference core's own (cache/cells.py's streams) and the
compiled core's arenas of every sequence's index and layout columns
(compiled/arena.py).

Owns: every kernel of the compiled core. Each is the loop that one reference step
runs as a chain of numpy calls, written once as a plain loop; the rule it computes
is the reference's, cited where that lives. Kernels never allocate (they write into
arrays and scratch the caller sized, most in a Python function here of the kernel's
public name, and return counts or views of them) and
never raise: a case a kernel does not handle is one its caller never hands it. A
cached kernel that allocated (`np.empty` inside) would import numba's array library
as it loads, about 40 ms of every compiled replay
(tests/test_startup.py `test_a_compiled_replay_loads_no_array_library`).

Keys are `pos << 32 | cell` (cache/cells.py `make_keys`); POS_CLEAN and EMPTY_POS
are passed in, never redefined here.
"""

from __future__ import annotations

import numpy as np

from ..jit import inner, kernel

_CELL_BITS = 32
_CELL_MASK = (1 << 32) - 1

# The kernels write plain loops where numba's own array methods would compile its
# string formatting (for their error messages) into the kernel: a slice assignment,
# `min`, `searchsorted`. That machinery took 6 s of a first run's compile.


def _bisect(a, x, right):  # pragma: no cover - compiled
    """np.searchsorted(a, x, side="right" if right else "left") for a sorted array."""
    lo, hi = 0, a.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x or (right and a[mid] == x):
            lo = mid + 1
        else:
            hi = mid
    return lo


_bisect_in = inner(_bisect)


def _stable_order(v, a, b):  # pragma: no cover - compiled
    """The stable argsort of int64 `v` (equal values keep their order), in scratch `a`
    or `b` (each of v.size at least): returns the one that holds it, cut to v.size.
    A bottom-up merge sort, written here so that no kernel compiles numba's own sorts
    (the slowest part of a first compile)."""
    n = v.size
    for i in range(n):
        a[i] = i
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, w = lo, mid, lo
            while i < mid and j < hi:
                if v[a[j]] < v[a[i]]:
                    b[w] = a[j]
                    j += 1
                else:
                    b[w] = a[i]
                    i += 1
                w += 1
            while i < mid:
                b[w] = a[i]
                i += 1
                w += 1
            while j < hi:
                b[w] = a[j]
                j += 1
                w += 1
        a, b = b, a
        width *= 2
    return a[:n]


_stable_order_in = inner(_stable_order, views=True)


def _sorted(v, scratch):  # pragma: no cover - compiled
    """`v` sorted ascending, in scratch[:v.size] (scratch: 3 * v.size at least), which
    it returns; an already sorted `v` (a decode's keys, most often) costs one pass."""
    n = v.size
    out = scratch[:n]
    for i in range(1, n):
        if v[i] < v[i - 1]:
            order = _stable_order_in(v, scratch[n:2 * n], scratch[2 * n:3 * n])
            for j in range(n):
                out[j] = v[order[j]]
            return out
    for j in range(n):
        out[j] = v[j]
    return out


_sorted_in = inner(_sorted, views=True)


@kernel
def find_slot(pos, head, n, taken, out):  # pragma: no cover - compiled
    """cache/kv.py `KvCache._find_slot` after its head reset: the first n empty cells
    (pos == -1) from `head` to the end, then from 0 to `head`, skipping the sorted
    cells `taken`; written to out[:k]. Returns k (< n: no room)."""
    size = pos.size
    k = 0
    for part in range(2):
        lo = head if part == 0 else 0
        hi = size if part == 0 else head
        t = _bisect_in(taken, lo, False)
        c = lo
        while c < hi and k < n:
            if pos[c] == -1:
                while t < taken.size and taken[t] < c:
                    t += 1
                if t >= taken.size or taken[t] != c:
                    out[k] = c
                    k += 1
            c += 1
    return k


@kernel
def write_cells(cells, pos, ext, has_ext, tok_ptr, tok_cols, key_ids,
                st_pos, st_ext, has, seq_count, key_id):  # pragma: no cover - compiled
    """cache/cells.py `Stream.write` without its index: each cell gets its token's pos,
    ext, sequences (columns tok_cols[tok_ptr[i]:tok_ptr[i + 1]]) and key id."""
    for i in range(cells.size):
        c = cells[i]
        st_pos[c] = pos[i]
        if has_ext:
            st_ext[c, 0] = ext[i, 0]
            st_ext[c, 1] = ext[i, 1]
        for j in range(tok_ptr[i], tok_ptr[i + 1]):
            has[tok_cols[j], c] = True
        seq_count[c] = tok_ptr[i + 1] - tok_ptr[i]
        key_id[c] = key_ids[i]


def _sorted_add(a, n, keys, scratch):  # pragma: no cover - compiled
    """cache/cells.py `SortedKeys.add` into a[:n] (capacity reserved for every key):
    keys (not present yet) sorted in, a[:n] staying sorted (scratch: 3 * keys.size at
    least). Returns the new n."""
    ks = _sorted_in(keys, scratch)
    m = ks.size
    if m == 0:
        return n
    if n == 0 or ks[0] > a[n - 1]:
        for t in range(m):  # element by element: a slice assignment compiles numba's
            a[n + t] = ks[t]  # string formatting for its shape error (4 s of a first run)
        return n + m
    # merge from the back, in place
    i, j, w = n - 1, m - 1, n + m - 1
    while j >= 0:
        if i >= 0 and a[i] > ks[j]:
            a[w] = a[i]
            i -= 1
        else:
            a[w] = ks[j]
            j -= 1
        w -= 1
    return n + m


_sorted_add_k = kernel(_sorted_add, "_sorted_add_k")
_sorted_add_in = inner(_sorted_add)  # for the kernels that add keys


def sorted_add(a: np.ndarray, n: int, keys: np.ndarray) -> int:
    """`_sorted_add`, its scratch sized here."""
    return _sorted_add_k(a, n, keys, np.empty(3 * keys.size, dtype=np.int64))


def _write_cell(cells, pos, ext, has_ext, col, key_ids, st_pos, st_ext, has, seq_count,
                key_id, i):  # pragma: no cover - compiled
    """cache/cells.py `Stream.write` of token i alone in sequence column `col`: its cell
    gets its pos, ext, the one sequence and its key id. Returns its pair (pos <<
    CELL_BITS | cell)."""
    c = cells[i]
    st_pos[c] = pos[i]
    if has_ext:
        st_ext[c, 0] = ext[i, 0]
        st_ext[c, 1] = ext[i, 1]
    has[col, c] = True
    seq_count[c] = 1
    key_id[c] = key_ids[i]
    return (np.int64(pos[i]) << _CELL_BITS) | c


_write_cell_in = inner(_write_cell)  # `_write_seq`'s and `write_slots`' cells


def _write_seq(cells, pos, ext, has_ext, col, key_ids, st_pos, st_ext, has, seq_count,
               key_id, index, n, scratch):  # pragma: no cover - compiled
    m = cells.size
    for i in range(m):
        if st_pos[cells[i]] != -1:
            return n, False, False, -1
    keys = scratch[:m]
    for i in range(m):
        keys[i] = _write_cell_in(cells, pos, ext, has_ext, col, key_ids, st_pos, st_ext, has,
                                 seq_count, key_id, i)
    past_end = True
    low = keys[0] if m else -1
    for i in range(m):
        if n > 0:
            past_end = past_end and keys[i] > index[n - 1]
        if keys[i] < low:
            low = keys[i]
    return _sorted_add_in(index, n, keys, scratch[m:]), past_end, True, low


_write_seq_k = kernel(_write_seq, "_write_seq_k")


def write_seq(cells: np.ndarray, pos: np.ndarray, ext: np.ndarray, has_ext: bool, col: int,
              key_ids: np.ndarray, st_pos: np.ndarray, st_ext: np.ndarray, has: np.ndarray,
              seq_count: np.ndarray, key_id: np.ndarray, index: np.ndarray, n: int
              ) -> tuple[int, bool, bool, int]:
    """cache/cells.py `Stream.write` of a ubatch whose every token holds the one
    sequence of column `col`, with its index (`SortedKeys.add` into index[:n],
    capacity reserved). Returns (new n, whether every new pair sorts past the old
    last one, whether every cell was empty: when not, nothing was written, the least
    new pair)."""
    return _write_seq_k(cells, pos, ext, has_ext, col, key_ids, st_pos, st_ext, has,
                        seq_count, key_id, index, n,
                        np.empty(4 * cells.size, dtype=np.int64))


@kernel
def seq_rm(index, n, lo, hi, col, has, seq_count, st_pos, st_ext, empty_pos, scratch
           ):  # pragma: no cover - compiled
    """cache/cells.py `Stream.seq_rm` of the sequence of column `col`, whose index is
    index[:n]: its keys index[lo:hi] cut (the keys past them moved down), their cells
    dropped from it, those it held alone made empty. `scratch` (int64, 4 * (hi - lo)):
    the cells cut, sorted, in scratch[:m], then the cells made empty, ascending.
    Returns the count of those."""
    m = hi - lo
    cut = scratch[3 * m:4 * m]
    for i in range(m):
        cut[i] = index[lo + i] & _CELL_MASK
    for i in range(hi, n):
        index[i - m] = index[i]
    order = _stable_order_in(cut, scratch[m:2 * m], scratch[2 * m:3 * m])
    cells = scratch[:m]
    for j in range(m):
        cells[j] = cut[order[j]]
    k = 0
    freed = scratch[m:2 * m]  # the order is read: its room is free again
    for j in range(m):
        c = cells[j]
        has[col, c] = False
        seq_count[c] -= 1
        if seq_count[c] == 0:
            freed[k] = c
            k += 1
    for j in range(k):  # `Stream._empty`
        c = freed[j]
        st_pos[c] = empty_pos
        st_ext[c, 0] = 0
        st_ext[c, 1] = 0
        for r in range(has.shape[0]):
            has[r, c] = False
    return k


def _scan_pools(keys, n_keys, j_next, pos_min, kpool, by_order, strm, kv_size, pools,
                rep_rows, rep_pos, first_pos, n_pools):  # pragma: no cover - compiled
    """ENGINE.md §5 step 4 over keys[:n_keys] from j_next, as engine/layout.py
    `scan_pools` (every candidate start is accepted), adding each pool's columns
    (`SeqLayout.add_pools`) past n_pools. Returns (n_pools, j_next)."""
    last = n_keys - kpool
    n_from = n_pools
    j = j_next
    if by_order:
        while j <= last:
            pools[n_pools] = j
            n_pools += 1
            j += kpool
        j_next = j
    elif last >= j_next:
        start_pool = -1
        for t in range(j_next, last + 1):
            p = keys[t] >> _CELL_BITS
            if (p - pos_min) % kpool != 0:
                continue
            ok = True
            for i in range(1, kpool):
                if (keys[t + i] >> _CELL_BITS) - (keys[t + i - 1] >> _CELL_BITS) != 1:
                    ok = False
                    break
            if ok:
                pools[n_pools] = t
                n_pools += 1
                start_pool = t
        j_next = max(start_pool + kpool if start_pool >= 0 else j_next, last + 1)
    for k in range(n_from, n_pools):
        j = pools[k]
        rep = keys[j + kpool - 1]
        rep_rows[k] = strm * kv_size + (rep & _CELL_MASK)
        rep_pos[k] = rep >> _CELL_BITS
        first_pos[k] = keys[j] >> _CELL_BITS
    return n_pools, j_next


_scan_pools_in = inner(_scan_pools)


def _share_scan(keys, n_kept, n_keys, seq_count):  # pragma: no cover - compiled
    """ENGINE.md §5 step 3 over keys[n_kept:n_keys]: (found a cell another sequence
    holds too, the cells scanned: up to that one). `seq_count` empty: the cache holds
    one sequence at most (compiled/layout.py `_counts`), so the scan reads every cell
    and finds none, without reading them."""
    if seq_count.size == 0:
        return False, n_keys - n_kept
    for q in range(n_kept, n_keys):
        if seq_count[keys[q] & _CELL_MASK] > 1:
            return True, q - n_kept + 1
    return False, n_keys - n_kept


_share_scan_in = inner(_share_scan)


@kernel
def last_pos(rows, lens, buf, out):  # pragma: no cover - compiled
    """cache/cells.py `Stream.seq_pos_maxes` of the sequences of arena rows `rows`
    (compiled/arena.py): out[i] the pos of row rows[i]'s last key, -1 for a row
    without one."""
    for i in range(rows.size):
        n = lens[rows[i]]
        out[i] = buf[rows[i], n - 1] >> _CELL_BITS if n else -1


@kernel
def write_slots(cells, pos, ext, has_ext, cols, key_ids, st_pos, st_ext, has, seq_count,
                key_id, buf, lens, keys, pushed):  # pragma: no cover - compiled
    """cache/cells.py `Stream.write` of a step of parallel slots (token i alone in
    sequence column cols[i], the columns distinct), then each token's key (keys[i])
    pushed onto its column's arena row (compiled/arena.py; `SortedKeys.push`):
    appended when it sorts after the row's last key (pushed[i]), else left for the
    caller to insert. Returns (0, the least key); or, having changed nothing, (1, 0)
    when a cell is not empty, (-(the row width needed), 0) when the arena is
    narrower."""
    m = cells.size
    need = 0
    for i in range(m):
        if st_pos[cells[i]] != -1:
            return 1, 0
        need = max(need, lens[cols[i]] + 1)
    if need > buf.shape[1]:
        return -need, 0
    low = 0
    for i in range(m):
        r = cols[i]
        key = _write_cell_in(cells, pos, ext, has_ext, r, key_ids, st_pos, st_ext, has,
                             seq_count, key_id, i)
        keys[i] = key
        if i == 0 or key < low:
            low = key
        n = lens[r]
        pushed[i] = n == 0 or key > buf[r, n - 1]
        if pushed[i]:
            buf[r, n] = key
            lens[r] = n + 1
    return 0, low


@kernel
def layout_step(sp, keys, n_keys, append, n_kept, j_next, pos_min, kpool, by_order,
                strm, kv_size, pools, rep_rows, rep_pos, first_pos, n_pools,
                seq_count, scan_sharing, shared):  # pragma: no cover - compiled
    """engine/layout.py `Layout.update` for one sequence: step 1's append (when
    `append`: the pairs of sp that sort after keys[n_keys - 1]); then, unless the
    count check of step 2 calls for a rebuild (returned as `rebuild`, the append's
    pairs counted in `scanned` but not copied, nothing more done: the caller
    rebuilds and calls again without `append`), step 3's sharing scan from pair
    n_kept (when `scan_sharing` and not yet `shared`) and step 4's pool scan from
    j_next (`_scan_pools`). Capacity for every pair of sp and every pool they can
    hold is reserved by the caller.

    Returns (n_keys, n_kept, j_next, n_pools, shared, scanned, rebuild)."""
    scanned = 0
    if append:
        n_kept = n_keys
        at = _bisect_in(sp, keys[n_keys - 1], True)
        scanned += sp.size - at
        if n_keys + sp.size - at != sp.size:  # the count is off: nothing is copied
            return n_keys, n_kept, j_next, n_pools, shared, scanned, True
        for q in range(at, sp.size):
            keys[n_keys] = sp[q]
            n_keys += 1
    j_next, n_pools, shared, got = _steps_3_4_in(
        keys, n_keys, n_kept, j_next, pos_min, kpool, by_order, strm, kv_size, pools,
        rep_rows, rep_pos, first_pos, n_pools, seq_count, scan_sharing, shared)
    return n_keys, n_kept, j_next, n_pools, shared, scanned + got, False


def _steps_3_4(keys, n_keys, n_kept, j_next, pos_min, kpool, by_order, strm, kv_size, pools,
               rep_rows, rep_pos, first_pos, n_pools, seq_count, scan_sharing, shared
               ):  # pragma: no cover - compiled
    """ENGINE.md §5 steps 3 and 4 of one sequence: the sharing scan from pair n_kept
    (when `scan_sharing` and not yet `shared`), the pool scan from j_next. Returns
    (j_next, n_pools, shared, scanned)."""
    scanned = 0
    if scan_sharing and not shared and n_keys > n_kept:
        shared, scanned = _share_scan_in(keys, n_kept, n_keys, seq_count)
    n_pools, j_next = _scan_pools_in(keys, n_keys, j_next, pos_min, kpool, by_order, strm,
                                     kv_size, pools, rep_rows, rep_pos, first_pos, n_pools)
    return j_next, n_pools, shared, scanned


_steps_3_4_in = inner(_steps_3_4)


@kernel
def layout_rebuild_step(sp, keys, n_keys, stale_key, known_below, pos_min, kpool, by_order,
                        strm, kv_size, pools, rep_rows, rep_pos, first_pos, n_pools,
                        seq_count, scan_sharing):  # pragma: no cover - compiled
    """engine/layout.py `Layout._rebuild` of a stale sequence whose pairs below its
    stale position (`stale_key`: that position's key) are its cache's, so the pools
    that end below it stay (ENGINE.md §5 step 2, the rebuild), then `layout_step`'s
    steps 3 and 4 without the append: the sharing scan from the first pair, the pool
    scan from the kept pools' end. The pairs below the stale position are compared
    with sp's unless it is at or below `known_below` (below which they are known to
    be); their count always is. Capacity for every pair of sp and every pool they can
    hold is reserved by the caller.

    Returns (n_keys, j_next, the pools the rebuild kept, n_pools, shared, scanned,
    done): done False, nothing written, where the full rebuild is due (no pair, no
    pair in sp, a first position that is not pos_min, or pairs that differ)."""
    if n_keys == 0 or sp.size == 0 or (sp[0] >> _CELL_BITS) != pos_min:
        return n_keys, 0, 0, n_pools, False, 0, False
    n = _bisect_in(keys[:n_keys], stale_key, False)
    if _bisect_in(sp, stale_key, False) != n:
        return n_keys, 0, 0, n_pools, False, 0, False
    if stale_key > known_below:
        for j in range(n):
            if keys[j] != sp[j]:
                return n_keys, 0, 0, n_pools, False, 0, False
    kept = _bisect_in(pools[:n_pools], n - kpool, True)
    j_next = pools[kept - 1] + kpool if kept else 0
    for j in range(n, sp.size):
        keys[j] = sp[j]
    j_next, n_all, shared, scanned = _steps_3_4_in(
        keys, sp.size, 0, j_next, pos_min, kpool, by_order, strm, kv_size, pools, rep_rows,
        rep_pos, first_pos, kept, seq_count, scan_sharing, False)
    return sp.size, j_next, kept, n_all, shared, scanned, True


@kernel
def layout_appends(seq, off, added, clean, equal, settled, take, keys, n_keys,
                   pools, n_pools, rep_rows, n_rep_rows, rep_pos, n_rep_pos, first_pos,
                   n_first_pos, j_next, pos_min, strm, shared, kpool, by_order, kv_size,
                   seq_count, scan_sharing, grew):  # pragma: no cover - compiled
    """`layout_step`'s append path for many sequences at once, over the layout's flat
    columns (compiled/arena.py: row s of each 2-D array is sequence s's, its length
    in the 1-D one after it). The last apply wrote only past the pairs of each
    seq[i]; it is taken (take[i]) when they equalled the cache's (`equal`), it is
    clean and settled and holds pairs: it appends added[off[i]:off[i + 1]], the
    pairs that apply wrote (so the count check of step 2 holds), then runs step 3's
    sharing scan from its old end (when `scan_sharing` and not yet shared) and step
    4's pool scan. grew[i]: its pools grew. Returns (the cells scanned, how many it
    took, how many grew), or, changing nothing, (-(the row width the taken
    sequences need), 0, 0) when the columns are narrower (the caller widens them and
    calls again)."""
    need = 0
    n_took = 0
    for i in range(seq.size):
        s = seq[i]
        take[i] = clean[s] and equal[s] and settled[s] and n_keys[s] > 0
        if take[i]:
            n_took += 1
            need = max(need, n_keys[s] + off[i + 1] - off[i])
    if need > keys.shape[1] or need // kpool + 1 > pools.shape[1]:
        return -need, 0, 0
    scanned = 0
    n_grew = 0
    for i in range(seq.size):
        grew[i] = False
        if not take[i]:
            continue
        s = seq[i]
        row = keys[s]
        n_kept = n_keys[s]
        n = n_kept
        for q in range(off[i], off[i + 1]):
            row[n] = added[q]
            n += 1
        n_keys[s] = n
        scanned += n - n_kept
        if scan_sharing and not shared[s] and n > n_kept:
            hit, got = _share_scan_in(row, n_kept, n, seq_count)
            shared[s] = hit
            scanned += got
        before = n_pools[s]
        after, j_next[s] = _scan_pools_in(row, n, j_next[s], pos_min[s], kpool, by_order,
                                          strm[s], kv_size, pools[s], rep_rows[s],
                                          rep_pos[s], first_pos[s], before)
        n_pools[s] = n_rep_rows[s] = n_rep_pos[s] = n_first_pos[s] = after
        grew[i] = after != before
        n_grew += grew[i]
    return scanned, n_took, n_grew


def _pool_of(keys, n_pools, first_pos, rep_pos, p, c, by_order, kpool):  # pragma: no cover
    """engine/marking.py `mark`, the pool (of its sequence) holding a token at pos p in
    cell c, or -1. By order, the token's rank among the pairs gives its pool (-2 when
    the token is not among them: the engine asserts); by position, the last pool
    whose first pos <= p, if p <= its rep pos."""
    if by_order:
        want = (p << _CELL_BITS) | c
        r = _bisect_in(keys, want, False)
        if r >= keys.size or keys[r] != want:
            return -2
        k = r // kpool
        return k if k < n_pools else -1
    k = _bisect_in(first_pos, p, True) - 1
    return k if k >= 0 and p <= rep_pos[k] else -1


_pool_of_in = inner(_pool_of)


@kernel
def pools_of_tokens(keys, pools_n, first_pos, rep_pos, pos, cells, by_order, kpool,
                    base, out):  # pragma: no cover - compiled
    """out[i] = base + the pool holding token i (`_pool_of`), -1 for none, -2 for a
    token not in a by-order layout."""
    for i in range(pos.size):
        k = _pool_of_in(keys, pools_n, first_pos, rep_pos, pos[i], cells[i], by_order,
                        kpool)
        out[i] = base + k if k >= 0 else k


@kernel
def pools_of_pairs_by_pos(first_pos, rep_pos, start, pair_seq, pair_pos, out
                          ):  # pragma: no cover - compiled
    """`_pool_of` by position for tokens of any sequences at once, over the
    whole-layout columns: `first_pos`, `rep_pos` [n_pool_real] in layout order,
    sequence s's pools at global indices start[s]..start[s + 1]. out[i] = the global
    pool of sequence pair_seq[i] holding pos pair_pos[i], or -1."""
    for i in range(pair_seq.size):
        s = pair_seq[i]
        lo, hi = start[s], start[s + 1]
        k = _pool_of_in(first_pos[:0], hi - lo, first_pos[lo:hi], rep_pos[lo:hi],
                        pair_pos[i], 0, False, 1)  # by position: no pair, no kpool read
        out[i] = lo + k if k >= 0 else -1


@kernel
def visible_by_pos(rep_pos, start, first, pos, out):  # pragma: no cover - compiled
    """engine/scatter.py `visible_pools` by position, for tokens of any sequences at
    once, over the whole-layout `rep_pos` (sequence s's pools at global indices
    start[s]..start[s + 1]): out[i] = how many pools of sequence first[i] have a rep
    pos <= pos[i]."""
    for i in range(first.size):
        s = first[i]
        out[i] = _bisect_in(rep_pos[start[s]:start[s + 1]], pos[i], True)


def _first_winners(cand, pool_cells, once_per_rep, seen, scratch):  # pragma: no cover
    """engine/marking.py `mark`: the first candidate per pool (cache-safe) or per rep
    row (rep-once, PR #29994) wins; returns the winners sorted (layout order), a view
    of `scratch` (4 * cand.size at least). `seen` is scratch indexed by a rep row or a
    pool, all False, and is left so."""
    c_n = cand.size
    win = scratch[:c_n]
    n = 0
    for c in cand:
        key = pool_cells[c] if once_per_rep else c
        if not seen[key]:
            seen[key] = True
            win[n] = c
            n += 1
    for i in range(n):
        c = win[i]
        seen[pool_cells[c] if once_per_rep else c] = False
    return _sorted_in(win[:n], scratch[c_n:])


_first_winners_k = kernel(_first_winners, "_first_winners_k")
_first_winners_in = inner(_first_winners, views=True)


def first_winners(cand: np.ndarray, pool_cells: np.ndarray, once_per_rep: bool,
                  seen: np.ndarray) -> np.ndarray:
    """`_first_winners`, its scratch sized here."""
    return _first_winners_k(cand, pool_cells, once_per_rep, seen,
                            np.empty(4 * cand.size, dtype=np.int64))


def _mark_one_sequence(keys, n_pools, first_pos, rep_pos, pos, cells, by_order, kpool,
                       base, stale, pool_cells, once_per_rep, seen, scratch
                       ):  # pragma: no cover - compiled
    m0 = stale.size + pos.size
    cand = scratch[:m0]
    m = 0
    for c in stale:
        cand[m] = c
        m += 1
    for i in range(pos.size):
        k = _pool_of_in(keys, n_pools, first_pos, rep_pos, pos[i], cells[i], by_order,
                        kpool)
        if k == -2:
            return cand[:0], False
        if k >= 0:
            cand[m] = base + k
            m += 1
    return _first_winners_in(cand[:m], pool_cells, once_per_rep, seen, scratch[m0:]), True


_mark_one_sequence_k = kernel(_mark_one_sequence, "_mark_one_sequence_k")
_mark_one_sequence_in = inner(_mark_one_sequence, views=True)


def mark_one_sequence(keys: np.ndarray, n_pools: int, first_pos: np.ndarray,
                      rep_pos: np.ndarray, pos: np.ndarray, cells: np.ndarray,
                      by_order: bool, kpool: int, base: int, stale: np.ndarray,
                      pool_cells: np.ndarray, once_per_rep: bool, seen: np.ndarray
                      ) -> tuple[np.ndarray, bool]:
    """engine/marking.py `mark` of a ubatch whose every token holds one sequence (its
    pools start at global pool `base`): the candidates are the stale pools `stale`,
    then each token's pool in token order (`_pool_of`); `_first_winners` decides.
    Returns (the marked pools, False when a token is not in a by-order layout)."""
    return _mark_one_sequence_k(keys, n_pools, first_pos, rep_pos, pos, cells, by_order,
                                kpool, base, stale, pool_cells, once_per_rep, seen,
                                np.empty(5 * (stale.size + pos.size), dtype=np.int64))


@kernel
def mark_plan_one_sequence(keys, pools, n_pools, first_pos, rep_pos, pos, cells, kpool,
                           base, stale, pool_cells, once_per_rep, seen, scratch, row_base,
                           g_floor, pad, rows, rep, entry_pool, visible
                           ):  # pragma: no cover - compiled
    """`_mark_one_sequence` by position, then engine/scatter.py `build_plan` (ENGINE.md
    §7) of its plan with padding rows of their own, in the same call: the marked pools'
    entries (pool, member rows `row_base` + each member's cell, rep row), then the
    padding entries up to the graph's size max(n_new, `g_floor`) (engine/marking.py
    `n_new_graph`), each on its row of `pad` (the smallest rows that are no pool's rep,
    `padding_rows`), and each token's visible pools (how many of the sequence's pools
    have a rep pos <= its pos). `keys`, `pools`, `first_pos`, `rep_pos`: the
    sequence's columns; `rows`, `rep`, `entry_pool` hold max(stale.size + pos.size,
    g_floor) entries, `visible` pos.size. Returns (the marked pools, the entries
    written); 0 entries when none was marked, another sequence's stale pool was, the
    first token's pos is not among the sequence's pairs, or `pad` is too short:
    `build_plan` then plans (and says what is wrong)."""
    marked, _ok = _mark_one_sequence_in(keys, n_pools, first_pos, rep_pos, pos, cells,
                                        False, kpool, base, stale, pool_cells,
                                        once_per_rep, seen, scratch)
    n_new = marked.size
    at = _bisect_in(keys, pos[0] << _CELL_BITS, False)  # build_plan's first-token check
    if n_new == 0 or at >= keys.size or (keys[at] >> _CELL_BITS) != pos[0]:
        return marked, 0
    n_g = max(n_new, g_floor)
    if n_g - n_new > pad.size:
        return marked, 0
    for e in range(n_new):
        c = marked[e]
        if c < base or c >= base + n_pools:  # another sequence's stale pool
            return marked, 0
        entry_pool[e] = c
        rep[e] = pool_cells[c]
        j = pools[c - base]
        for q in range(kpool):
            rows[e, q] = row_base + (keys[j + q] & _CELL_MASK)
    for e in range(n_new, n_g):
        r = pad[e - n_new]
        entry_pool[e] = -1
        rep[e] = r
        for q in range(kpool):
            rows[e, q] = r
    for i in range(pos.size):
        visible[i] = _bisect_in(rep_pos[:n_pools], pos[i], True)
    return marked, n_g


@kernel
def padding_rows(pool_cells, n_pad, n_rows, out, taken):  # pragma: no cover - compiled
    """engine/scatter.py `padding_rows`, not row-zero: the n_pad smallest rows that
    are no pool's rep (`taken`: all False, n_pad + pool_cells.size long, scratch).
    Returns how many were found below n_rows."""
    span = n_pad + pool_cells.size
    for r in pool_cells:
        if r < span:
            taken[r] = True
    k = 0
    for r in range(span):
        if k == n_pad:
            break
        if not taken[r]:
            if r >= n_rows:
                return k
            out[k] = r
            k += 1
    return k


@kernel
def carried_rows(old, before, kept, start, width, out):  # pragma: no cover - compiled
    """engine/layout.py `pool_members` built again after an update: each sequence j's
    first kept[j] pools, rows before[j].. of the columns built before, at their places
    now, rows start[j].. of out; `old` and `out` flat, `width` a row (one loop a
    sequence, which compiles to a copy). The other rows of out are left alone."""
    for j in range(kept.size):
        n, a, b = kept[j] * width, before[j] * width, start[j] * width
        # views, indexed from 0: numba then knows no index is negative, and the loop
        # is a copy (indexed from an offset, it wrapped each index: 4.5x the time)
        src, dst = old[a:a + n], out[b:b + n]
        for i in range(n):
            dst[i] = src[i]


@kernel
def seq_and_k(start, seq, k):  # pragma: no cover - compiled
    """engine/layout.py `pool_seq` and each pool's k within its sequence in one pass
    (`Layout._every_k`): pool i of sequence s, start[s] <= i < start[s + 1], has
    seq[i] = s and k[i] = i - start[s]."""
    for s in range(start.size - 1):
        a, n = start[s], start[s + 1] - start[s]
        sq, kk = seq[a:a + n], k[a:a + n]  # views indexed from 0 (`carried_rows`)
        for j in range(n):
            sq[j] = s
            kk[j] = j


@kernel
def members(keys, pools, start, strm, ips, kpool, kv_size, out):  # pragma: no cover
    """`SeqLayout.members` of any pools, over the layout's flat columns
    (compiled/arena.py: row s of `keys` and `pools` is sequence s's; its first pool
    has the global index start[s]): out[i] = the global rows of the members of the
    pool with the global index ips[i] (each below start[-1])."""
    for i in range(ips.size):
        s = _bisect_in(start, ips[i], True) - 1
        j = pools[s, ips[i] - start[s]]
        row = keys[s]
        base = strm[s] * kv_size
        for q in range(kpool):
            out[i, q] = base + (row[j + q] & _CELL_MASK)


@kernel
def joined_rows(buf, lens, out):  # pragma: no cover - compiled
    """Rows of `buf` end to end, each its first lens[s] values (out: their sum)."""
    q = 0
    for s in range(lens.size):
        row, n = buf[s], lens[s]
        dst = out[q:q + n]  # a view indexed from 0 (`carried_rows`): a copy
        for j in range(n):
            dst[j] = row[j]
        q += n


# race_groups' radix: rows sorted 11 bits a pass (2,048 buckets): two passes for any
# cache of up to 4M rows
_RADIX_BITS = 11
_RADIX_MASK = (1 << _RADIX_BITS) - 1
_SORTED_UP_TO = 64  # race groups of this many entries or fewer: a stable argsort


def _race_groups(rep, n_rows, order, spare, count, heads, rows, raced
                 ):  # pragma: no cover - compiled
    n = rep.size
    if n > _SORTED_UP_TO:  # the radix sort, `count` its digits' counts
        for i in range(n):
            order[i] = i
        shift = 0
        while True:
            for d in range(count.size):
                count[d] = 0
            for i in range(n):
                count[((rep[i] >> shift) & _RADIX_MASK) + 1] += 1
            for d in range(_RADIX_MASK + 1):
                count[d + 1] += count[d]
            for i in range(n):
                e = order[i]
                d = (rep[e] >> shift) & _RADIX_MASK
                spare[count[d]] = e
                count[d] += 1
            order, spare = spare, order
            shift += _RADIX_BITS
            if (n_rows - 1) >> shift <= 0:
                break
    else:
        order = _stable_order_in(rep, order, spare)
    g = 0
    for i in range(n):
        r = rep[order[i]]
        if i == 0 or r != rep[order[i - 1]]:
            heads[g] = i
            rows[g] = r
            g += 1
    heads[g] = n
    m = 0
    for h in range(g):
        if heads[h + 1] - heads[h] > 1:
            raced[m] = h
            m += 1
    return order, g, m


_race_groups_k = kernel(_race_groups, "_race_groups_k")


def race_groups(rep: np.ndarray, n_rows: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """engine/context.py `race_groups`: (order, starts, rows) of the entries grouped
    by the row they write (every row < n_rows), stably: a least-significant-digit
    radix sort by row (stable counting passes of 11 bits, as many as n_rows needs)
    when the entries are many, else a stable argsort. O(entries) a pass, whatever
    n_rows (a counting sort over every row would pay for all 262,144 of W2's cache
    each ubatch). Then, from the same pass, `groups_raced` of the starts: the groups
    of two or more entries."""
    n = rep.size
    if n <= _SORTED_UP_TO:  # a decode's few entries: one allocation, no radix counts
        buf = np.empty(5 * n + 1, dtype=np.int64)
        a, b, heads, rows, raced = (buf[:n], buf[n:2 * n], buf[2 * n:3 * n + 1],
                                    buf[3 * n + 1:4 * n + 1], buf[4 * n + 1:])
        count = buf[:0]
    else:
        a, b = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        heads = np.empty(n + 1, dtype=np.int64)
        rows = np.empty(n, dtype=np.int64)
        raced = np.empty(n, dtype=np.int64)
        count = np.empty(_RADIX_MASK + 2, dtype=np.int64)
    order, g, m = _race_groups_k(rep, n_rows, a, b, count, heads, rows, raced)
    if g == n:  # every row written once (a rep-once plan's): the arrays are whole
        return order, heads, rows, raced[:0].copy()
    return order, heads[:g + 1].copy(), rows[:g].copy(), raced[:m].copy()


def _copy_groups(old_order, old_starts, old_rows, remap, a, b, order, starts, rows, w, g
                 ):  # pragma: no cover - compiled
    """Old groups a..b-1, their entries at their new places (`remap`), written from
    group g and entry w on: returns (the next w, the next g)."""
    lo, n = old_starts[a], old_starts[b] - old_starts[a]
    # views indexed from 0 (`carried_rows`)
    s_out, r_out, s_in, r_in = starts[g:g + b - a], rows[g:g + b - a], old_starts[a:b], \
        old_rows[a:b]
    for h in range(b - a):
        s_out[h] = s_in[h] - lo + w
        r_out[h] = r_in[h]
    o_out, o_in = order[w:w + n], old_order[lo:lo + n]
    for i in range(n):
        o_out[i] = remap[o_in[i]]
    return w + n, g + b - a


_copy_groups_in = inner(_copy_groups)


@kernel
def grown_race_groups(old_order, old_starts, old_rows, last_raced, rep, before, kept, start,
                      remap, fresh, order, starts, rows):  # pragma: no cover - compiled
    """engine/context.py `race_groups` of a plan (rep rows `rep`) made of the plan
    before, whose groups were (old_order, old_starts, old_rows), the last of them of
    two entries or more `last_raced` (-1: none; its `raced`, which a scan back over
    the groups would cost 57 us of W2's 65,728), by entries
    appended: segment j (a sequence's pools) is entries start[j]..start[j + 1] - 1,
    of which the first kept[j] are the entries before[j]..before[j] + kept[j] - 1 of
    the plan before (every one of them: kept[j] = before[j + 1] - before[j]), with
    their rows, and the rest new. The old groups are copied at their entries' new
    places (still in entry order), a new entry joining the group of its row, in
    entry order, the others making groups of their own, in row order: the groups a
    sort of `rep` finds, without the sort. remap [entries before] and fresh (room
    for the new entries) are scratch; order, starts, rows are written as
    `race_groups` gives them (starts one longer). Returns (the groups, whether the
    raced groups, those of two entries or more, are those before at the same
    indices, with the same entries), or (-1, False) when an entry before was dropped
    or the new entries outnumber `fresh`: sort instead."""
    m_seg = kept.size
    n_fresh = 0
    for j in range(m_seg):
        if kept[j] != before[j + 1] - before[j]:
            return -1, False
        seg = remap[before[j]:before[j + 1]]  # a view indexed from 0 (`carried_rows`)
        for e in range(seg.size):
            seg[e] = start[j] + e
        for i in range(start[j] + kept[j], start[j + 1]):
            if n_fresh == fresh.size:
                return -1, False
            fresh[n_fresh] = i
            n_fresh += 1
    for x in range(1, n_fresh):  # by row, then entry (few: an insertion sort)
        e = fresh[x]
        y = x - 1
        while y >= 0 and rep[fresh[y]] > rep[e]:
            fresh[y + 1] = fresh[y]
            y -= 1
        fresh[y + 1] = e
    n_old = old_rows.size
    same = True
    g_in = g = w = f = 0
    while f < n_fresh:
        r = rep[fresh[f]]
        at = _bisect_in(old_rows, r, False)  # the first old group whose row >= r
        w, g = _copy_groups_in(old_order, old_starts, old_rows, remap, g_in, at, order,
                               starts, rows, w, g)
        g_in = at
        starts[g] = w
        rows[g] = r
        if at < n_old and old_rows[at] == r:  # the new entries join this old group
            i = old_starts[at]
            while i < old_starts[at + 1] or (f < n_fresh and rep[fresh[f]] == r):
                if i < old_starts[at + 1] and (f == n_fresh or rep[fresh[f]] != r
                                              or remap[old_order[i]] < fresh[f]):
                    order[w] = remap[old_order[i]]
                    i += 1
                else:
                    order[w] = fresh[f]
                    f += 1
                w += 1
            g_in = at + 1
            same = False
        else:  # a group of new entries alone
            while f < n_fresh and rep[fresh[f]] == r:
                order[w] = fresh[f]
                w += 1
                f += 1
            if w - starts[g] > 1 or at <= last_raced:
                same = False
        g += 1
    w, g = _copy_groups_in(old_order, old_starts, old_rows, remap, g_in, n_old, order,
                           starts, rows, w, g)
    starts[g] = w
    return g, same


@kernel
def raced_writers(order, starts, entry_pool, pool_start, pad_seq, pad_k, writers, group
                  ):  # pragma: no cover - compiled
    """engine/context.py `raced_writers`: into writers[:m] and group[:m] (`group` of the
    entries' size, `writers` as many rows), the [seq, k] of each entry of the race
    groups of two or more (`order[starts[g]:starts[g + 1]]`), in entry order (its
    global pool's sequence by `pool_start`, as `Layout.locate` finds it; pad_seq,
    pad_k for padding) and its group. Returns m. Each entry's sequence is the one
    before's when its pool lies in that one's range (a re-pool-all plan lists the
    pools in order), else a binary search."""
    for g in range(starts.size - 1):  # each entry's group; -1 for a group of one
        a, b = starts[g], starts[g + 1]
        if b - a < 2:
            group[order[a]] = -1
            continue
        for j in range(a, b):
            group[order[j]] = g
    m = 0
    s = 0
    for e in range(order.size):  # the raced ones, compacted in place (m <= e)
        g = group[e]
        if g < 0:
            continue
        group[m] = g
        p = entry_pool[e]
        if p < 0:
            writers[m, 0] = pad_seq
            writers[m, 1] = pad_k
        else:
            if p < pool_start[s] or p >= pool_start[s + 1]:
                s = _bisect_in(pool_start, p, True) - 1
            writers[m, 0] = s
            writers[m, 1] = p - pool_start[s]
        m += 1
    return m


@kernel
def first_difference(have, want):  # pragma: no cover - compiled
    """engine/layout.py `Layout.drift`: the first index where the two key arrays
    differ (min of their sizes when one is a prefix of the other), -1 if equal."""
    n = min(have.size, want.size)
    for j in range(n):
        if have[j] != want[j]:
            return j
    return -1 if have.size == want.size else n


def _evenly(rows, i):  # pragma: no cover - compiled
    """contracts/runs.py `arithmetic` of entry i: (its members step evenly, the step d;
    1 where kpool is 1)."""
    kpool = rows.shape[1]
    if kpool < 2:
        return True, 1
    d = rows[i, 1] - rows[i, 0]
    for j in range(2, kpool):
        if rows[i, j] - rows[i, j - 1] != d:
            return False, d
    return True, d


_evenly_in = inner(_evenly)


def _step_breaks(rows, i):  # pragma: no cover - compiled
    """contracts/runs.py `runs`: the link of entries i and i + 1 follows a linked pair
    with another step of the first member, so it starts no run."""
    return rows[i + 1, 0] - rows[i, 0] != rows[i, 0] - rows[i - 1, 0]


_step_breaks_in = inner(_step_breaks)


def _link_spans(rows, link, out):  # pragma: no cover - compiled
    """contracts/runs.py `runs`: the runs of linked entries (`link[i]` links i and
    i + 1) whose first member steps evenly, written to out as [a, b); returns how
    many. A link whose step differs from that of the linked pair before it (as
    linked before this rule) starts no run."""
    m = 0
    a = -1
    before = False  # link[i - 1], as given
    for i in range(link.size):
        on = link[i]
        if on and before and _step_breaks_in(rows, i):
            on = False
        before = link[i]
        if on:
            if a < 0:
                a = i
        elif a >= 0:
            out[m, 0] = a
            out[m, 1] = i + 1
            m += 1
            a = -1
    if a >= 0:
        out[m, 0] = a
        out[m, 1] = link.size + 1
        m += 1
    return m


_link_spans_in = inner(_link_spans)


def _scatter_regular(rows, rep, pad, i):  # pragma: no cover - compiled
    """contracts/runs.py `scatter_spans`: (entry i is regular: its members step evenly,
    its rep row is its last member and it is no padding; its member step)."""
    ok, d = _evenly_in(rows, i)
    return ok and rep[i] == rows[i, rows.shape[1] - 1] and not pad[i], d


_scatter_regular_in = inner(_scatter_regular)


def _pool_regular(cells, rep, first_pos, last_pos, i):  # pragma: no cover - compiled
    """contracts/runs.py `pool_spans`: (pool i is regular: its members step evenly, its
    rep row is its last member and its positions span kpool; its member step)."""
    kpool = cells.shape[1]
    ok, d = _evenly_in(cells, i)
    return (ok and rep[i] == cells[i, kpool - 1]
            and last_pos[i] == first_pos[i] + kpool - 1), d


_pool_regular_in = inner(_pool_regular)


def _pool_follows(seq, k, first_pos, new, kpool, i):  # pragma: no cover - compiled
    """contracts/runs.py `pool_spans`: pool i follows pool i - 1, as a link asks
    besides both being regular with one member step: the same sequence, the next
    k, the next kpool positions, the same `new`."""
    return (seq[i] == seq[i - 1] and k[i] == k[i - 1] + 1
            and first_pos[i] == first_pos[i - 1] + kpool and new[i] == new[i - 1])


_pool_follows_in = inner(_pool_follows)


@kernel
def scatter_spans(rows, rep, pad, link, out):  # pragma: no cover - compiled
    """contracts/runs.py `scatter_spans` in one pass: a regular entry
    (`_scatter_regular`) links to a regular next one with the same member step. link
    [n - 1] is scratch; out [n // 2, 2] gets the spans; returns how many."""
    n = rows.shape[0]
    if n < 2:
        return 0
    reg, d = _scatter_regular_in(rows, rep, pad, 0)
    for i in range(1, n):
        reg2, d2 = _scatter_regular_in(rows, rep, pad, i)
        link[i - 1] = reg and reg2 and d2 == d
        reg, d = reg2, d2
    return _link_spans_in(rows, link, out)


@kernel
def pool_spans(seq, k, first_pos, last_pos, cells, rep, new, link, out
               ):  # pragma: no cover - compiled
    """contracts/runs.py `pool_spans` in one pass: a regular pool (`_pool_regular`)
    links to a regular next one with the same member step that follows it
    (`_pool_follows`). link [n - 1] is scratch; out [n // 2, 2] gets the spans;
    returns how many."""
    n, kpool = cells.shape
    if n < 2:
        return 0
    reg, d = _pool_regular_in(cells, rep, first_pos, last_pos, 0)
    for i in range(1, n):
        reg2, d2 = _pool_regular_in(cells, rep, first_pos, last_pos, i)
        link[i - 1] = (reg and reg2 and d2 == d
                       and _pool_follows_in(seq, k, first_pos, new, kpool, i))
        reg, d = reg2, d2
    return _link_spans_in(cells, link, out)


def _regular(pools, first_pos, last_pos, rows, rep, pad, i):  # pragma: no cover
    """(Entry i is regular, its member step): the pool listing's rule (`pools`,
    `_pool_regular`) or the scatter entries' (`_scatter_regular`)."""
    if pools:
        return _pool_regular_in(rows, rep, first_pos, last_pos, i)
    return _scatter_regular_in(rows, rep, pad, i)


_regular_in = inner(_regular)


def _links(pools, seq, k, first_pos, new, kpool, r0, d0, r1, d1, i
           ):  # pragma: no cover - compiled
    """Whether entries i and i + 1, whose verdicts are (r0, d0) and (r1, d1), link,
    before `_link_spans`'s step rule: both regular with one member step, and for the
    pool listing entry i + 1 follows entry i (`_pool_follows`)."""
    return r0 and r1 and d1 == d0 and (
        not pools or _pool_follows_in(seq, k, first_pos, new, kpool, i + 1))


_links_in = inner(_links)


def _linked(pools, seq, k, first_pos, last_pos, rows, rep, new, pad, i
            ):  # pragma: no cover - compiled
    """Whether entries i and i + 1 link, before `_link_spans`'s step rule."""
    r0, d0 = _regular_in(pools, first_pos, last_pos, rows, rep, pad, i)
    r1, d1 = _regular_in(pools, first_pos, last_pos, rows, rep, pad, i + 1)
    return _links_in(pools, seq, k, first_pos, new, rows.shape[1], r0, d0, r1, d1, i)


_linked_in = inner(_linked)


def _run_out(run, out, m):  # pragma: no cover - compiled
    """The run being built (`_runs_on`), if any, written to out[m] as a span.
    Returns m."""
    if run[0] >= 0:
        out[m, 0] = run[0]
        out[m, 1] = run[1] + 2
        m += 1
    return m


_run_out_in = inner(_run_out)


def _runs_on(run, x, y, out, m):  # pragma: no cover - compiled
    """Links x..y (inclusive, past every link handed before) are on: extend the run
    being built (`run`: its first and last link, -1 for none) when they follow its
    last, else write that run to out[m] as a span and start another. Returns m."""
    if run[0] >= 0 and x == run[1] + 1:
        run[1] = y
        return m
    m = _run_out_in(run, out, m)
    run[0] = x
    run[1] = y
    return m


_runs_on_in = inner(_runs_on)


def _old_runs(old, lo, hi, shift, run, out, m):  # pragma: no cover - compiled
    """The links lo..hi of the listing before, on where its spans `old` say, handed to
    `_runs_on` at their places now (less `shift`). Returns m."""
    j = _bisect_in(old[:, 1], lo + 1, True)  # the first span whose last link >= lo
    while j < old.shape[0] and old[j, 0] <= hi:
        x, y = max(old[j, 0], lo), min(old[j, 1] - 2, hi)
        if x <= y:
            m = _runs_on_in(run, x - shift, y - shift, out, m)
        j += 1
    return m


_old_runs_in = inner(_old_runs)


@kernel
def grown_spans(pools, seq, k, first_pos, last_pos, rows, rep, new, pad, old, start,
                before, kept, run, out):  # pragma: no cover - compiled
    """The spans of a listing (the pool listing's when `pools`, else the scatter
    entries'; its columns as `pool_spans` and `scatter_spans` take them) made of the
    listing before, whose spans were `old`: segment j (a sequence's pools) is entries
    start[j]..start[j + 1] - 1, of which the first kept[j] are the entries
    before[j]..before[j] + kept[j] - 1 of the listing before, unchanged, and the rest
    new. What the old spans say of a link holds while the link's three entries
    (`_link_spans`'s step rule reads the one before it) are kept ones that stood in a
    row before: only the links about a segment that changed are asked again
    (`_linked` and the step rule), the others read from `old`. run [2] is scratch;
    out [n // 2, 2] gets the spans, the very ones `pool_spans` or `scatter_spans`
    find over the whole listing; returns how many."""
    m_seg = kept.size
    n_links = start[m_seg] - 1
    run[0] = -1
    run[1] = -1
    m = 0
    at = 0  # the first link not handed yet
    # the last link asked again and whether it linked, before the step rule: the next
    # link's rule reads it, so a segment that changed whole asks each link once
    prev, prev_on = -2, False
    # the verdict of the last entry judged (`_regular`), which the next link reads
    # again: a segment that changed whole judges each entry once, as `pool_spans` does
    reg_at, reg, d = -1, False, 0
    for j in range(m_seg):
        n_now = start[j + 1] - start[j]
        if kept[j] == n_now and kept[j] == before[j + 1] - before[j]:
            continue  # this segment's links, and those to the next, stand
        # its links from the one before its first new entry (or the boundary, when
        # it only lost entries) to the one after its last
        lo = max(start[j] + kept[j] - 1, 0)
        hi = min(start[j + 1], n_links - 1)
        end = min(lo, n_links)
        if at < end:  # a stretch that stands, up to them: its links as they were
            shift = before[j] - start[j]  # the same from the last segment that changed
            m = _old_runs_in(old, at + shift, end - 1 + shift, shift, run, out, m)
            at = end
        for i in range(max(lo, at), hi + 1):  # asked again
            if reg_at == i:
                r0, d0 = reg, d
            else:
                r0, d0 = _regular_in(pools, first_pos, last_pos, rows, rep, pad, i)
            reg_at = i + 1
            reg, d = _regular_in(pools, first_pos, last_pos, rows, rep, pad, reg_at)
            linked = _links_in(pools, seq, k, first_pos, new, rows.shape[1], r0, d0, reg, d,
                               i)
            on = linked
            if on and i > 0:
                linked_before = prev_on if prev == i - 1 else _linked_in(
                    pools, seq, k, first_pos, last_pos, rows, rep, new, pad, i - 1)
                if linked_before and _step_breaks_in(rows, i):
                    on = False
            prev, prev_on = i, linked
            if on:
                m = _runs_on_in(run, i, i, out, m)
        at = max(at, hi + 1)
    if at < n_links:
        shift = before[m_seg] - start[m_seg]
        m = _old_runs_in(old, at + shift, n_links - 1 + shift, shift, run, out, m)
    return _run_out_in(run, out, m)
