"""One stream of cells, as llama.cpp's `llama_kv_cells` keeps it (ENGINE.md §2).

Owns: per cell its `pos` (EMPTY_POS when empty), `ext`, its set of sequences and
its key id (which write produced the row's key, 0 = a zeroed row); per sequence
the ordered (pos, cell) pairs; `used` and `head`.

Invariants (checked by `check_invariants`, which tests run after every op):
- a cell is empty  <=>  pos == EMPTY_POS  <=>  it holds no sequence;
- `seq_keys[s]` holds exactly the cells holding s, as sorted keys `pos << 32 | cell`
  (so "ordered by pos, then cell", the order of the real `seq_pos` sets);
- `used` is the number of non-empty cells;
- `touched` holds every sequence whose pairs changed since the owner last took it
  (so a layout update can skip the others: they cost nothing), and
  `changed_from[s]` of each a key at or below every pair of s added or removed
  since (so its pairs below that key are as they were; -1: any may have changed).
The per-sequence keys are a derived index: only the stream's mutators touch them
(a range's removal cuts it: `SortedKeys.cut_range`).

Every mutator states its precondition and returns the cells whose *emptiness*
changed, so the caller (the cache) can move `head` as llama_kv_cache does.

Cost: the per-cell arrays are allocated once (`Stream.bytes_bound` says how much);
after that no op allocates or scans O(kv_size): the live cells come from the
per-sequence index (every live cell holds a sequence), and free cells are found
by scanning from `head` in growing chunks (`empty_cells`), as far as the request
needs. The one query that costs O(kv_size) is `seq_codes` (the rich view's picture
of the cells): a fill of an int16 per cell, then O(pairs).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..arrays import unique

EMPTY_POS = -1
CELL_BITS = 32
CELL_MASK = (1 << CELL_BITS) - 1
NO_PAIR = int(np.iinfo(np.int64).max)  # above every key: no pair (none changed, ...)


def make_keys(pos: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Sort keys of (pos, cell) pairs: ordered by pos, then cell."""
    return (pos.astype(np.int64) << CELL_BITS) | cells.astype(np.int64)


def global_row(strm, cell, kv_size: int):
    """ENGINE.md §2: the global row of stream `strm`'s cell `cell` (ints or arrays):
    `strm * kv_size + cell`. The one place it is computed."""
    return strm * kv_size + cell


def llama_pos(x):
    """ENGINE.md §2 (positions are int32): `x` (an int or an int64 array) as
    llama.cpp's `llama_pos` (int32_t) holds it after a sum, two's complement wrapped.
    The sums the real code makes in it can pass INT32_MAX or INT32_MIN (`pos[i] += d`
    in `llama_kv_cells::pos_add`, `cell.pos += shift` in
    `llama_memory_recurrent::seq_add`, `p0 + shift` in
    `llama_memory_hybrid_idx::seq_add`): signed overflow, undefined in C++, of which
    kpool takes the wrap that the machine's add instruction gives."""
    return ((x + (1 << 31)) % (1 << 32)) - (1 << 31)


def key_cell(keys: np.ndarray) -> np.ndarray:
    return keys & CELL_MASK


class GrowArray:
    """A growable int64 vector: appends amortised O(1), `view` is the live part."""

    __slots__ = ("_a", "_n")

    def __init__(self) -> None:
        self._a = np.empty(16, dtype=np.int64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def view(self) -> np.ndarray:
        """The live part. A view: do not keep it across a mutation."""
        return self._a[: self._n]

    def extend(self, values: np.ndarray) -> None:
        need = self._n + values.size
        if need > self._a.size:
            grown = np.empty(max(need, 2 * self._a.size), dtype=np.int64)
            grown[: self._n] = self._a[: self._n]
            self._a = grown
        self._a[self._n:need] = values
        self._n = need

    def append(self, value: int) -> None:
        """`extend` by one value."""
        n = self._n
        (self._a if n < self._a.size else self.spare(n + 1))[n] = value
        self._n = n + 1

    def assign(self, values: np.ndarray) -> None:
        self._n = 0
        self.extend(values)

    @property
    def capacity(self) -> int:
        return int(self._a.size)

    def spare(self, n: int) -> np.ndarray:
        """The whole buffer, with room for at least n values in all (the live part
        kept): a compiled step writes past `len` and then calls `set_len`."""
        if n > self._a.size:
            grown = np.empty(max(n, 2 * self._a.size), dtype=np.int64)
            grown[: self._n] = self._a[: self._n]
            self._a = grown
        return self._a

    def last(self) -> int:
        """The last live value."""
        assert self._n, "no live value"
        return int(self._a[self._n - 1])

    def set_len(self, n: int) -> None:
        """The first n values of the buffer are live (n within what `spare` gave)."""
        assert 0 <= n <= self._a.size
        self._n = n

    def truncate(self, n: int) -> None:
        """Keep the first n values."""
        self._n = min(self._n, n)


class SortedKeys(GrowArray):
    """A growable sorted int64 array; inserts past the end are amortised O(1)."""

    __slots__ = ()

    def add(self, keys: np.ndarray) -> None:
        """Insert keys not already present."""
        if keys.size == 0:
            return
        keys = np.sort(keys)
        if self._n == 0 or keys[0] > self._a[self._n - 1]:
            self.extend(keys)
            return
        merged = np.concatenate((self.view, keys))
        merged.sort(kind="stable")
        self.assign(merged)

    def push(self, key: int) -> bool:
        """Append `key` when it sorts after every key held (the common insert of a
        decode); returns whether it did (else nothing changed: `add` it)."""
        n = self._n
        if n and key <= int(self._a[n - 1]):
            return False
        self.append(key)
        return True

    def remove(self, keys: np.ndarray) -> None:
        """Remove keys that are present (precondition: each key is present)."""
        if keys.size == 0:
            return
        cur = self._a[: self._n]
        idx = cur.searchsorted(keys)
        assert np.all(cur[idx] == keys), "removing a key that is not in the set"
        keep = np.ones(self._n, dtype=bool)
        keep[idx] = False
        rest = cur[keep]
        self._a[: rest.size] = rest
        self._n = rest.size

    def range(self, p0: int, p1: int) -> np.ndarray:
        """Keys with p0 <= pos < p1 (p0 >= 0, p1 > p0)."""
        cur = self._a[: self._n]
        lo, hi = self.range_ends(cur, p0, p1)
        return cur[lo:hi]

    def cut_range(self, p0: int, p1: int) -> np.ndarray:
        """`range(p0, p1)`, removed: a copy of those keys (a slice of the set, so
        removing them moves the keys past it down; the tail, a rejected draft's
        seq_rm, moves none). What a seq_rm removes; `remove` takes any keys."""
        n = self._n
        cur = self._a[:n]
        lo, hi = self.range_ends(cur, p0, p1)
        out = cur[lo:hi].copy()
        if hi < n:
            cur[lo:n - (hi - lo)] = cur[hi:].copy()
        self._n = n - (hi - lo)
        return out

    @staticmethod
    def range_ends(cur: np.ndarray, p0: int, p1: int) -> tuple[int, int]:
        """Where the keys with p0 <= pos < p1 start and end in `cur`."""
        return (int(cur.searchsorted(np.int64(p0) << CELL_BITS)),
                int(cur.searchsorted(np.int64(min(p1, (1 << 31) - 1)) << CELL_BITS)))


def _last_pos(index: SortedKeys) -> int:
    """The pos of a sequence's last pair (its index of keys), -1 when it holds none.
    (Read in place: batch validation asks it of every slot of a step.)"""
    n = index._n
    return int(index._a[n - 1]) >> CELL_BITS if n else -1


class Stream:
    """`kv_size` cells. `seq_ids` are the sequences this stream can hold: all of them
    in a unified cache, only its own sequence in a non-unified one."""

    # bytes per cell of the arrays __init__ allocates: pos, ext, seq_count, key_id (and
    # one `has` byte per sequence column); tests hold it equal to a built stream's
    CELL_BYTES = 8 + 2 * 8 + 4 + 8
    # the index per (sequence, cell) pair: a SortedKeys, capacity up to twice the
    # pairs; in the compiled core an arena row (compiled/arena.py), up to twice the
    # widest row's pairs and the old row beside it while the arena widens
    PAIR_BYTES = 3 * 8
    # the first chunk `empty_cells` scans (it doubles each step)
    SCAN_CHUNK = 4096

    def __init__(self, kv_size: int, seq_ids: list[int]) -> None:
        self.kv_size = kv_size
        self.seq_ids = list(seq_ids)
        self._col = {s: i for i, s in enumerate(self.seq_ids)}
        self.pos = np.full(kv_size, EMPTY_POS, dtype=np.int64)  # [kv_size]  | cell | pos or -1
        self.ext = np.zeros((kv_size, 2), dtype=np.int64)  # [kv_size, 2] | cell | (x, y)
        self.has = np.zeros((len(self.seq_ids), kv_size), dtype=bool)  # [n_col, kv] | seq col, cell
        self.seq_count = np.zeros(kv_size, dtype=np.int32)  # [kv_size] | cell | sequences held
        self.key_id = np.zeros(kv_size, dtype=np.int64)  # [kv_size] | cell | key write id
        self.seq_keys: dict[int, SortedKeys] = {s: SortedKeys() for s in self.seq_ids}
        self.touched: set[int] = set()
        self.changed_from: dict[int, int] = {}  # of the sequences in `touched`
        self.used = 0
        # llama_kv_cells' has_shift: a seq_add or seq_div moved or divided a cell since
        # the last memory update (which resets it: KvCache.take_update) or reset
        self.has_shift = False

    @classmethod
    def bytes_bound(cls, kv_size: int, n_col: int, cells: int) -> int:
        """Bytes a stream holds with at most `cells` live cells: the per-cell arrays
        (allocated at once) and the index, a sequence column's keys (each sequence
        holds at most every live cell): a SortedKeys, capacity at most twice its keys
        and at least 16, or in the compiled core an arena row (`PAIR_BYTES`)."""
        cells = min(cells, kv_size)
        return kv_size * (cls.CELL_BYTES + n_col) + n_col * (cls.PAIR_BYTES * cells + 16 * 8)

    @classmethod
    def op_bytes_bound(cls, kv_size: int, n_col: int, cells: int) -> int:
        """Bytes one op's temporaries can take: a few int64 copies of the live pairs
        (the union of the index, its sort, keys, masks) and a free-cell scan (a chunk
        is at most kv_size cells: a mask and the indices found in it)."""
        cells = min(cells, kv_size)
        return 5 * 8 * n_col * cells + 9 * kv_size

    # -- queries ---------------------------------------------------------------

    def cells_of(self, s: int) -> np.ndarray:
        """Sorted keys (pos << 32 | cell) of s's cells."""
        return self.seq_keys[s].view

    def seq_pos_min(self, s: int) -> int:
        """-1 when s holds no cell."""
        k = self.seq_keys[s].view
        return int(k[0] >> CELL_BITS) if k.size else -1

    def seq_pos_max(self, s: int) -> int:
        """-1 when s holds no cell."""
        return _last_pos(self.seq_keys[s])

    def seq_pos_maxes(self, seqs: Iterable[int]) -> list[int]:
        """`seq_pos_max` of each of `seqs` (a batch of parallel slots asks for each of
        its sequences at once)."""
        keys = self.seq_keys
        return [_last_pos(keys[s]) for s in seqs]

    def live_cells(self) -> np.ndarray:
        """Every non-empty cell, ascending, from the index (O(pairs), not O(kv_size))."""
        if self.used == 0:
            return np.empty(0, dtype=np.int64)
        parts = [key_cell(k.view) for k in self.seq_keys.values() if len(k)]
        return unique(np.concatenate(parts))

    def empty_cells(self, lo: int, hi: int, n: int, taken: np.ndarray | None = None
                    ) -> np.ndarray:
        """The first n empty cells of [lo, hi), ascending (fewer if there are not n),
        not counting the cells of `taken` (sorted: cells a plan has already promised).
        Scans from lo in chunks that double, so a request near `head` costs what it
        reads, not O(kv_size)."""
        out: list[np.ndarray] = []
        found, c, step = 0, lo, max(self.SCAN_CHUNK, 4 * n)
        while c < hi and found < n:
            e = min(hi, c + step)
            free = self.pos[c:e] == EMPTY_POS
            if taken is not None and taken.size:
                a, b = taken.searchsorted((c, e))
                free[taken[a:b] - c] = False
            got = np.flatnonzero(free)[: n - found]
            if got.size:
                out.append(got + c)
                found += int(got.size)
            c = e
            step *= 2
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    # -- derived index, touched only here ---------------------------------------

    def touch(self, s: int, low: int) -> None:
        """s's pairs changed, none below the key `low` (-1: any)."""
        self.touched.add(s)
        got = self.changed_from.get(s)
        if got is None or low < got:
            self.changed_from[s] = low

    def touch_all(self, seqs: set[int], low: int) -> None:
        """`touch` of each of `seqs`; of sequences not touched yet (a step of parallel
        slots, most often), at once: none has a `changed_from` to keep."""
        if seqs.isdisjoint(self.touched):
            self.changed_from.update(dict.fromkeys(seqs, low))
            self.touched |= seqs
        else:
            for s in seqs:
                self.touch(s, low)

    def _index_rm(self, cells: np.ndarray) -> None:
        """Drop every (pos, cell) pair of these cells from every sequence's keys."""
        keys = make_keys(self.pos[cells], cells)
        for s in self.seq_ids:
            col = self.has[self._col[s], cells]
            if col.any():
                gone = keys[col]
                self.seq_keys[s].remove(gone)
                self.touch(s, int(gone.min()))

    def _index_add(self, cells: np.ndarray) -> None:
        keys = make_keys(self.pos[cells], cells)
        for s in self.seq_ids:
            col = self.has[self._col[s], cells]
            if col.any():
                new = keys[col]
                self.seq_keys[s].add(new)
                self.touch(s, int(new.min()))

    def _empty(self, cells: np.ndarray) -> None:
        """Make these cells empty (their pairs are already out of the index)."""
        self.pos[cells] = EMPTY_POS
        self.ext[cells] = 0
        self.has[:, cells] = False
        self.seq_count[cells] = 0
        self.used -= int(cells.size)

    # -- mutators ----------------------------------------------------------------

    def write(self, cells: np.ndarray, pos: np.ndarray, ext: np.ndarray | None,
              seqs: list[tuple[int, ...]], key_ids: np.ndarray) -> None:
        """A decode's placement: cells must be empty and distinct; each gets pos, ext,
        its sequences and a fresh key id."""
        assert np.all(self.pos[cells] == EMPTY_POS), "writing a cell that is not empty"
        self.pos[cells] = pos
        if ext is not None:
            self.ext[cells] = ext
        for c, ss in zip(cells.tolist(), seqs, strict=True):
            for s in ss:
                self.has[self._col[s], c] = True
            self.seq_count[c] = len(ss)
        self.key_id[cells] = key_ids
        self.used += int(cells.size)
        self._index_add(cells)

    def seq_rm(self, s: int, p0: int, p1: int) -> np.ndarray:
        """Drop s from its cells with p0 <= pos < p1 (p0 >= 0, p1 > p0 after the caller
        resolves -1). Returns the cells that became empty, ascending."""
        keys = self.seq_keys[s].cut_range(p0, p1)
        if keys.size == 0:
            return np.empty(0, dtype=np.int64)
        cells = np.sort(key_cell(keys))
        self.touch(s, int(keys[0]))  # the cut keys ascend
        self.has[self._col[s], cells] = False
        self.seq_count[cells] -= 1
        freed = cells[self.seq_count[cells] == 0]
        self._empty(freed)
        return freed

    def rm_range(self, p0: int, p1: int) -> np.ndarray:
        """seq_rm(-1, p0, p1): empty every cell with p0 <= pos < p1 (p0 >= 0). Returns
        them, ascending. Every live cell holds a sequence, so the sequences' ranges
        find them all."""
        parts = []
        for s, k in self.seq_keys.items():
            # a cell in the range is a pair in the range of every sequence holding it
            got = k.cut_range(p0, p1)
            if got.size:
                parts.append(key_cell(got))
                self.touch(s, int(got[0]))
        cells = unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
        self._empty(cells)
        return cells

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> np.ndarray:
        """Unified copy: add dst to every cell of src with p0 <= pos < p1. Returns the
        cells that gained dst."""
        keys = self.seq_keys[src].range(p0, p1)
        cells = key_cell(keys)
        new = cells[~self.has[self._col[dst], cells]]
        if new.size:
            self.has[self._col[dst], new] = True
            self.seq_count[new] += 1
            added = make_keys(self.pos[new], new)
            self.seq_keys[dst].add(added)
            self.touch(dst, int(added.min()))
        return new

    def seq_keep(self, s: int) -> np.ndarray:
        """Every cell not holding s becomes empty; cells holding s keep only s (a
        stream that is not s's holds none: it empties). Returns the cells that became
        empty."""
        held = self.seq_keys.get(s)
        mine = np.sort(key_cell(held.view)) if held is not None else np.empty(0, np.int64)
        freed = np.setdiff1d(self.live_cells(), mine, assume_unique=True)
        shared = mine[self.seq_count[mine] > 1]
        self._index_rm(freed)
        self._empty(freed)
        if shared.size:
            keys = make_keys(self.pos[shared], shared)
            for t in self.seq_ids:
                if t != s:
                    col = self.has[self._col[t], shared]
                    if col.any():
                        gone = keys[col]
                        self.seq_keys[t].remove(gone)
                        self.touch(t, int(gone.min()))
            self.has[:, shared] = False
            self.has[self._col[s], shared] = True
            self.seq_count[shared] = 1
        return freed

    def shift_pos(self, s: int, p0: int, p1: int, shift: int) -> np.ndarray:
        """seq_add: pos += shift for s's cells with p0 <= pos < p1, for every sequence
        of the cell (pos belongs to the cell), in int32 (`llama_pos`: a pos pushed past
        INT32_MAX wraps below 0). A cell whose pos drops below 0 becomes empty. A cell
        moved leaves a K-shift pending (`has_shift`). Returns the cells that became
        empty, ascending."""
        cells = np.sort(key_cell(self.seq_keys[s].range(p0, p1)))
        if cells.size == 0:
            return cells
        self.has_shift = True
        self._index_rm(cells)
        self.pos[cells] = llama_pos(self.pos[cells] + shift)
        gone = self.pos[cells] < 0
        freed = cells[gone]
        self._empty(freed)
        self._index_add(cells[~gone])
        return freed

    def div_pos(self, s: int, p0: int, p1: int, d: int) -> None:
        """seq_div: pos //= d for s's cells with p0 <= pos < p1 (every sequence of the
        cell). A cell divided leaves a K-shift pending, even when its pos stays."""
        cells = key_cell(self.seq_keys[s].range(p0, p1))
        if cells.size == 0:
            return
        self.has_shift = True
        self._index_rm(cells)
        self.pos[cells] //= d
        self._index_add(cells)

    def reset(self) -> None:
        """Every cell empty (clear, or the destination of a cross-stream copy): costs the
        live cells, not kv_size."""
        cells = self.live_cells()
        for s, k in self.seq_keys.items():
            if len(k):
                k.assign(np.empty(0, dtype=np.int64))
                self.touch(s, -1)
        self._empty(cells)
        self.has_shift = False

    def copy_from(self, other: Stream, src: int, dst: int) -> None:
        """Cross-stream seq_cp (non-unified): this stream (dst's) is reset, then src's
        cells are copied at the same indices, holding only dst."""
        self.reset()
        cells = np.sort(key_cell(other.seq_keys[src].view))
        self.pos[cells] = other.pos[cells]
        self.ext[cells] = other.ext[cells]
        self.has[self._col[dst], cells] = True
        self.seq_count[cells] = 1
        self.key_id[cells] = other.key_id[cells]
        self.used = int(cells.size)
        self._index_add(cells)

    def saved(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of `cells`' pos, ext and key ids (a state_write's snapshot)."""
        return self.pos[cells].copy(), self.ext[cells].copy(), self.key_id[cells].copy()

    def forget_keys(self, cells: np.ndarray) -> None:
        """`cells` (empty now) hold no key: a state drop zeroed their rows."""
        assert np.all(self.pos[cells] == EMPTY_POS), "only an empty cell forgets its key"
        self.key_id[cells] = 0

    def seq_codes(self, empty: int, shared: int, out: np.ndarray | None = None) -> np.ndarray:
        """[kv_size] int16 per cell: `empty`, its one seq id, or `shared`; written into
        `out` when given. One fill of the kv_size codes, then the live cells from the
        index (O(pairs), as `live_cells`): a cell a second sequence reaches is shared."""
        code = np.empty(self.kv_size, dtype=np.int16) if out is None else out
        code.fill(empty)
        for s, keys in self.seq_keys.items():
            if len(keys):
                cells = key_cell(keys.view)
                code[cells] = np.where(code[cells] == empty, np.int16(s), np.int16(shared))
        return code

    def holds(self, s: int, cells: np.ndarray) -> np.ndarray:
        """[n] bool: each of `cells` holds sequence s."""
        col = self._col.get(s)
        return np.zeros(cells.size, dtype=bool) if col is None else self.has[col][cells]

    # -- checks --------------------------------------------------------------------

    def check_invariants(self) -> None:
        empty = self.pos == EMPTY_POS
        assert np.all(self.pos[~empty] >= 0), "negative pos in a live cell"
        assert np.array_equal(self.seq_count, self.has.sum(axis=0)), "seq_count out of sync"
        assert np.array_equal(empty, self.seq_count == 0), "empty cell with sequences"
        assert self.used == int((~empty).sum()), "used out of sync"
        for s in self.seq_ids:
            cells = np.flatnonzero(self.has[self._col[s]])
            want = np.sort(make_keys(self.pos[cells], cells))
            assert np.array_equal(self.seq_keys[s].view, want), f"seq {s} index out of sync"
        assert set(self.changed_from) == self.touched, "changed_from out of sync"
