"""The value backend: key, gate and pooled rows, and the per-ubatch value verdicts.

Owns, for the global rows (`n_rows = n_stream * kv_size`) that hold data:
- `key`, `gate`, `pooled`: float32 [slots, n_embd] (the cell's indexer key, its
  per-dimension gate logits, and the pooled slot a rep row holds), stored by *slot*:
  `slot_of[row]` is the row's slot, 0 for a row that holds zeros (never written,
  cleared, or copied from such a row). Slot 0 is the zero row, never written; a
  row gets a slot of its own the first time something non-zero may land in it
  (a decode's key write, a restore, a stream copy of a row with a slot, a scatter),
  keeps it until a `clear` (or a stream copy that zeroes it) frees it, and freed
  slots are reused. So memory follows the rows written, not kv_size * n_stream:
  a `clear` or a cross-stream copy costs the rows that have slots. The slot
  arrays grow in place in anonymous memory maps (`_grow`): their spare capacity is
  never resident;
- the pooling a slot's pooled row holds (`pool_of`, int64 [slots, kpool]: the member
  slots it was pooled from, valid when `pool_gen[slot] > 0`, the generation it was
  pooled at) and when each slot's key and gate last changed (`key_gen`). Every call
  that writes values takes a new generation (`_gen`). A scatter entry whose rep slot
  holds the pooling of the same member slots, none written since, keeps that value
  instead of pooling again (ENGINE.md §6: cache-safe re-pools every pool each
  ubatch; a pool whose members and keys did not change pools to the same bits);
- who last wrote each slot (`w_kind`, `w_ubatch`, `w_a`, `w_b`), for messages; a
  zero row's writer is its stream's (`NEVER`, `CLEARED` since a clear, `COPIED`
  since a cross-stream copy): zeroing a row that has no slot (only a pending
  copy's destination can be one) changes nothing a reader can see;
- `alt`: the rows whose last scatter was a race between entries of different
  values, with every racing entry's writer. Their values are not kept: a row
  with two different racing values reads wrong whatever its members pool to (at
  least one racing value differs from any single value), so it is bad until
  rewritten;
- the bad pools of every sequence (`bad[s]`, bool [n_pools of s]) and what changed
  since they were last checked, for the incremental verification (`_verify`)
  (per-row masks: 2 bytes a row, next to the cache's ~37).

Invariants:
- after `run_ubatch`, `bad[s][k]` is True exactly when the rep row of pool k of s
  differs from the pooling of the pool's current members with their current keys
  and gates, or is in `alt`; tests/test_backend_incremental.py recomputes that from
  scratch (`_differ` over every pool) and holds the two equal;
- the stored state is a function of the trace alone: the scatter picks one writer
  per row (the last entry) before any kernel runs, so thread order never matters;
  which slot a row gets never changes a value;
- `slot_row[slot]` is the row of every slot in use (-1 for a freed one), and
  `slot_of[slot_row[slot]] == slot`;
- where `pool_gen[r] > 0`, `pooled[r]` is bit-equal to the pooling of `pool_of[r]`
  and every member slot m has `key_gen[m] < pool_gen[r]`; a slot handed out, and
  every write of a pooled row but the scatter's, sets `pool_gen` to 0.

The kernels come from `kernels.py` (numba) or `reference.py` (numpy); both give
bit-identical arrays. They index the slot arrays with slots, never rows.

Kernel safety: the kernels never check an index (numba does not,
unless NUMBA_BOUNDSCHECK=1), so nothing reaches them unchecked. The rows the replay
hands in (a decode's rows, the plan's entries, the layout's rep and member rows)
are checked where they come in (`_rows`: integers, the right shape, each in
[0, n_rows), distinct where one writer per row is assumed), and every kernel runs
through a `_k_*` method that checks what it is handed against the arrays it will
read and write (`_index`: slots in use, sources within the values, shapes that
agree). A bad index raises `PlanError` naming the array, the element and the row
or slot, before any kernel runs: a bug in a plan is an error with a message, never
a write outside an array. The checks are a min and a max per array (in Python for
the few elements of a decode's arrays; a sort where rows must be distinct): about
8 us of CPU a one-token ubatch, under 2% of the backend benchmark's replay.

Memory: `bytes_held()` says what an instance holds, `ValueBackend.bytes_bound`
what a trace can make it hold (`budget.py` adds the other parts of a replay).
"""

from __future__ import annotations

import mmap
import time
from collections import defaultdict
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ..cache.cells import global_row
from ..cache.kv import Reach
from ..engine.context import UbatchContext
from ..engine.layout import Layout, LayoutChange
from ..signals import masked
from ..trace.model import CacheConfig, Trace
from .facts import (
    CLEARED,
    COPIED,
    DECODE_ZERO,
    DROP_ZERO,
    NEVER,
    PADDING,
    POOLED,
    RESTORED,
    RowContent,
    ValueFacts,
    groups_equal,
)
from .keys import seed_state

BACKENDS = ("numba", "numpy", "none")
DEFAULT_BACKEND = "numba"



def kernel_module(name: str) -> ModuleType:
    """The kernels of backend `name` ("numba" imports numba: do it only when asked)."""
    if name == "numba":
        with masked():  # numba compiles while kernels.py is imported
            from . import kernels
        return kernels
    if name == "numpy":
        from . import reference
        return reference
    raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")


def make_backend(name: str, trace: Trace) -> ValueBackend | None:
    """The backend for `kpool replay --backend NAME` (None for "none")."""
    if name == "none":
        return None
    return ValueBackend(trace.cache, trace.seed, name)


def _i64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


class PlanError(Exception):
    """Indices a value kernel would be handed that are not inside its arrays (or that
    break its one-writer-per-row contract): a bug in kpool's engine or backend (the
    plan, the layout, the slot map), raised before any kernel runs. `where` is the
    step or kernel, `name` the index array at fault."""

    def __init__(self, message: str, where: str, name: str) -> None:
        super().__init__(message, where, name)  # every argument: it pickles (diff -j)
        self.where, self.name = where, name

    def __str__(self) -> str:
        return str(self.args[0])


# arrays up to this size are checked in Python (tolist, min, max, set): a numpy
# reduction costs about a microsecond even on one element, and most arrays of a
# decode's ubatch have a handful
_SMALL = 32
_I64 = np.dtype(np.int64)
ANY = None  # the `shape` of a 1-D index array of any length


def _rows_of(a: np.ndarray, width: int) -> bool:
    """`a` is a C-contiguous float32 array of rows `width` wide (by its strides)."""
    return (type(a) is np.ndarray and a.dtype == np.float32 and a.ndim == 2
            and a.shape[1] == width and a.strides == (4 * width, 4))


def _index(a, lo: int | None, hi: int, shape: tuple[int | None, ...] | None,
           distinct: bool, where: str, name: str, unit: str) -> np.ndarray:
    """`a` as int64, C-contiguous, after checking it: integers of shape `shape` (ANY:
    1-D, any length; a first size None: any), every element in [lo, hi) (lo None:
    any value), and no element twice when `distinct` (1-D). Raises PlanError naming
    the element at fault; `where` is the step, `name` the array, `unit` what an
    element is ("row", "slot", "entry"). Positional, and the common case first: it
    runs about ten times a ubatch."""
    if type(a) is not np.ndarray or a.dtype is not _I64:
        a = _as_int64(a, where, name, unit)
    got = a.shape
    if (len(got) != 1 if shape is None else got != shape and (
            shape[0] is not None or len(got) != len(shape) or got[1:] != shape[1:])):
        raise _shape_error(got, shape, where, name)
    a = np.ascontiguousarray(a)  # `a` itself when it already is
    if lo is None:
        return a
    n = a.size
    if n <= _SMALL:
        if n == 0:
            return a
        values = a.tolist() if len(got) == 1 else a.ravel().tolist()
        if (min(values) >= lo and max(values) < hi
                and (not distinct or n == 1 or len(set(values)) == n)):
            return a
    elif int(a.min()) >= lo and int(a.max()) < hi and (not distinct or _distinct(a)):
        return a
    raise _index_error(a, lo, hi, where, name, unit)


def _groups_of(rep: np.ndarray, order: np.ndarray, starts: np.ndarray, rows: np.ndarray
               ) -> bool:
    """(order, starts, rows) are race groups of `rep` (checked rows): `rows` ascending,
    group g = `order[starts[g]:starts[g + 1]]`, non-empty, every entry of it writing
    `rows[g]`. Then the rows the scatter takes from the groups are rows of `rep`,
    each once. A check, not the grouping: O(n), no sort."""
    n = rep.size
    if order.shape != (n,) or starts.shape != (rows.size + 1,) or rows.ndim != 1:
        return False
    if n == 0:
        return True
    sizes = np.diff(starts)
    return bool(starts[0] == 0 and starts[-1] == n and np.all(sizes > 0)
                and np.all(rows[1:] > rows[:-1])
                and np.array_equal(rep[order], np.repeat(rows, sizes)))


def _shape_error(got: tuple[int, ...], shape: tuple[int | None, ...] | None, where: str,
                 name: str) -> PlanError:
    sizes = ["n" if w is None else str(w) for w in shape or (None,)]
    want = f"({sizes[0]},)" if len(sizes) == 1 else f"({', '.join(sizes)})"
    return PlanError(f"{where}: {name} has shape {got}, expected shape {want}", where, name)


def _as_int64(a, where: str, name: str, unit: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise PlanError(f"{where}: {name} holds {a.dtype} values, not {unit} numbers",
                        where, name)
    return a.astype(np.int64)  # an unsigned value past int64 turns negative: refused


def _distinct(a: np.ndarray) -> bool:
    srt = np.sort(a, axis=None)
    return not np.any(srt[1:] == srt[:-1])


def _index_error(a: np.ndarray, lo: int, hi: int, where: str, name: str, unit: str
                 ) -> PlanError:
    """The PlanError of an index array `_index` refused: its first element out of
    [lo, hi), else its first repeated element."""
    flat = a.ravel()
    out = np.flatnonzero((flat < lo) | (flat >= hi))
    if out.size:
        bad = int(out[0])
        at = ", ".join(str(int(i)) for i in np.unravel_index(bad, a.shape))
        units = unit[:-1] + "ies" if unit.endswith("y") else unit + "s"
        valid = f"{units} {lo}..{hi - 1}" if hi > lo else f"no {unit} at all"
        return PlanError(f"{where}: {name}[{at}] is {unit} {int(flat[bad])}, but it may "
                         f"only name {valid} (a bug in kpool: no kernel was run)", where, name)
    srt = np.sort(flat)
    dup = int(srt[np.flatnonzero(srt[1:] == srt[:-1])[0]])
    return PlanError(f"{where}: {unit} {dup} is in {name} more than once (the kernel "
                     f"takes one writer per {unit})", where, name)


def _anonymous_map(nbytes: int) -> mmap.mmap:
    """Zeroed private memory (MAP_PRIVATE: a shared anonymous map cannot grow past its
    first size; Windows has no flags)."""
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    return mmap.mmap(-1, nbytes)


def _slot_dtype(n_rows: int) -> type:
    """The row -> slot map's dtype: slots go up to n_rows (slot 0 is the zero row)."""
    return np.int32 if n_rows < np.iinfo(np.int32).max else np.int64


@dataclass(slots=True)
class _Saved:
    """A state_write's rows: their arrays and racing writers, in snapshot order."""

    key: np.ndarray
    gate: np.ndarray
    pooled: np.ndarray
    alt: dict[int, np.ndarray]  # snapshot index -> racing writers

    def nbytes(self) -> int:
        return (self.key.nbytes + self.gate.nbytes + self.pooled.nbytes
                + sum(ValueBackend.ALT_ROW_BYTES + w.nbytes for w in self.alt.values()))


class ValueBackend:
    """Key rows, pooling, scatter and gather for one replay, and KP001 values / KP003."""

    SLOTS_MIN = 64  # slot capacity allocated up front (the zero row included)
    # capacity grows by 1/SLOT_GROWTH at least, in place (`_grow`)
    SLOT_GROWTH = 8
    # the per-slot arrays: name, dtype, row width ("n_embd", "kpool", or 1)
    SLOT_ARRAYS = (("key", np.float32, "n_embd"), ("gate", np.float32, "n_embd"),
                   ("pooled", np.float32, "n_embd"), ("w_kind", np.int8, 1),
                   ("w_ubatch", np.int64, 1), ("w_a", np.int64, 1), ("w_b", np.int64, 1),
                   ("slot_row", np.int64, 1), ("key_gen", np.int64, 1),
                   ("pool_gen", np.int64, 1), ("pool_of", np.int64, "kpool"))
    # bytes per slot besides its three float32 rows and pool_of (8 kpool): w_kind,
    # w_ubatch, w_a, w_b, slot_row, key_gen, pool_gen
    SLOT_BYTES = 1 + 8 + 8 + 8 + 8 + 8 + 8
    # bytes per global row: the row -> slot map (its dtype's size comes on top of
    # these), the two dirty masks
    ROW_BYTES = 2
    # an `alt` entry besides its writers (int64 [g, 2]): the dict slot, the array header
    ALT_ROW_BYTES = 256

    def __init__(self, config: CacheConfig, seed: int, kernels: str = DEFAULT_BACKEND) -> None:
        self.name = kernels
        self.k = kernel_module(kernels)
        self.config = config
        self.kpool, self.kv_size = config.kpool, config.kv_size
        self.n_rows, self.n_embd = config.n_rows, config.n_embd
        self.state = seed_state(seed)
        # rows -> slots, and what each slot holds (see the module docstring)
        self.slot_of: np.ndarray = np.zeros(self.n_rows, dtype=_slot_dtype(self.n_rows))
        self._max_slots = self.n_rows + 1
        self._cap = 0
        self._maps: dict[str, mmap.mmap] = {}
        self._tables: tuple | None = None  # key, gate, pooled as last checked, their rows
        self.key = self.gate = self.pooled = np.empty((0, self.n_embd), dtype=np.float32)
        self.w_kind = np.empty(0, dtype=np.int8)
        self.w_ubatch = self.w_a = self.w_b = self.slot_row = np.empty(0, dtype=np.int64)
        self.key_gen = self.pool_gen = np.empty(0, dtype=np.int64)
        self.pool_of = np.empty((0, self.kpool), dtype=np.int64)
        self._gen = 0  # the generation of the last call that wrote values
        # key, gate, pooled: [slots, n_embd] float32 | slot, d | key, gate logit, pooled
        # w_kind [slots] int8 (NEVER, POOLED, ...), w_ubatch (when), w_a (seq / src
        # stream / slot index), w_b (k); slot_row [slots] int64: its row, or -1
        self._grow(min(self.SLOTS_MIN, self._max_slots))
        self._n_slots = 1  # slots [0, _n_slots) handed out since the last clear
        self._free = np.empty(0, dtype=np.int64)  # freed slots below _n_slots
        # the writer of a zero row (slot 0), per stream
        n_stream = config.n_stream
        self._zero_kind = np.full(n_stream, NEVER, dtype=np.int8)
        self._zero_ubatch = np.full(n_stream, -1, dtype=np.int64)
        self._zero_a = np.full(n_stream, -1, dtype=np.int64)
        self.alt: dict[int, np.ndarray] = {}  # row -> racing writers, int64 [g, 2]
        self.snapshots: dict[str, _Saved] = {}
        self.slot_names: list[str] = []
        self.n_ubatch = 0  # run_ubatch calls so far: the index of the current ubatch
        self.bad = [np.zeros(0, dtype=bool) for _ in range(config.n_seq_max)]
        # what changed since the last check: rows whose key/gate changed, rows whose
        # pooled slot changed (masks and the rows set in them), or everything
        self._kdirty = np.zeros(self.n_rows, dtype=bool)
        self._pdirty = np.zeros(self.n_rows, dtype=bool)
        self._kdirty_rows: list[np.ndarray] = []
        self._pdirty_rows: list[np.ndarray] = []
        self._all_dirty = False
        self.kernel_time: dict[str, float] = defaultdict(float)
        self.pools_checked = 0
        self.pools_kept = 0  # scatter entries that kept their rep slot's pooling

    # -- memory --------------------------------------------------------------------------

    @classmethod
    def bytes_bound(cls, config: CacheConfig, reach: Reach, kernels: str) -> int:
        """Bytes a backend can hold in a replay that reaches `reach`, temporaries of one
        ubatch included.

        Fixed: per global row the slot map and the two dirty masks. Slots: at most
        one per row that gets data, so at most `reach.value_rows` (rows the cache
        writes, padding rows, copies of both); capacity grows by 1/SLOT_GROWTH (in
        place) up to that. `alt`: at most an entry per row with a slot, a writer per
        sequence (and row 0's padding under row-zero padding, a writer per entry).
        Snapshots: their rows whole. One ubatch: its entries' pooled values and
        member slots (the numpy twin's pooling also keeps kpool-wide gate copies and
        weights: about 3 kpool + 12 rows an entry); a ubatch has at most every pool
        + 64 entries (`marking.pad_bound`), and a sequence holds at most
        `reach.cells` cells, a kpool-th of them pools."""
        n_rows, e, kpool = config.n_rows, config.n_embd, config.kpool
        n_col = config.n_seq_max if config.unified else 1
        row_bytes = 3 * 4 * e  # key, gate, pooled
        fixed = n_rows * (cls.ROW_BYTES + np.dtype(_slot_dtype(n_rows)).itemsize)
        slots = min(cls._max_slots_of(config), 1 + reach.value_rows)
        cap = min(cls._max_slots_of(config),
                  max(cls.SLOTS_MIN, slots + slots // cls.SLOT_GROWTH + 1))
        entries = config.n_seq_max * (reach.cells // kpool) + 64
        per_alt = cls.ALT_ROW_BYTES + 16 * n_col
        held = (cap * (row_bytes + cls.SLOT_BYTES + 8 * kpool)
                + 8 * slots  # the free list
                + (slots - 1) * per_alt + 16 * entries  # alt
                + reach.snapshot_rows * (row_bytes + per_alt))  # snapshots
        per_entry = 4 * e * (1 if kernels == "numba" else 3 * kpool + 12) + 3 * 8 * kpool
        temp = entries * per_entry + 8 * 8 * reach.decode_tokens  # + a ubatch's dirty rows
        return fixed + held + temp

    @staticmethod
    def _max_slots_of(config: CacheConfig) -> int:
        return config.n_rows + 1

    def bytes_held(self) -> int:
        """Bytes of the arrays this backend holds now (snapshots and racing writers
        included; the dirty-row lists of one ubatch and Python objects not)."""
        arrays = (self.slot_of, self._free, self._kdirty, self._pdirty,
                  *(getattr(self, name) for name, _, _ in self.SLOT_ARRAYS))
        return (sum(a.nbytes for a in arrays)
                + sum(self.ALT_ROW_BYTES + w.nbytes for w in self.alt.values())
                + sum(sv.nbytes() for sv in self.snapshots.values()))

    @property
    def n_slots(self) -> int:
        """Slots in use (the zero row not counted)."""
        return self._n_slots - 1 - int(self._free.size)

    def row_values(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """A copy of the `name` ("key", "gate" or "pooled") rows `rows` (every row when
        None: for small caches), float32 [len(rows), n_embd]."""
        if name not in ("key", "gate", "pooled"):
            raise ValueError(f"no row array {name!r}")
        rows = (np.arange(self.n_rows) if rows is None
                else self._rows(rows, ANY, False, "row_values", "rows"))
        return getattr(self, name)[self._slots(rows)]

    # -- checks (kernel safety: the module docstring) ----------------------------------

    def _rows(self, rows, shape: tuple[int | None, ...] | None, distinct: bool, where: str,
              name: str) -> np.ndarray:
        """Rows handed in by the replay, checked (`_index`): every one in [0, n_rows)."""
        return _index(rows, 0, self.n_rows, shape, distinct, where, name, "row")

    def _check_tables(self, where: str) -> None:
        """The slot arrays a kernel reads and writes: float32, C-contiguous, n_embd
        wide, with a row for every slot in use (true by construction). Checked whole
        when they are new (`_grow` forgets the last ones), else only their room."""
        t = self._tables
        if (t is not None and t[0] is self.key and t[1] is self.gate and t[2] is self.pooled
                and self._n_slots <= t[3]):
            return
        for name, a in (("key", self.key), ("gate", self.gate), ("pooled", self.pooled)):
            if not _rows_of(a, self.n_embd) or a.shape[0] < self._n_slots:
                raise PlanError(f"{where}: the {name} array is {a.dtype} {a.shape}, not a "
                                f"C-contiguous float32 array of {self._n_slots} slots x "
                                f"{self.n_embd}", where, name)
        self._tables = (self.key, self.gate, self.pooled,
                        min(self.key.shape[0], self.gate.shape[0], self.pooled.shape[0]))

    # -- the kernels, each behind its checks: slots in [first, slots in use) -----------------

    def _k_write_keys(self, s: np.ndarray, key_ids: np.ndarray) -> None:
        where = "write_keys"
        self._check_tables(where)
        s = _index(s, 1, self._n_slots, ANY, True, where, "slots", "slot")
        if type(key_ids) is not np.ndarray or key_ids.dtype is not _I64 \
                or key_ids.shape != s.shape or not key_ids.flags.c_contiguous:
            key_ids = _index(key_ids, None, 0, s.shape, False, where, "key_ids", "key id")
        self._timed(where, self.k.write_keys, self.state, s, key_ids, self.key, self.gate)

    def _k_pool(self, members: np.ndarray) -> np.ndarray:
        where = "pool"
        self._check_tables(where)
        members = _index(members, 0, self._n_slots, (None, self.kpool), False, where,
                         "member slots", "slot")
        return self._timed(where, self.k.pool, self.key, self.gate, members)

    def _k_scatter(self, s: np.ndarray, vals: np.ndarray, src: np.ndarray) -> None:
        where = "scatter"
        self._check_tables(where)
        s = _index(s, 1, self._n_slots, ANY, True, where, "slots", "slot")
        if not _rows_of(vals, self.n_embd):
            raise PlanError(f"{where}: the values are {vals.dtype} {vals.shape}, not a "
                            f"C-contiguous float32 array of n x {self.n_embd}", where, "values")
        src = _index(src, 0, vals.shape[0], s.shape, False, where, "sources", "entry")
        self._timed(where, self.k.scatter, self.pooled, s, vals, src)

    def _k_gather(self, s: np.ndarray) -> np.ndarray:
        where = "gather"
        self._check_tables(where)
        s = _index(s, 0, self._n_slots, ANY, False, where, "slots", "slot")
        return self._timed(where, self.k.gather, self.pooled, s)

    def _k_pools_differ(self, members: np.ndarray, reps: np.ndarray) -> np.ndarray:
        where = "check"
        self._check_tables(where)
        members = _index(members, 0, self._n_slots, (None, self.kpool), False, where,
                         "member slots", "slot")
        reps = _index(reps, 0, self._n_slots, members.shape[:1], False, where, "rep slots",
                      "slot")
        return self._timed(where, self.k.pools_differ, self.key, self.gate, self.pooled,
                           members, reps)

    # -- slots ---------------------------------------------------------------------------

    def _slots(self, rows: np.ndarray) -> np.ndarray:
        """The slots of `rows` (any shape; 0 for a zero row), int64, C-contiguous."""
        return self.slot_of[rows].astype(np.int64)

    def _own(self, rows: np.ndarray, zero_new: bool) -> np.ndarray:
        """The slots of `rows` (distinct), giving each zero row a slot of its own; the
        new slots hold zeros when `zero_new` (else the caller writes all three rows)."""
        s = self._slots(rows)
        new = np.flatnonzero(s == 0)
        if new.size:
            ids = self._take(int(new.size))
            r = rows[new]
            self.slot_of[r] = ids
            self.slot_row[ids] = r
            self._wrote(ids)
            s[new] = ids
            if zero_new:
                for a in (self.key, self.gate, self.pooled):
                    a[ids] = 0
        return s

    def _take(self, n: int) -> np.ndarray:
        k = min(n, int(self._free.size))
        ids = self._free[self._free.size - k:].copy()
        self._free = self._free[: self._free.size - k]
        if n > k:
            hi = self._n_slots + n - k
            if hi > self._cap:
                self._grow(hi)
            ids = np.concatenate((ids, np.arange(self._n_slots, hi, dtype=np.int64)))
            self._n_slots = hi
        return ids

    def _grow(self, need: int) -> None:
        """Capacity for `need` slots, by 1/SLOT_GROWTH at least. Each per-slot array
        lives in an anonymous memory map that grows in place (mremap): nothing is
        copied, and the spare capacity stays zero pages, never resident until a slot
        is used. Where a map cannot grow (a view of the array still alive, another
        platform) a new one is mapped and the slots copied."""
        new = min(self._max_slots, max(need, self._cap + self._cap // self.SLOT_GROWTH))
        self._tables = None  # it holds the arrays: the maps could not grow in place
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

    def _release(self, rows: np.ndarray) -> None:
        """Rows with a slot become zero rows; their slots are free for reuse."""
        if rows.size:
            s = self._slots(rows)
            self.slot_of[rows] = 0
            self.slot_row[s] = -1
            self._free = np.concatenate((self._free, s))

    def _live_rows(self) -> np.ndarray:
        """Every row with a slot (O(slots))."""
        r = self.slot_row[1:self._n_slots]
        return r[r >= 0]

    # -- timing ---------------------------------------------------------------------------

    def _timed(self, name: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.kernel_time[name] += time.perf_counter() - t0
        return out

    # -- change tracking -------------------------------------------------------------------

    def _touch(self, rows: np.ndarray, key: bool, pooled: bool) -> None:
        if key:
            self._kdirty[rows] = True
            self._kdirty_rows.append(rows)
        if pooled:
            self._pdirty[rows] = True
            self._pdirty_rows.append(rows)

    def _next_gen(self) -> None:
        """A call that writes values begins: writes from here on are newer than any
        pooling kept so far."""
        self._gen += 1

    def _wrote(self, slots: np.ndarray) -> None:
        """`slots` got new keys and gates (or zeros), and a pooled row that is no
        pooling they know of."""
        self.key_gen[slots] = self._gen
        self.pool_gen[slots] = 0

    def _set_writer(self, slots: np.ndarray, kind: int, a=-1, b=-1) -> None:
        self.w_kind[slots] = kind
        self.w_ubatch[slots] = self.n_ubatch
        self.w_a[slots] = a
        self.w_b[slots] = b

    def _drop_alt(self, rows: np.ndarray) -> None:
        if self.alt and rows.size:
            for r in rows.tolist():
                self.alt.pop(r, None)

    # -- the Backend protocol (kpool_cli.replay) ----------------------------------------------

    def write_rows(self, rows: np.ndarray, key_ids: np.ndarray) -> None:
        """A ubatch's cells are written: new key and gate rows, pooled slots zeroed."""
        rows = self._rows(rows, ANY, True, "write_rows", "rows")
        key_ids = _index(key_ids, None, 0, rows.shape, False, "write_rows", "key_ids", "key id")
        self._next_gen()
        s = self._own(rows, zero_new=False)
        self._k_write_keys(s, key_ids)
        self.pooled[s] = 0
        self._wrote(s)
        self._set_writer(s, DECODE_ZERO)
        self._drop_alt(rows)
        self._touch(rows, True, True)

    def zero_rows(self, rows: np.ndarray) -> None:
        """state_drop: rows only the dropped sequence held are zeroed whole (a zero row
        already is: see the module docstring)."""
        rows = self._rows(rows, ANY, True, "zero_rows", "rows")
        s = self._slots(rows)
        has = s > 0
        rows, s = rows[has], s[has]
        self._next_gen()
        self._wrote(s)
        self.key[s] = 0
        self.gate[s] = 0
        self.pooled[s] = 0
        self._set_writer(s, DROP_ZERO)
        self._drop_alt(rows)
        self._touch(rows, True, True)

    def copy_stream(self, src: int, dst: int) -> None:
        """Cross-stream seq_cp: every row of stream src (pooled slots included) to dst.
        Costs the rows of the two streams that have slots."""
        n_stream = self.config.n_stream
        for name, strm in (("src", src), ("dst", dst)):
            if not 0 <= strm < n_stream:
                raise PlanError(f"copy_stream: {name} is stream {strm}, outside the "
                                f"{n_stream} streams 0..{n_stream - 1}", "copy_stream", name)
        kv = self.kv_size
        self._next_gen()
        live = self._live_rows()
        src_rows = live[(live >= src * kv) & (live < (src + 1) * kv)]
        dst_old = live[(live >= dst * kv) & (live < (dst + 1) * kv)]
        # a destination row whose source is a zero row becomes one
        gone = dst_old[self.slot_of[dst_old + (src - dst) * kv] == 0]
        self._release(gone)
        dst_rows = src_rows + (dst - src) * kv
        s_src = self._slots(src_rows)
        s_dst = self._own(dst_rows, zero_new=False)
        for a in (self.key, self.gate, self.pooled):
            a[s_dst] = a[s_src]
        self._wrote(s_dst)
        self._set_writer(s_dst, COPIED, src)
        self._zero_kind[dst], self._zero_ubatch[dst], self._zero_a[dst] = (
            COPIED, self.n_ubatch, src)
        for r in [r for r in self.alt if dst * kv <= r < (dst + 1) * kv]:
            del self.alt[r]
        for r, v in [(r, v) for r, v in self.alt.items() if src * kv <= r < (src + 1) * kv]:
            self.alt[r - src * kv + dst * kv] = v
        self._touch(np.concatenate((gone, dst_rows)), True, True)

    def snapshot(self, slot: str, rows: np.ndarray) -> None:
        """state_write: save the rows whole (pooled slots included), in snapshot order."""
        rows = self._rows(rows, ANY, True, "snapshot", "rows")
        s = self._slots(rows)
        alt = {i: self.alt[r] for i, r in enumerate(rows.tolist()) if r in self.alt}
        self.snapshots[slot] = _Saved(self.key[s], self.gate[s], self.pooled[s], alt)

    def restore(self, slot: str, rows: np.ndarray) -> None:
        """state_read: the saved rows come back whole into `rows` (snapshot order)."""
        rows = self._rows(rows, ANY, True, "restore", "rows")
        saved = self.snapshots[slot]
        if rows.size != saved.key.shape[0]:
            raise PlanError(f"restore: {rows.size} rows for snapshot {slot!r} of "
                            f"{saved.key.shape[0]}", "restore", "rows")
        self._next_gen()
        s = self._own(rows, zero_new=False)
        self._wrote(s)
        self.key[s] = saved.key
        self.gate[s] = saved.gate
        self.pooled[s] = saved.pooled
        if slot not in self.slot_names:
            self.slot_names.append(slot)
        self._set_writer(s, RESTORED, self.slot_names.index(slot))
        self._drop_alt(rows)
        for i, v in saved.alt.items():
            self.alt[int(rows[i])] = v
        self._touch(rows, True, True)

    def clear(self) -> None:
        """Every row zeroed: every slot freed (costs the slots, not the rows)."""
        self.slot_of[self._live_rows()] = 0
        self._n_slots = 1
        self._free = np.empty(0, dtype=np.int64)
        self._zero_kind[:] = CLEARED
        self._zero_ubatch[:] = self.n_ubatch
        self._zero_a[:] = -1
        self.alt.clear()
        self._all_dirty = True

    def run_ubatch(self, ctx: UbatchContext) -> ValueFacts:
        """Pool the new entries of the ubatch of `ctx` (which has a plan), scatter them,
        verify what changed (`ctx.change`: the layout update's). Returns the facts the
        rules read: which race groups write equal values, the bad pools of every
        sequence, and what the first bad pool of each holds."""
        equal = self._scatter(ctx)
        self._verify(ctx.layout, ctx.change)
        first_bad = {}
        for s, b in enumerate(self.bad):
            if b.size and b.any():
                k = int(np.argmax(b))
                row = int(ctx.layout.seqs[s].rep_rows.view[k])
                first_bad[s] = (k, row, self.content(row))
        self.n_ubatch += 1
        return ValueFacts(equal, tuple(self.bad), first_bad)

    # -- pool and scatter (ENGINE.md §1 step 4) ----------------------------------------------

    def _scatter(self, ctx: UbatchContext) -> np.ndarray:
        """Pool every entry of `ctx.plan`, store the last entry's value per row (set_rows
        run sequentially; rows and their entries are the context's race groups),
        remember the racing writers. Returns [n_groups] bool: the entries of each race
        group write equal values (`values.groups_equal`)."""
        layout, plan = ctx.layout, ctx.plan
        assert plan is not None  # the replay runs a backend on a plan only
        rep = self._rows(plan.entry_rep, ANY, False, "run_ubatch", "the plan's entry_rep")
        n = rep.size
        entry_rows = self._rows(plan.entry_rows, (n, self.kpool), False, "run_ubatch",
                                "the plan's entry_rows")
        _index(plan.entry_pool, -1, layout.n_pool_real, rep.shape, False, "run_ubatch",
               "the plan's entry_pool", "pool")
        if not _groups_of(rep, ctx.order, ctx.starts, ctx.rows):
            raise PlanError("run_ubatch: the context's race groups are not those of the "
                            "plan's entry_rep", "run_ubatch", "the context's race groups")
        self._next_gen()
        members = self._slots(entry_rows)
        vals = self._pool_or_keep(members, self._slots(rep))
        if n == 0:
            return np.ones(0, dtype=bool)
        order, starts, rows = ctx.order, ctx.starts, ctx.rows
        win = order[starts[1:] - 1]  # the last entry of each row's group
        rows = _i64(rows)
        s = self._own(rows, zero_new=True)
        had_alt = np.isin(rows, np.fromiter(self.alt, dtype=np.int64, count=len(self.alt)))
        before = self.pooled[s].view(np.uint32).copy()
        self._k_scatter(s, vals, win)
        self.pool_of[s] = members[win]
        self.pool_gen[s] = self._gen
        # a row that got the value it held changes no verdict: only the others (and the
        # rows whose racing writers change) are re-checked
        changed = np.any(self.pooled[s].view(np.uint32) != before, axis=1) | had_alt
        pools = plan.entry_pool[win]
        real = pools >= 0
        self._set_writer(s[~real], PADDING)
        if real.any():
            seq, k = layout.locate(pools[real])
            self._set_writer(s[real], POOLED, seq, k)
        self._drop_alt(rows)
        equal = np.ones(rows.size, dtype=bool)
        if rows.size < n:  # some row has several writers
            equal = groups_equal(vals.view(np.uint32), entry_rows, order, starts)
            unequal = np.flatnonzero(~equal)
            if unequal.size:
                writers = ctx.writers()
                for g in unequal.tolist():
                    self.alt[int(rows[g])] = writers[order[starts[g]:starts[g + 1]]].copy()
                changed[unequal] = True
        self._touch(rows[changed], False, True)
        return equal

    def _pool_or_keep(self, members: np.ndarray, reps: np.ndarray) -> np.ndarray:
        """The pooled value of each entry (member slots `members`, rep slots `reps`):
        the value its rep slot holds where that is the pooling of the same member
        slots and none of them was written since (`pool_of`, `pool_gen`), else pooled
        now. Bit-equal to pooling every entry (the module's invariants)."""
        if members.shape[0] == 0:
            return self._k_pool(members)
        gen = self.pool_gen[reps]
        keep = (gen > 0) & np.all(self.pool_of[reps] == members, axis=1)
        keep[keep] &= self.key_gen[members[keep]].max(axis=1) < gen[keep]
        if not keep.any():
            return self._k_pool(members)
        vals = self._k_gather(reps)  # a kept entry's rep slot: in use (gen > 0)
        fresh = np.flatnonzero(~keep)
        if fresh.size:
            vals[fresh] = self._k_pool(np.ascontiguousarray(members[fresh]))
        self.pools_kept += int(members.shape[0] - fresh.size)
        return vals

    # -- verification (only what changed) -----------------------------------------------------

    def _differ(self, members: np.ndarray, reps: np.ndarray) -> np.ndarray:
        """[n] bool: rep row differs from the pooling, or raced with different values
        (then one of them differs from any pooling)."""
        members = self._rows(members, (None, self.kpool), False, "check", "member rows")
        reps = self._rows(reps, members.shape[:1], False, "check", "rep rows")
        bad = self._k_pools_differ(self._slots(members), self._slots(reps))
        if self.alt:
            bad |= np.isin(reps, np.fromiter(self.alt, dtype=np.int64, count=len(self.alt)))
        return bad

    def _candidates(self, layout: Layout, change: LayoutChange, s: int) -> np.ndarray | None:
        """Pools of s to recheck, or None for all of them. `bad[s]` has been cut to the
        pools the update kept."""
        sq = layout.seqs[s]
        n_p = len(sq.pools)
        if self._all_dirty:
            return None
        parts = [change.new_pools(s, n_p)]
        if self._pdirty_rows:
            parts.append(np.flatnonzero(self._pdirty[sq.rep_rows.view]))
        if self._kdirty_rows and n_p:
            rows = global_row(sq.strm, sq.cells, self.kv_size)
            j = np.flatnonzero(self._kdirty[rows])
            if j.size:
                starts = sq.pools.view
                k = np.searchsorted(starts, j, side="right") - 1
                ok = k >= 0
                ok[ok] &= j[ok] < starts[k[ok]] + self.kpool
                parts.append(k[ok])
        return np.unique(np.concatenate(parts))

    def _verify(self, layout: Layout, change: LayoutChange) -> None:
        """Recheck the pools whose verdict may have changed since the last ubatch: the
        new or regrouped ones, and those whose member keys or rep row changed."""
        for s, sq in enumerate(layout.seqs):
            n_p = len(sq.pools)
            self.bad[s] = self.bad[s][:change.kept[s]]
            cand = self._candidates(layout, change, s)
            if cand is None:
                self.bad[s] = np.zeros(n_p, dtype=bool)
                cand = np.arange(n_p, dtype=np.int64)
            elif self.bad[s].size < n_p:
                self.bad[s] = np.concatenate(
                    (self.bad[s], np.zeros(n_p - self.bad[s].size, dtype=bool)))
            if cand.size:
                self.pools_checked += int(cand.size)
                members = sq.members(cand, self.kpool, self.kv_size)
                self.bad[s][cand] = self._differ(members, sq.rep_rows.view[cand])
        for rows in self._kdirty_rows:
            self._kdirty[rows] = False
        for rows in self._pdirty_rows:
            self._pdirty[rows] = False
        self._kdirty_rows.clear()
        self._pdirty_rows.clear()
        self._all_dirty = False

    def gather(self, layout: Layout) -> np.ndarray:
        """[n_pool_real, n_embd] float32: every pool's row through pool_cells
        (ggml_get_rows), as the graph reads them."""
        rows = self._rows(layout.pool_cells(), ANY, False, "gather", "the layout's pool_cells")
        return self._k_gather(self._slots(rows))

    # -- what a row holds --------------------------------------------------------------

    def content(self, row: int) -> RowContent:
        """What row `row`'s pooled slot holds, and who wrote it."""
        slot = int(self.slot_of[row])
        if slot:
            kind, when = int(self.w_kind[slot]), int(self.w_ubatch[slot])
            a, b = int(self.w_a[slot]), int(self.w_b[slot])
        else:  # a zero row: its stream's writer
            strm = row // self.kv_size
            kind, when = int(self._zero_kind[strm]), int(self._zero_ubatch[strm])
            a, b = int(self._zero_a[strm]), -1
        racers = (tuple((int(w[0]), int(w[1])) for w in self.alt[row].tolist())
                  if row in self.alt else ())
        return RowContent(kind, when, a, b, self.slot_names[a] if kind == RESTORED else "",
                          racers)
