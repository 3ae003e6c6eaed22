"""The slot table: where the value backend keeps a row's data, and the write clock.

Owns, for the global rows (`n_rows = n_stream * kv_size`) that hold data:
- `slot_of[row]`, the row's slot, 0 for a row that holds zeros (never written,
  cleared, or copied from such a row). Slot 0 is the zero row, never written; a
  row gets a slot of its own the first time something non-zero may land in it
  (a decode's key write: `kernels.write_rows`, which hands slots out in `_take`'s
  order; a restore, a stream copy of a row with a slot, a scatter: `own`), keeps it
  until a `clear` (or a stream copy that zeroes it: `release`)
  frees it, and freed slots are reused. So memory follows the rows written, not
  kv_size * n_stream: a `clear` or a cross-stream copy costs the rows that have
  slots;
- the per-slot arrays (`SLOT_ARRAYS`), each in an anonymous memory map that grows
  in place (`_grow`): their spare capacity is never resident. They hold what the
  other parts of the backend keep per slot: `key` and `pooled` (float32 [slots,
  n_embd]: the cell's indexer key and the pooled slot a rep row holds) and `gate`
  (int8 [slots, n_embd]: the key's per-dimension gate logits, small integers:
  `keys.GATE_MAX`; a quarter of float32's memory, and of the pages a first write
  touches), the writer of each slot (`w_kind`, `w_ubatch`,
  `w_a`, `w_b`: `writers.py` reads and writes them), `slot_row` (the row of a slot
  in use, -1 for a freed one), and the pooling a slot's pooled row holds (below);
- the generations: every call that writes values takes a new one (`next_gen`);
  `key_gen` says when each slot's key and gate last changed, and `pool_of`
  (int64 [slots, kpool]) the member slots a slot's pooled row was pooled from,
  valid when `pool_gen[slot] > 0`, the generation it was pooled at (the scatter
  sets them: `store.py`, which keeps such a pooling instead of pooling again);
- `check_tables`, `check_generations`: the arrays a kernel reads and writes are what
  the kernels take.

Invariants:
- `slot_row[slot]` is the row of every slot in use (-1 for a freed one), and
  `slot_of[slot_row[slot]] == slot`;
- slots [1, n_handed) not in the free list are in use, and each has a row;
  every array of `SLOT_ARRAYS` has a row for every slot handed out;
- where `pool_gen[r] > 0`, `pooled[r]` is bit-equal to the pooling of `pool_of[r]`
  and every member slot m has `key_gen[m] < pool_gen[r]`; a slot handed out (`own`:
  `wrote`), and every write of a pooled row but the scatter's, sets `pool_gen` to 0;
- which slot a row gets never changes a value: every reader goes through
  `slot_of`, and a slot handed out holds zeros or is written whole before it is
  read;
- slots at or past `pristine` were never handed out (not even before a `clear`):
  they hold zeros in every array, as the anonymous maps gave them, so a caller
  that hands one out need not zero it, and its pages stay untouched (a decode's
  pooled rows: only a rep row's is ever written).

Memory: `bytes_held` (what the table holds now) and `bytes_bound` (what a trace
can make it hold); the value backend adds the other parts (`store.py`).
"""

from __future__ import annotations

import mmap

import numpy as np

from ..trace.model import CacheConfig
from .guards import PlanError, is_rows


def _anonymous_map(nbytes: int) -> mmap.mmap:
    """Zeroed private memory (MAP_PRIVATE: a shared anonymous map cannot grow past its
    first size; Windows has no flags)."""
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    return mmap.mmap(-1, nbytes)


def _slot_dtype(n_rows: int) -> type:
    """The row -> slot map's dtype: slots go up to n_rows (slot 0 is the zero row)."""
    return np.int32 if n_rows < np.iinfo(np.int32).max else np.int64


class SlotTable:
    """Rows -> slots, the per-slot arrays, their growth, and the generations."""

    SLOTS_MIN = 64  # slot capacity allocated up front (the zero row included)
    # capacity grows by 1/SLOT_GROWTH at least, in place (`_grow`)
    SLOT_GROWTH = 8
    # the per-slot arrays: name, dtype, row width ("n_embd", "kpool", or 1)
    SLOT_ARRAYS = (("key", np.float32, "n_embd"), ("gate", np.int8, "n_embd"),
                   ("pooled", np.float32, "n_embd"), ("w_kind", np.int8, 1),
                   ("w_ubatch", np.int64, 1), ("w_a", np.int64, 1), ("w_b", np.int64, 1),
                   ("slot_row", np.int64, 1), ("key_gen", np.int64, 1),
                   ("pool_gen", np.int64, 1), ("pool_of", np.int64, "kpool"))
    # bytes per slot besides its key, gate and pooled rows and pool_of (8 kpool): w_kind,
    # w_ubatch, w_a, w_b, slot_row, key_gen, pool_gen
    SLOT_BYTES = sum(np.dtype(dtype).itemsize for _, dtype, wide in SLOT_ARRAYS if wide == 1)

    # the per-slot arrays, set by `_grow` as `SLOT_ARRAYS` declares them
    # key, pooled: [slots, n_embd] float32, gate int8 | slot, d | key, gate logit, pooled
    key: np.ndarray
    gate: np.ndarray
    pooled: np.ndarray
    # w_kind [slots] int8 (NEVER, POOLED, ...), w_ubatch (when), w_a (seq / src stream /
    # slot index), w_b (k); slot_row [slots] int64: its row, or -1
    w_kind: np.ndarray
    w_ubatch: np.ndarray
    w_a: np.ndarray
    w_b: np.ndarray
    slot_row: np.ndarray
    key_gen: np.ndarray  # [slots] int64, the generations (below)
    pool_gen: np.ndarray
    pool_of: np.ndarray  # [slots, kpool] int64

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.kpool, self.kv_size = config.kpool, config.kv_size
        self.n_rows, self.n_embd = config.n_rows, config.n_embd
        self.slot_of: np.ndarray = np.zeros(self.n_rows, dtype=_slot_dtype(self.n_rows))
        self._max_slots = self.max_slots(config)
        self._cap = 0
        self._maps: dict[str, mmap.mmap] = {}
        self._tables: tuple | None = None  # key, gate, pooled as last checked, their rows
        self._gens: tuple | None = None  # pool_of, pool_gen, key_gen as last checked, rows
        self.gen = 0  # the generation of the last call that wrote values
        self._grow(min(self.SLOTS_MIN, self._max_slots))
        self.n_handed = 1  # slots [0, n_handed) handed out since the last clear
        self.pristine = 1  # slots [pristine, ...) never handed out: zeros throughout
        self._free = np.empty(0, dtype=np.int64)  # freed slots below n_handed

    # -- memory --------------------------------------------------------------------------

    @staticmethod
    def max_slots(config: CacheConfig) -> int:
        """A slot per row, and the zero row."""
        return config.n_rows + 1

    @classmethod
    def row_bytes(cls, config: CacheConfig) -> int:
        """A slot's n_embd-wide rows (`SLOT_ARRAYS`: key and pooled float32, gate int8)."""
        return config.n_embd * sum(np.dtype(dtype).itemsize
                                   for _, dtype, wide in cls.SLOT_ARRAYS if wide == "n_embd")

    @classmethod
    def slots_bound(cls, config: CacheConfig, value_rows: int) -> int:
        """Slots a replay can hand out (the zero row included): at most one per row
        that gets data, `value_rows` (`Reach.value_rows`)."""
        return min(cls.max_slots(config), 1 + value_rows)

    @classmethod
    def bytes_bound(cls, config: CacheConfig, value_rows: int) -> int:
        """Bytes the table can hold: per global row the slot map; the slot arrays at
        the largest capacity `slots_bound` slots make them grow to (by 1/SLOT_GROWTH,
        in place); the free list."""
        n_rows, kpool = config.n_rows, config.kpool
        slots = cls.slots_bound(config, value_rows)
        cap = min(cls.max_slots(config),
                  max(cls.SLOTS_MIN, slots + slots // cls.SLOT_GROWTH + 1))
        return (n_rows * np.dtype(_slot_dtype(n_rows)).itemsize
                + cap * (cls.row_bytes(config) + cls.SLOT_BYTES + 8 * kpool)
                + 8 * slots)  # the free list

    def bytes_held(self) -> int:
        """Bytes of the slot map, the free list and the slot arrays (their capacity)."""
        return (self.slot_of.nbytes + self._free.nbytes
                + sum(getattr(self, name).nbytes for name, _, _ in self.SLOT_ARRAYS))

    @property
    def n_slots(self) -> int:
        """Slots in use (the zero row not counted)."""
        return self.n_handed - 1 - int(self._free.size)

    # -- the generations -----------------------------------------------------------------

    def next_gen(self) -> None:
        """A call that writes values begins: writes from here on are newer than any
        pooling kept so far."""
        self.gen += 1

    def wrote(self, slots: np.ndarray) -> None:
        """`slots` got new keys and gates (or zeros), and a pooled row that is no
        pooling they know of."""
        self.key_gen[slots] = self.gen
        self.pool_gen[slots] = 0

    # -- rows and slots --------------------------------------------------------------------

    def of(self, rows: np.ndarray) -> np.ndarray:
        """The slots of `rows` (any shape; 0 for a zero row), int64, C-contiguous."""
        return self.slot_of[rows].astype(np.int64)

    def own(self, rows: np.ndarray, zero_new: bool) -> np.ndarray:
        """The slots of `rows` (distinct), giving each zero row a slot of its own; the
        new slots hold zeros when `zero_new` (else the caller writes all three rows;
        one `pristine` before the call holds zeros already)."""
        s = self.of(rows)
        new = (s == 0).nonzero()[0]  # s is flat: flatnonzero's ravel is a call more
        if new.size:
            pristine = self.pristine
            ids = self._take(int(new.size))
            r = rows[new]
            self.slot_of[r] = ids
            self.slot_row[ids] = r
            self.wrote(ids)
            s[new] = ids
            if zero_new:
                self.zero(ids, pristine, self.key, self.gate, self.pooled)
        return s

    def zero(self, slots: np.ndarray, pristine: int, *arrays: np.ndarray) -> None:
        """Zero `arrays` at `slots`, but for the slots at or past `pristine` (the mark
        as it was before they were handed out), which hold zeros already."""
        used = slots[slots < pristine]
        for a in arrays:
            a[used] = 0

    def release(self, rows: np.ndarray) -> None:
        """Rows with a slot become zero rows; their slots are free for reuse."""
        if rows.size:
            s = self.of(rows)
            self.slot_of[rows] = 0
            self.slot_row[s] = -1
            self._free = np.concatenate((self._free, s))

    def live_rows(self) -> np.ndarray:
        """Every row with a slot (O(slots))."""
        r = self.slot_row[1:self.n_handed]
        return r[r >= 0]

    def copy_stream(self, src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row of stream `src` to stream `dst` (checked streams), key, gate and
        pooled rows whole: a destination row whose source is a zero row becomes one
        (its slot freed), the others get a slot holding their source's rows. Costs
        the rows of the two streams that have slots. Returns (the destination rows
        that became zero rows, the destination rows with data, their slots)."""
        kv = self.kv_size
        live = self.live_rows()
        src_rows = live[(live >= src * kv) & (live < (src + 1) * kv)]
        dst_old = live[(live >= dst * kv) & (live < (dst + 1) * kv)]
        # a destination row whose source is a zero row becomes one
        gone = dst_old[self.slot_of[dst_old + (src - dst) * kv] == 0]
        self.release(gone)
        dst_rows = src_rows + (dst - src) * kv
        s_src = self.of(src_rows)
        s_dst = self.own(dst_rows, zero_new=False)
        for a in (self.key, self.gate, self.pooled):
            a[s_dst] = a[s_src]
        return gone, dst_rows, s_dst

    def clear(self) -> None:
        """Every row a zero row: every slot freed (costs the slots, not the rows)."""
        self.slot_of[self.live_rows()] = 0
        self.n_handed = 1
        self._free = np.empty(0, dtype=np.int64)

    def _take(self, n: int) -> np.ndarray:
        """n slots, in the order they are handed out: freed ones first (the last freed
        first), then new ones (`kernels.write_rows` hands them out so too)."""
        self.make_room(n)
        k = min(n, int(self._free.size))
        ids = np.concatenate((self._free[self._free.size - k:],
                              np.arange(self.n_handed, self.n_handed + n - k, dtype=np.int64)))
        self.handed_out(n)
        return ids

    def make_room(self, n: int) -> None:
        """Room in the slot arrays for n slots more (the free list's first)."""
        hi = self.n_handed + n - min(n, int(self._free.size))
        if hi > self._cap:
            self._grow(hi)

    def handed_out(self, n: int) -> None:
        """n slots were handed out (`_take`'s order): the free list and the marks follow."""
        k = min(n, int(self._free.size))
        self._free = self._free[: self._free.size - k]
        self.n_handed += n - k
        self.pristine = max(self.pristine, self.n_handed)

    @property
    def free(self) -> np.ndarray:
        """The free list (slots below n_handed), the last freed last."""
        return self._free

    def _grow(self, need: int) -> None:
        """Capacity for `need` slots, by 1/SLOT_GROWTH at least. Each per-slot array
        lives in an anonymous memory map that grows in place (mremap): nothing is
        copied, and the spare capacity stays zero pages, never resident until a slot
        is used. Where a map cannot grow (a view of the array still alive, another
        platform) a new one is mapped and the slots copied."""
        new = min(self._max_slots, max(need, self._cap + self._cap // self.SLOT_GROWTH))
        self._tables = self._gens = None  # they hold the arrays: the maps could not grow
        for name, dtype, wide in self.SLOT_ARRAYS:
            width = getattr(self, wide) if isinstance(wide, str) else 1
            nbytes = new * width * np.dtype(dtype).itemsize
            setattr(self, name, None)  # drop the array's export of the map
            mm = self._maps.get(name)
            if mm is None:
                mm = _anonymous_map(nbytes)
            else:
                try:
                    mm.resize(nbytes)
                except (BufferError, OSError, SystemError, TypeError, ValueError):
                    fresh = _anonymous_map(nbytes)
                    memoryview(fresh)[: len(mm)] = memoryview(mm)
                    mm = fresh
            self._maps[name] = mm
            a = np.frombuffer(mm, dtype=dtype)
            setattr(self, name, a.reshape(new, width) if isinstance(wide, str) else a)
        self._cap = new

    # -- what the kernels are handed -------------------------------------------------------

    def check_generations(self, where: str) -> None:
        """The slot arrays the `fresh_groups` kernel reads (and `scatter_fresh` writes):
        int64, C-contiguous, `pool_of` kpool wide, with a row for every slot in use
        (true by construction). Checked whole when they are new, else only their room,
        as `check_tables`. Raises PlanError (`guards.py`)."""
        g = self._gens
        if (g is not None and g[0] is self.pool_of and g[1] is self.pool_gen
                and g[2] is self.key_gen and self.n_handed <= g[3]):
            return
        for name, a, shape in (("pool_of", self.pool_of, (self.kpool,)),
                               ("pool_gen", self.pool_gen, ()), ("key_gen", self.key_gen, ())):
            if (a.dtype != np.int64 or not a.flags.c_contiguous or a.shape[1:] != shape
                    or a.shape[0] < self.n_handed):
                raise PlanError(f"{where}: the {name} array is {a.dtype} {a.shape}, not a "
                                f"C-contiguous int64 array of {self.n_handed} slots"
                                + (f" x {self.kpool}" if shape else ""), where, name)
        self._gens = (self.pool_of, self.pool_gen, self.key_gen,
                      min(self.pool_of.shape[0], self.pool_gen.shape[0], self.key_gen.shape[0]))

    def check_tables(self, where: str) -> None:
        """The slot arrays a kernel reads and writes: C-contiguous, n_embd wide, float32
        (the gates int8: `SLOT_ARRAYS`), with a row for every slot in use (true by
        construction). Checked whole when they are new (`_grow` forgets the last
        ones), else only their room. Raises PlanError (`guards.py`)."""
        t = self._tables
        if (t is not None and t[0] is self.key and t[1] is self.gate and t[2] is self.pooled
                and self.n_handed <= t[3]):
            return
        dtypes = {name: dtype for name, dtype, _ in self.SLOT_ARRAYS}
        for name, a in (("key", self.key), ("gate", self.gate), ("pooled", self.pooled)):
            dtype = dtypes[name]
            if not is_rows(a, self.n_embd, dtype) or a.shape[0] < self.n_handed:
                raise PlanError(f"{where}: the {name} array is {a.dtype} {a.shape}, not a "
                                f"C-contiguous {np.dtype(dtype)} array of {self.n_handed} "
                                f"slots x {self.n_embd}", where, name)
        self._tables = (self.key, self.gate, self.pooled,
                        min(self.key.shape[0], self.gate.shape[0], self.pooled.shape[0]))
