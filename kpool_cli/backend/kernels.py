"""The numba kernels of the value backend: key rows (`write_rows`: a decode's rows
written, their slots handed out and their writers stamped, in one pass), pool and
scatter (`scatter_fresh`: a scatter's fresh groups pooled, written and compared in
one pass), gather, check (`pools_differ`: a rep row that holds its pooling by the
slots' generations is judged without pooling again; its numpy twin pools every entry,
the oracle; `rows_differ`, the same of entries given by rows, read through the slot
map in the pass), `fresh_groups` (which scatter entries keep their pooling),
`stamp_winners` (the writer of each row a scatter wrote), the three at once for a
scatter of race groups of one entry each (`scatter_singles`, rep-once's plans), the
pools a changed row dirties (`dirty_pools`, `pools_of_pairs`, `held_pairs`), the
verification's choices for every sequence at once (`recheck_ways`, `least_pair`:
recheck.py), the verification of a layout of one sequence in one pass where its
way is NONE or NEW (`recheck_one`: that rule, then `rows_differ` of its new pools),
the same of a layout of many sequences and one stream where every way is NONE or NEW
(`recheck_many`: that rule, the test of the changed pairs each sequence holds, then
`rows_differ` of each one's new pools, read in the layout's flat columns), and a
ubatch of one sequence in one pass (`one_step`: `write_rows`, `scatter_singles`
and `recheck_one` in turn, each part as its own kernel runs it, stopping at the first
that hands back).

Owns: the value backend's numba kernels (the compiled core's are compiled/kernels.py).
Each kernel is a plain Python function jitted with an explicit signature on
C-contiguous arrays and numba's cache (unless it can cache nowhere: below), on its
first call (`_value_kernel`, `jit.kernel`: a replay loads the kernels it calls, 8 of
the 26 for a cache-safe replay of a shared prompt); `reference.py` is its numpy twin,
and the tests hold the two equal bit for bit. numba does not check an index (unless
NUMBA_BOUNDSCHECK=1, which the tests use). The value kernels never validate: the
wrappers in `guarded.py` (`GuardedKernels`) check every index array before one runs
(int64, C-contiguous, shapes that agree, every slot in use, sources within the values,
distinct slots where one iteration writes each row) and raise `PlanError` otherwise,
so it is never handed an index outside its arrays; they index the arrays by slot (a
row's place in the backend's storage), not by row. The kernels that read rows, pairs
or cells (`rows_differ`, `fresh_groups`, `stamp_winners`, `scatter_singles`,
`dirty_pools`, `pools_of_pairs`, `held_pairs`, `recheck_ways`, `least_pair`,
`recheck_one`, `recheck_many`, `one_step`) check each index as they read it instead,
and raise IndexError naming where (`recheck_ways` its reads of the changed cells
and of the rep columns; its per-sequence arrays are as long as the door checks them
to be), or answer None (`rows_differ`, `recheck_one`, `recheck_many`: the caller's
general way then says what); `write_rows` checks
every row, slot and free slot it will use before its first write and says which
one it refuses (`guards.py`'s codes, which its door turns into `PlanError`).

Arithmetic: exactly the order `keys.py` fixes (no fastmath, so no reassociation
and no fused multiply-add; no transcendental function; float32 throughout).

Parallelism (DESIGN.md "Numba kernels"): `write_keys` (which `write_rows` calls for
a large write) and `pool` are written once and can be jitted twice, serially and
with `parallel=True`. The
parallel builds write by ownership only (each output row by one iteration), so
their results do not depend on the thread count or order. Measured on the 2-core
machine of the benchmark they do not pay (512 key rows: 135 us serial, 137 us
parallel; 129 pool entries: 300 us vs 331 us; 65536 key rows: 18.3 ms vs 16.5 ms),
so they are opt-in: `KPOOL_NUMBA_PARALLEL=1` builds them on first use and uses
them above a work threshold; `PARALLEL_USED` records whether a run used them.

Where the compiled kernels are cached: `kpool_cli/jit.py` decides (`CACHE`).

Loading the cached kernels: each kernel's first call loads it under
`jit.cache_loads_only()`, which spares numba's cache loads the refresh of numba's
whole target context (about 0.25 s of a warm start; see there). Nothing is jitted as
this module is imported (`store.kernel_module` imports it under the same block, for
a numba that would).
"""

from __future__ import annotations

import os
import threading

import numba
import numpy as np
from numba import prange

from ..cache.cells import CELL_BITS, CELL_MASK
from ..jit import cache_for, inner, kernel
from ..signals import masked
from .guards import (
    FREE_OUTSIDE,
    NO_ROOM,
    NO_SLOT,
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
from .keys import GATE_MAX, GOLDEN, KEY_MUL, KEY_SCALE, MIX1, MIX2
from .recheck import NEW, NO_PAIR, NO_TAIL, NONE, SCAN

_U27 = np.uint64(27)
_U30 = np.uint64(30)
_U31 = np.uint64(31)
_U32 = np.uint64(32)
_U40 = np.uint64(40)
_U1 = np.uint64(1)
_U2 = np.uint64(2)
_NGATE = np.uint64(2 * GATE_MAX + 1)
_SCALE = KEY_SCALE




def _probe() -> None:  # never compiled: numba's cache check runs on it
    pass


CACHE = cache_for(_probe)
_CACHED = CACHE != ""  # the `cache=` of every kernel
_CELL_MASK = np.int64(CELL_MASK)
_CELL_BITS = np.int64(CELL_BITS)

# work (elements) above which the opt-in parallel builds are used
PARALLEL_MIN_KEYS = 1 << 15
PARALLEL_MIN_POOL = 1 << 16
PARALLEL = os.environ.get("KPOOL_NUMBA_PARALLEL", "") not in ("", "0")
PARALLEL_USED = {"write_keys": False, "pool": False}
_parallel_builds: dict = {}


def _parallel(name: str, fn, sig: str):
    """The parallel build of `fn`, jitted (or loaded from numba's cache) on first use."""
    if name not in _parallel_builds:
        with masked():
            _parallel_builds[name] = numba.njit(sig, cache=_CACHED, parallel=True)(fn)
    PARALLEL_USED[name] = True
    return _parallel_builds[name]


def _mix(x):
    z = x + GOLDEN
    z = (z ^ (z >> _U30)) * MIX1
    z = (z ^ (z >> _U27)) * MIX2
    return z ^ (z >> _U31)


# typed where it is inlined, as every inline function here: a signature would compile
# (or load) it as this module is imported, 27 ms of every numba replay
_mix_jit = numba.njit(cache=_CACHED, inline="always")(_mix)


def _value_kernel(sig: str | list[str]):
    """A value kernel for numba signature(s) `sig`: loaded (or compiled) on its first
    call, under the signal mask and `cache_loads_only` (`jit.kernel`), so a replay
    loads the kernels it calls alone; then it takes no other types."""
    return lambda fn: kernel(fn, sig=sig)


@numba.njit(cache=_CACHED, inline="always")
def _key_row(state, kid, key, gate, r):
    """Row r of `key` and `gate`: the key and gate of key id `kid` (`keys.py`)."""
    n_embd = key.shape[1]
    if kid == 0:
        for d in range(n_embd):
            key[r, d] = np.float32(0.0)
            gate[r, d] = np.int8(0)
        return
    base = _mix_jit(state ^ (np.uint64(kid) * KEY_MUL))
    for d in range(n_embd):
        dd = np.uint64(d)
        hk = _mix_jit(base + (_U2 * dd + _U1) * GOLDEN)
        hg = _mix_jit(base + (_U2 * dd + _U2) * GOLDEN)
        key[r, d] = np.float32(np.int64(hk >> _U40) - np.int64(1 << 23)) * _SCALE
        gate[r, d] = np.int8(np.int64((hg >> _U32) % _NGATE) - np.int64(GATE_MAX))


def _write_keys(state, rows, key_ids, key, gate):
    for j in prange(rows.size):
        _key_row(state, key_ids[j], key, gate, rows[j])


_WRITE_KEYS_SIG = "void(u8, i8[::1], i8[::1], f4[:, ::1], i1[:, ::1])"
_write_keys_serial = kernel(_write_keys, "_write_keys_serial", _WRITE_KEYS_SIG)


def write_keys(state: np.uint64, rows: np.ndarray, key_ids: np.ndarray, key: np.ndarray,
               gate: np.ndarray) -> None:
    """Write the key and gate rows of the writes `key_ids` into `rows`.

    Parameters
    ----------
    state : uint64
        `keys.seed_state(trace.seed)`.
    rows : array of int64, shape (n,), C-contiguous
        Slots (rows of `key`, `gate`), distinct (each written by one iteration).
    key_ids : array of int64, shape (n,), C-contiguous
        Key ids (0 = a zeroed row).
    key, gate : arrays of float32 and int8, shape (n_slots, n_embd), C-contiguous
        Updated in place.
    """
    if PARALLEL and rows.size * key.shape[1] >= PARALLEL_MIN_KEYS:
        _parallel("write_keys", _write_keys, _WRITE_KEYS_SIG)(state, rows, key_ids, key, gate)
    else:
        _write_keys_serial(state, rows, key_ids, key, gate)


_WRITE_ROWS_SIG = ("UniTuple(i8, 2)(u8, i8[::1], i8[::1], {}[::1], i8[::1], i8, i8, i8, i8, "
                   "i1, f4[:, ::1], i1[:, ::1], f4[:, ::1], i8[::1], i8[::1], i8[::1], "
                   "i1[::1], i8[::1], i8[::1], i8[::1], i8[::1], b1)")


def _write_rows_into(state, rows, key_ids, slot_of, free, n_handed, pristine, gen, n_ubatch,
                     kind, key, gate, pooled, slot_row, key_gen, pool_gen, w_kind, w_ubatch,
                     w_a, w_b, out, with_keys):
    n = rows.size
    n_rows = slot_of.size
    room = min(key.shape[0], gate.shape[0], pooled.shape[0], slot_row.size, key_gen.size,
               pool_gen.size, w_kind.size, w_ubatch.size, w_a.size, w_b.size)
    n_new = 0
    for j in range(n):  # every index checked before the first write
        r = rows[j]
        if r < 0 or r >= n_rows:
            return ROW_OUTSIDE, j
        s = slot_of[r]
        if s == 0:
            n_new += 1
        elif s < 1 or s >= n_handed:
            return SLOT_OUTSIDE, j
    n_free = free.size
    k = min(n_new, n_free)
    for i in range(n_free - k, n_free):
        if free[i] < 1 or free[i] >= n_handed:
            return FREE_OUTSIDE, i
    if n_handed > room or n_handed + n_new - k > room:
        return NO_ROOM, n_new
    taken = 0
    for j in range(n):
        r = rows[j]
        s = np.int64(slot_of[r])
        if s == 0:  # freed slots first, the last freed first, then new ones (`_take`)
            s = free[n_free - k + taken] if taken < k else n_handed + taken - k
            taken += 1
            slot_of[r] = s
            slot_row[s] = r
        out[j] = s
        if with_keys:
            _key_row(state, key_ids[j], key, gate, s)
        if s < pristine:  # past it, a slot never handed out holds zeros
            for d in range(pooled.shape[1]):
                pooled[s, d] = np.float32(0.0)
        key_gen[s] = gen
        pool_gen[s] = 0
        w_kind[s] = kind
        w_ubatch[s] = n_ubatch
        w_a[s] = -1
        w_b[s] = -1
    return WROTE, n_new


# one kernel per slot map dtype (`slots._slot_dtype`: int64 only past 2**31 rows), so a
# replay compiles (or loads) the one it calls
_write_rows_i4 = kernel(_write_rows_into, "_write_rows_i4", _WRITE_ROWS_SIG.format("i4"),
                        shared=True)
_write_rows_i8 = kernel(_write_rows_into, "_write_rows_i8", _WRITE_ROWS_SIG.format("i8"),
                        shared=True)


def write_rows(state: np.uint64, rows: np.ndarray, key_ids: np.ndarray, slot_of: np.ndarray,
               free: np.ndarray, n_handed: int, pristine: int, gen: int, n_ubatch: int,
               kind: int, key: np.ndarray, gate: np.ndarray, pooled: np.ndarray,
               slot_row: np.ndarray, key_gen: np.ndarray, pool_gen: np.ndarray,
               w_kind: np.ndarray, w_ubatch: np.ndarray, w_a: np.ndarray, w_b: np.ndarray,
               out: np.ndarray) -> tuple[int, int]:
    """A decode's cells written, in one pass (`slots.py`, `writers.py`): each row of
    `rows` (distinct) that has no slot (`slot_of` 0) gets one, the free list's from
    its end (`free`, the last freed first), then new ones from `n_handed`; every
    row's slot gets the key and gate of its key id (`write_keys`), a zeroed pooled
    row (below `pristine`: past it a slot holds zeros already), `key_gen` = `gen`,
    `pool_gen` = 0, and the writer (`kind`, `n_ubatch`, -1, -1). `out[j]` is row j's
    slot.

    Returns (WROTE, the rows that got a slot), or, having written nothing: (NO_ROOM,
    the rows that would get one) when the slot arrays lack the room;
    (ROW_OUTSIDE, j) for a row outside `slot_of`; (SLOT_OUTSIDE, j) for a row whose
    slot is not in [1, n_handed); (FREE_OUTSIDE, i) for a free slot that is not. The
    key rows of a large write come from `write_keys`' parallel build, when it is on."""
    parallel = PARALLEL and rows.size * key.shape[1] >= PARALLEL_MIN_KEYS
    into = _write_rows_i4 if slot_of.dtype == np.int32 else _write_rows_i8
    got = into(state, rows, key_ids, slot_of, free, n_handed, pristine, gen, n_ubatch, kind,
               key, gate, pooled, slot_row, key_gen, pool_gen, w_kind, w_ubatch, w_a, w_b, out,
               not parallel)
    if parallel and got[0] == WROTE:
        write_keys(state, out, key_ids, key, gate)
    return got


@numba.njit(cache=_CACHED, inline="always")
def _pool_entry(key, gate, m, w, bits, out):
    """Pool one entry (member rows m) into out[:], using w [kpool + 2, n_embd] as
    scratch (rows 0..kpool-1 the weights, kpool the gates' max, kpool + 1 their sum)
    and `bits`, the same memory as int32 (`_scratch`).

    Per dimension: the base-2 softmax of the gates (2**-(max - g) built from its
    float32 bits, exactly the table `keys.POW2`), summed in member order, then the
    weighted keys accumulated in member order: the operations, and their order, of
    `reference.pool`. Loops run member-outer, dimension-inner with no table lookup,
    so the dimension loops vectorise. Nothing is allocated: a kernel that allocates
    makes numba import its array module (0.1 s) when it loads from the cache, and
    so does a `view` in a kernel."""
    kpool = m.size
    n_embd = key.shape[1]
    mx = w[kpool]
    s = w[kpool + 1]
    g0 = gate[m[0]]
    for d in range(n_embd):
        mx[d] = np.float32(g0[d])
    for i in range(1, kpool):
        g = gate[m[i]]
        for d in range(n_embd):
            mx[d] = max(mx[d], np.float32(g[d]))
    for i in range(kpool):
        g = gate[m[i]]
        for d in range(n_embd):
            bits[i, d] = (np.int32(127) - np.int32(mx[d] - np.float32(g[d]))) << np.int32(23)
    for d in range(n_embd):
        s[d] = w[0, d]
    for i in range(1, kpool):
        for d in range(n_embd):
            s[d] += w[i, d]
    for d in range(n_embd):
        out[d] = np.float32(0.0)
    for i in range(kpool):
        k = key[m[i]]
        for d in range(n_embd):
            out[d] += (w[i, d] / s[d]) * k[d]


def _pool_into(key, gate, members, out, w, bits):
    for e in range(members.shape[0]):
        _pool_entry(key, gate, members[e], w, bits, out[e])


def _pool_into_parallel(key, gate, members, out, w, bits):  # scratch per entry instead
    n, kpool = members.shape
    for e in prange(n):
        own = np.empty((kpool + 2, key.shape[1]), dtype=np.float32)
        _pool_entry(key, gate, members[e], own, own.view(np.int32), out[e])


_POOL_SIG = "void(f4[:, ::1], i1[:, ::1], i8[:, ::1], f4[:, ::1], f4[:, ::1], i4[:, ::1])"
_pool_serial = kernel(_pool_into, "_pool_serial", _POOL_SIG)


def _scratch(kpool: int, n_embd: int) -> tuple[np.ndarray, np.ndarray]:
    """The pooling's scratch rows, as float32 and as int32 (`_pool_entry`)."""
    w = np.empty((kpool + 2, n_embd), dtype=np.float32)
    return w, w.view(np.int32)


def pool(key: np.ndarray, gate: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Pooled values of the entries `members`.

    Parameters
    ----------
    key, gate : arrays of float32 and int8, shape (n_slots, n_embd), C-contiguous
    members : array of int64, shape (n, kpool), C-contiguous
        The member slots of each entry.

    Returns
    -------
    array of float32, shape (n, n_embd)
        Per dimension `sum_i w_i * key[members[e, i]]`, accumulated in member order.
    """
    out = np.empty((members.shape[0], key.shape[1]), dtype=np.float32)
    w, bits = _scratch(members.shape[1], key.shape[1])
    if PARALLEL and members.shape[0] * members.shape[1] * key.shape[1] >= PARALLEL_MIN_POOL:
        _parallel("pool", _pool_into_parallel, _POOL_SIG)(key, gate, members, out, w, bits)
    else:
        _pool_serial(key, gate, members, out, w, bits)
    return out


@numba.njit(cache=_CACHED, inline="always")
def _write_pooling(pooled, pooled_bits, pool_of, pool_gen, gen, r, val, val_bits, m):
    """Slot r's pooled row written with `val`, the pooling of member slots m at
    generation `gen` (`pool_of`, `pool_gen`); returns whether its bits changed."""
    differs = False
    for d in range(pooled.shape[1]):
        if pooled_bits[r, d] != val_bits[d]:
            differs = True
        pooled[r, d] = val[d]
    for i in range(m.size):
        pool_of[r, i] = m[i]
    pool_gen[r] = gen
    return differs


@_value_kernel("void(f4[:, ::1], i1[:, ::1], f4[:, ::1], i4[:, ::1], i8[:, ::1], i8[::1], i8, "
                "i8[:, ::1], i8[::1], b1[::1], i8[::1], i8[::1], f4[:, ::1], i4[:, ::1], "
                "b1[::1], b1, f4[:, ::1], i4[:, ::1])")
def _scatter_fresh_into(key, gate, pooled, pooled_bits, pool_of, pool_gen, gen, members, reps,
                        keep, st, src, vals, vals_bits, changed, pool_fresh, w, bits):
    n_embd = pooled.shape[1]
    for e in range(members.shape[0]):  # every value before the first write
        if keep[e]:
            r = reps[e]
            for d in range(n_embd):
                vals[e, d] = pooled[r, d]
        elif pool_fresh:
            _pool_entry(key, gate, members[e], w, bits, vals[e])
    for g in range(st.size):
        e = src[g]
        changed[g] = _write_pooling(pooled, pooled_bits, pool_of, pool_gen, gen, st[g],
                                    vals[e], vals_bits[e], members[e])


def scatter_fresh(key: np.ndarray, gate: np.ndarray, pooled: np.ndarray,
                  pool_of: np.ndarray, pool_gen: np.ndarray, gen: int, members: np.ndarray,
                  reps: np.ndarray, keep: np.ndarray, st: np.ndarray, src: np.ndarray,
                  vals: np.ndarray) -> np.ndarray:
    """A scatter's fresh groups, in one pass: each entry's value (`vals[e]`: its rep
    slot's `reps[e]` where `keep[e]`, else the pooling of its member slots
    `members[e]`, all before the first write), then each group's row slot `st[g]`
    gets its last entry's value `vals[src[g]]` and that entry's pooling (`pool_of`,
    `pool_gen` = `gen`). Returns [groups] bool: the row's bits changed.

    Parameters
    ----------
    key, gate, pooled : arrays of float32, int8 and float32, shape (n_slots, n_embd),
        C-contiguous
    pool_of : array of int64, shape (n_slots, kpool); pool_gen : array of int64
    members : array of int64, shape (m, kpool); reps : int64 (m,); keep : bool (m,)
    st : array of int64, shape (g,), distinct; src : int64 (g,), indices into the m
    vals : array of float32, shape (m, n_embd), C-contiguous, written
    """
    changed = np.empty(st.size, dtype=np.bool_)
    parallel = (PARALLEL and int((~keep).sum()) * members.shape[1] * key.shape[1]
                >= PARALLEL_MIN_POOL)
    if parallel:  # the fresh poolings from the parallel build, the rest below
        vals[~keep] = pool(key, gate, members[~keep])
    _scatter_fresh_into(key, gate, pooled, pooled.view(np.int32), pool_of, pool_gen, gen,
                        members, reps, keep, st, src, vals, vals.view(np.int32), changed,
                        not parallel, *_scratch(members.shape[1], key.shape[1]))
    return changed


@_value_kernel("void(f4[:, ::1], i8[::1], f4[:, ::1])")
def _gather_into(pooled, rows, out):
    n_embd = pooled.shape[1]
    for j in range(rows.size):
        r = rows[j]
        for d in range(n_embd):
            out[j, d] = pooled[r, d]


def gather(pooled: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`pooled[rows]`: array of float32, shape (m, n_embd) (ggml_get_rows)."""
    out = np.empty((rows.size, pooled.shape[1]), dtype=np.float32)
    _gather_into(pooled, rows, out)
    return out


@numba.njit(cache=_CACHED, inline="always")
def _holds_pooling(pool_of, pool_gen, key_gen, m, r):
    """Slot r's pooled row is the pooling of member slots m, none written since
    (slots.py's invariants; `reference.kept`, the rule by slots)."""
    gen = pool_gen[r]
    if gen <= 0:
        return False
    for q in range(m.size):  # noqa: SIM110 - numba compiles no generator here
        if pool_of[r, q] != m[q] or key_gen[m[q]] >= gen:
            return False
    return True


@numba.njit(cache=_CACHED, inline="always")
def _differs(key, gate, pooled, pool_of, pool_gen, key_gen, m, r, w, bits, want):
    """Slot r's pooled row differs from the pooling of member slots m: not where it
    holds that pooling by the generations (bit-equal to it, found without pooling),
    else pooled again (into `want`) and compared."""
    if _holds_pooling(pool_of, pool_gen, key_gen, m, r):
        return False
    _pool_entry(key, gate, m, w, bits, want)
    for d in range(pooled.shape[1]):  # noqa: SIM110 - numba compiles no generator here
        if want[d] != pooled[r, d]:
            return True
    return False


@_value_kernel("void(f4[:, ::1], i1[:, ::1], f4[:, ::1], i8[:, ::1], i8[::1], i8[::1], "
                "i8[:, ::1], i8[::1], f4[:, ::1], i4[:, ::1], f4[::1], b1[::1])")
def _pools_differ_into(key, gate, pooled, pool_of, pool_gen, key_gen, members, rows, w, bits,
                       want, out):
    for e in range(members.shape[0]):
        out[e] = _differs(key, gate, pooled, pool_of, pool_gen, key_gen, members[e], rows[e],
                          w, bits, want)


def pools_differ(key: np.ndarray, gate: np.ndarray, pooled: np.ndarray, pool_of: np.ndarray,
                 pool_gen: np.ndarray, key_gen: np.ndarray, members: np.ndarray,
                 rows: np.ndarray) -> np.ndarray:
    """Whether row `rows[e]` of `pooled` differs from the pooling of `members[e]`: not
    where slot `rows[e]` holds the pooling of those member slots, none written since
    (`pool_of`, `pool_gen`, `key_gen`: slots.py's invariants make it bit-equal), which
    costs a look at the generations, not a pooling (most pools a verification asks
    are those the scatter just pooled); else pooled again and compared.

    Parameters
    ----------
    key, gate, pooled : arrays of float32, int8 and float32, shape (n_slots, n_embd),
        C-contiguous
    pool_of : array of int64, shape (n_slots, kpool); pool_gen, key_gen : int64 (n_slots,)
    members : array of int64, shape (n, kpool), C-contiguous
    rows : array of int64, shape (n,)

    Returns
    -------
    array of bool, shape (n,)
        The same arithmetic as `pool`, compared with `!=` per dimension.
    """
    out = np.zeros(members.shape[0], dtype=np.bool_)
    want = np.empty(key.shape[1], dtype=np.float32)
    _pools_differ_into(key, gate, pooled, pool_of, pool_gen, key_gen, members, rows,
                       *_scratch(members.shape[1], key.shape[1]), want, out)
    return out


_ROWS_DIFFER_SIG = ("i8({}[::1], i8, f4[:, ::1], i1[:, ::1], f4[:, ::1], i8[:, ::1], i8[::1], "
                    "i8[::1], i8[:, ::1], i8[::1], i8[::1], f4[:, ::1], i4[:, ::1], f4[::1], "
                    "b1[::1])")


@numba.njit(cache=_CACHED, inline="always")
def _slot(slot_of, n_handed, r):
    """Row r's slot, or -1 where the row is outside `slot_of` or its slot is not one
    handed out."""
    if r < 0 or r >= slot_of.size:
        return np.int64(-1)
    s = np.int64(slot_of[r])
    return s if 0 <= s < n_handed else np.int64(-1)


@numba.njit(cache=_CACHED, inline="always")
def _member_slots(slot_of, n_handed, members, ms):
    """ms[q] = the slot of member row members[q] (`_slot`), for every member; False at
    the first member outside (ms then partly written)."""
    for q in range(members.size):
        ms[q] = _slot(slot_of, n_handed, members[q])
        if ms[q] < 0:
            return False
    return True


def _rows_differ_into(slot_of, n_handed, key, gate, pooled, pool_of, pool_gen, key_gen,
                      members, reps, ms, w, bits, want, out):
    for e in range(reps.size):
        sr = _slot(slot_of, n_handed, reps[e])
        if sr < 0 or not _member_slots(slot_of, n_handed, members[e], ms):
            return e
        out[e] = _differs(key, gate, pooled, pool_of, pool_gen, key_gen, ms, sr, w, bits, want)
    return -1


# one kernel per slot map dtype, as `_write_rows_i4`, `_i8`
_rows_differ_i4 = kernel(_rows_differ_into, "_rows_differ_i4", _ROWS_DIFFER_SIG.format("i4"))
_rows_differ_i8 = kernel(_rows_differ_into, "_rows_differ_i8", _ROWS_DIFFER_SIG.format("i8"))


def rows_differ(slot_of: np.ndarray, n_handed: int, key: np.ndarray, gate: np.ndarray,
                pooled: np.ndarray, pool_of: np.ndarray, pool_gen: np.ndarray,
                key_gen: np.ndarray, members: np.ndarray, reps: np.ndarray
                ) -> np.ndarray | None:
    """`pools_differ` of entries given by their rows (member rows `members`, rep rows
    `reps`), each read through `slot_of` as the pass reaches it: one call where the
    slots' look-up and checks would be four. None when a row, or its slot, is
    outside its array (a slot in use is below `n_handed`): the caller then says which.

    Parameters
    ----------
    slot_of : array of int32 or int64, shape (n_rows,): row -> slot
    key, gate, pooled, pool_of, pool_gen, key_gen : as `pools_differ`
    members : array of int64, shape (n, kpool), C-contiguous; reps : int64 (n,)

    Returns
    -------
    array of bool, shape (n,), or None
    """
    out = np.zeros(reps.size, dtype=np.bool_)
    want = np.empty(key.shape[1], dtype=np.float32)
    into = _rows_differ_i4 if slot_of.dtype == np.int32 else _rows_differ_i8
    e = into(slot_of, n_handed, key, gate, pooled, pool_of, pool_gen, key_gen, members, reps,
             np.empty(members.shape[1], dtype=np.int64), *_scratch(members.shape[1],
                                                                    key.shape[1]), want, out)
    return None if e >= 0 else out


_FRESH_SIG = ("UniTuple(i8, 3)({}[::1], i8[:, ::1], i8[::1], i8[::1], i8[:, ::1], i8[::1], "
              "i8[::1], i8[::1], i8[::1], b1[::1], b1[::1], b1[::1], i8[::1])")


def _fresh_groups_into(slot_of, pool_of, pool_gen, key_gen, entry_rows, rep, order, starts,
                       rows, fresh, keep, in_fresh, ms):
    n = rep.size
    n_rows = slot_of.size
    n_slots = min(pool_gen.size, key_gen.size, pool_of.shape[0])
    n_groups = fresh.size
    if starts.size != n_groups + 1 or rows.size != n_groups or (n_groups == 0 and n > 0):
        return 0, 0, NOT_RACE_GROUPS
    n_kept = 0
    for g in range(n_groups):
        a = starts[g]
        b = starts[g + 1]
        if a < 0 or b > n or a > b:
            return n_kept, g, OUTSIDE
        # race groups: non-empty, end to end over the entries, rows ascending, every
        # entry writing its group's row (told once the group's indices are checked)
        grouped = (a < b and (g > 0 or a == 0) and (g < n_groups - 1 or b == n)
                   and (g == 0 or rows[g] > rows[g - 1]))
        f = False
        for j in range(a, b):
            e = order[j]
            if e < 0 or e >= n or rep[e] < 0 or rep[e] >= n_rows:
                return n_kept, g, OUTSIDE
            if rep[e] != rows[g]:
                grouped = False
            r = slot_of[rep[e]]
            if r < 0 or r >= n_slots or not _member_slots(slot_of, n_slots, entry_rows[e],
                                                          ms):
                return n_kept, g, OUTSIDE
            # kept: the rule by slots (`reference.kept` the numpy twin's; the tests
            # hold the two twins equal)
            ok = _holds_pooling(pool_of, pool_gen, key_gen, ms, r)
            keep[e] = ok
            if ok:
                n_kept += 1
            else:
                f = True
        if not grouped:
            return n_kept, g, NOT_RACE_GROUPS
        fresh[g] = f
        for j in range(a, b):
            in_fresh[order[j]] = f
    return n_kept, -1, 0


# one kernel per slot map dtype, as `_write_rows_i4`, `_i8`
_fresh_groups_i4 = kernel(_fresh_groups_into, "_fresh_groups_i4", _FRESH_SIG.format("i4"))
_fresh_groups_i8 = kernel(_fresh_groups_into, "_fresh_groups_i8", _FRESH_SIG.format("i8"))


def fresh_groups(slot_of: np.ndarray, pool_of: np.ndarray, pool_gen: np.ndarray,
                 key_gen: np.ndarray, entry_rows: np.ndarray, rep: np.ndarray,
                 order: np.ndarray, starts: np.ndarray, rows: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """`kept` asked of every scatter entry, by rows, and its answer per race group: an
    entry (member rows `entry_rows[e]`, rep row `rep[e]`) is kept when its rep row's
    slot (`slot_of`) holds the pooling of its member rows' slots, none of them
    written since; a group is fresh when one of its entries is not kept, and so is
    each of its entries.

    Parameters
    ----------
    slot_of : array of int32 or int64, shape (n_rows,): row -> slot
    pool_of : array of int64, shape (n_slots, kpool), C-contiguous
    pool_gen, key_gen : arrays of int64, shape (n_slots,)
    entry_rows : array of int64, shape (n, kpool), C-contiguous
    rep : array of int64, shape (n,)
    order, starts, rows : arrays of int64: race group g is entries
        order[starts[g]:starts[g + 1]], each writing row rows[g]

    Returns
    -------
    (fresh, keep, n_kept, in_fresh) : arrays of bool, shapes (len(rows),) and (n,),
        the entries kept (`keep[e]`: entry e keeps), and bool (n,): entry e is in a
        fresh group.
        One pass over the entries, each row looked up where it is read: under
        cache-safe, which re-marks every pool each ubatch, this is asked of every
        pool (8.7k in a W4 ubatch, 32k in a W2 one), and few are fresh. The pass
        checks, group by group, each index as it reads it (a group's entries, their
        rows, the rows' slots: IndexError), then that the group is a race group of
        `rep` (non-empty, the groups end to end over the entries, `rows` ascending,
        each entry writing its group's row: ValueError); the error names the first
        group refused (`guards.group_refusal`).
    """
    fresh = np.empty(rows.size, dtype=np.bool_)
    keep = np.zeros(rep.size, dtype=np.bool_)
    in_fresh = np.zeros(rep.size, dtype=np.bool_)
    into = _fresh_groups_i4 if slot_of.dtype == np.int32 else _fresh_groups_i8
    n_kept, g, why = into(slot_of, pool_of, pool_gen, key_gen, entry_rows, rep, order, starts,
                          rows, fresh, keep, in_fresh,
                          np.empty(entry_rows.shape[1], dtype=np.int64))
    if g >= 0:
        raise group_refusal(int(g), int(why))
    return fresh, keep, int(n_kept), in_fresh


@numba.njit(cache=_CACHED, inline="always")
def _bisect(a, x, right):
    """np.searchsorted(a, x, side="right" if right else "left") for a sorted array.
    compiled/kernels.py has its own: numba's on-disk cache tells a kernel is stale by
    its own file alone, so a kernel here calling into that module would keep old code
    when that one changed (numba/numba#8396, "Extend cache invalidation to include
    changes in other files", not merged)."""
    lo, hi = 0, a.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x or (right and a[mid] == x):
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=_CACHED, inline="always")
def _stamp(s, p, pool_start, n_ubatch, pooled, padding, w_kind, w_ubatch, w_a, w_b):
    """Slot s's writer: an entry of global pool p (< 0: padding), at ubatch n_ubatch, of
    kind `pooled` with its pool's (seq, k) or `padding` with (-1, -1)."""
    w_ubatch[s] = n_ubatch
    if p < 0:
        w_kind[s] = padding
        w_a[s] = -1
        w_b[s] = -1
    else:  # its pool's sequence, as Layout.locate finds it, and k within it
        q = _bisect(pool_start, p, True) - 1
        w_kind[s] = pooled
        w_a[s] = q
        w_b[s] = p - pool_start[q]


@_value_kernel("UniTuple(i8, 2)(i8[::1], i8[::1], i8[::1], i8[::1], i8[::1], i8, i8, i8, "
                "i1[::1], i8[::1], i8[::1], i8[::1])")
def _stamp_winners_into(order, starts, entry_pool, pool_start, slots, n_ubatch, pooled,
                        padding, w_kind, w_ubatch, w_a, w_b):
    n = order.size
    n_groups = slots.size
    n_slots = min(w_kind.size, w_ubatch.size, w_a.size, w_b.size)
    if starts.size != n_groups + 1 or pool_start.size == 0:
        return 0, NOT_RACE_GROUPS
    n_pools = pool_start[pool_start.size - 1]
    for g in range(n_groups):  # every index checked before the first write
        b = starts[g + 1]
        if b < 1 or b > n:
            return g, OUTSIDE
        e = order[b - 1]
        if e < 0 or e >= entry_pool.size or entry_pool[e] >= n_pools:
            return g, OUTSIDE
        if slots[g] < 1 or slots[g] >= n_slots:
            return g, OUTSIDE
    for g in range(n_groups):
        _stamp(slots[g], entry_pool[order[starts[g + 1] - 1]], pool_start, n_ubatch, pooled,
               padding, w_kind, w_ubatch, w_a, w_b)
    return -1, 0


def stamp_winners(order: np.ndarray, starts: np.ndarray, entry_pool: np.ndarray,
                  pool_start: np.ndarray, slots: np.ndarray, n_ubatch: int, pooled: int,
                  padding: int, w_kind: np.ndarray, w_ubatch: np.ndarray, w_a: np.ndarray,
                  w_b: np.ndarray) -> None:
    """The writer of each race group's row, stamped in its slot: the group's last entry
    (`order[starts[g + 1] - 1]`, the one whose value the row keeps), which wrote it at
    ubatch `n_ubatch` as kind `pooled` with its pool's (seq, k) (`entry_pool`, global,
    its sequence found in `pool_start`) or, a padding entry (pool < 0), as kind
    `padding` with (-1, -1).

    Parameters
    ----------
    order, starts : arrays of int64: race group g is entries order[starts[g]:starts[g + 1]]
    entry_pool : array of int64, shape (n,): each entry's global pool, -1 for padding
    pool_start : array of int64: each sequence's first global pool, and the total
    slots : array of int64, shape (n_groups,): the slot of each group's row
    w_kind, w_ubatch, w_a, w_b : the slots' writer arrays (int8, int64 x 3)

    Refuses the first group whose last entry, its pool or its slot is outside its
    array (IndexError), or groups that do not match `slots` (ValueError), before the
    first write (`guards.group_refusal`)."""
    g, why = _stamp_winners_into(order, starts, entry_pool, pool_start, slots, n_ubatch,
                                 pooled, padding, w_kind, w_ubatch, w_a, w_b)
    if g >= 0:
        raise group_refusal(int(g), int(why))


_SINGLES_SIG = ("UniTuple(i8, 4)({}[::1], i8[::1], i8, f4[:, ::1], i1[:, ::1], f4[:, ::1], "
                "i4[:, ::1], i8[:, ::1], i8[::1], i8[::1], i8, i8[:, ::1], i8[::1], i8[::1], "
                "i8[::1], i8[::1], i8[::1], i8, i8, i8, i1[::1], i8[::1], i8[::1], i8[::1], "
                "i8[::1], i8[::1], i8[::1], f4[::1], i4[::1], f4[:, ::1], i4[:, ::1])")


def _scatter_singles_into(slot_of, slot_row, n_handed, key, gate, pooled, pooled_bits,
                          pool_of, pool_gen, key_gen, gen, entry_rows, rep, order, rows,
                          entry_pool, pool_start, n_ubatch, pooled_kind, padding_kind,
                          w_kind, w_ubatch, w_a, w_b, s_out, changed, ms, val, val_bits, w,
                          bits):
    n = rep.size
    n_rows = slot_of.size
    kpool = entry_rows.shape[1]
    room = min(key.shape[0], gate.shape[0], pooled.shape[0], pool_of.shape[0], pool_gen.size,
               key_gen.size, slot_row.size, w_kind.size, w_ubatch.size, w_a.size, w_b.size)
    if order.size != n or rows.size != n or n_handed > room or pool_start.size == 0:
        return 0, NOT_RACE_GROUPS, 0, 0
    n_pools = pool_start[pool_start.size - 1]
    n_kept = 0
    for g in range(n):  # every index checked, and each entry's pooling kept or not,
        e = order[g]    # before the first write
        if e < 0 or e >= n:
            return g, OUTSIDE, 0, 0
        r = rows[g]
        if r < 0 or r >= n_rows or entry_pool[e] < -1 or entry_pool[e] >= n_pools:
            return g, OUTSIDE, 0, 0
        if rep[e] != r or (g > 0 and r <= rows[g - 1]):  # one entry a group, rows ascending
            return g, NOT_RACE_GROUPS, 0, 0
        st = np.int64(slot_of[r])
        if st == 0:  # a zero row: its slot is handed out first (`SlotTable.own`)
            return g, NO_SLOT, 0, 0
        if st < 1 or st >= n_handed or slot_row[st] != r:  # so distinct: one row a slot
            return g, OUTSIDE, 0, 0
        if not _member_slots(slot_of, n_handed, entry_rows[e], ms):
            return g, OUTSIDE, 0, 0
        s_out[g] = st
        # kept: `fresh_groups`' rule, and then `scatter_fresh` leaves the slot as it is
        if _holds_pooling(pool_of, pool_gen, key_gen, ms, st):
            n_kept += 1
            s_out[g] = -st - 1  # marked kept until the writes below
    n_changed = 0
    for g in range(n):  # `scatter_fresh` of each fresh group, then `stamp_winners`
        st = s_out[g]
        e = order[g]
        if st < 0:
            st = -st - 1
            s_out[g] = st
        else:
            for q in range(kpool):
                ms[q] = slot_of[entry_rows[e, q]]
            _pool_entry(key, gate, ms, w, bits, val)
            if _write_pooling(pooled, pooled_bits, pool_of, pool_gen, gen, st, val, val_bits,
                              ms):
                changed[n_changed] = g
                n_changed += 1
        _stamp(st, entry_pool[e], pool_start, n_ubatch, pooled_kind, padding_kind, w_kind,
               w_ubatch, w_a, w_b)
    return -1, 0, n_changed, n_kept


_scatter_singles_i4 = kernel(_scatter_singles_into, "_scatter_singles_i4",
                             _SINGLES_SIG.format("i4"), shared=True)
_scatter_singles_i8 = kernel(_scatter_singles_into, "_scatter_singles_i8",
                             _SINGLES_SIG.format("i8"), shared=True)


def scatter_singles(slot_of: np.ndarray, slot_row: np.ndarray, n_handed: int,
                    key: np.ndarray, gate: np.ndarray, pooled: np.ndarray,
                    pool_of: np.ndarray, pool_gen: np.ndarray, key_gen: np.ndarray, gen: int,
                    entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
                    rows: np.ndarray, entry_pool: np.ndarray, pool_start: np.ndarray,
                    n_ubatch: int, pooled_kind: int, padding_kind: int, w_kind: np.ndarray,
                    w_ubatch: np.ndarray, w_a: np.ndarray, w_b: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, int] | None:
    """A scatter whose race groups hold one entry each (group g is entry order[g],
    writing row rows[g] = rep[order[g]]) in one pass: `fresh_groups`, `scatter_fresh`
    and `stamp_winners` of those groups, as the three kernels do them in turn, and no
    array made for them between. Every group's row must have a slot: where one is a
    zero row (whose slot `SlotTable.own` hands out first), None, nothing written.

    Parameters
    ----------
    slot_of : array of int32 or int64, shape (n_rows,): row -> slot; slot_row its inverse
    n_handed : the slots handed out (slots in use are below it)
    key, gate, pooled : arrays of float32, int8 and float32, shape (n_slots, n_embd),
        C-contiguous
    pool_of, pool_gen, key_gen, gen : the poolings and generations (`slots.py`)
    entry_rows, rep, order, rows, entry_pool : the plan's entries and their groups
    pool_start, n_ubatch, pooled_kind, padding_kind, w_kind, w_ubatch, w_a, w_b :
        as `stamp_winners`

    Returns
    -------
    (slots, changed, n_kept) : the slot of each group's row, int64 (n,); the groups
        whose row's bits changed, ascending; the entries that kept their pooling. A
        group's entry, row, member row or slot outside its array, a slot that is not
        its row's alone, or groups that are not race groups of one entry each
        (`guards.group_refusal`) are refused before the first write.
    """
    n = rep.size
    s = np.empty(n, dtype=np.int64)
    changed = np.empty(n, dtype=np.int64)
    val = np.empty(pooled.shape[1], dtype=np.float32)
    into = _scatter_singles_i4 if slot_of.dtype == np.int32 else _scatter_singles_i8
    g, why, n_changed, n_kept = into(
        slot_of, slot_row, n_handed, key, gate, pooled, pooled.view(np.int32), pool_of,
        pool_gen, key_gen, gen, entry_rows, rep, order, rows, entry_pool, pool_start, n_ubatch,
        pooled_kind, padding_kind, w_kind, w_ubatch, w_a, w_b, s, changed,
        np.empty(entry_rows.shape[1], dtype=np.int64), val, val.view(np.int32),
        *_scratch(entry_rows.shape[1], pooled.shape[1]))
    if g >= 0:
        if why == NO_SLOT:
            return None
        raise group_refusal(int(g), int(why))
    return s, changed[:n_changed], int(n_kept)


@_value_kernel("i8(i8[::1], i8[::1], i8, b1[::1], i8[::1])")
def _dirty_pools_into(keys, starts, kpool, dirty, out):
    n = 0
    for k in range(starts.size):
        j0 = starts[k]
        if j0 < 0 or j0 > keys.size - kpool:
            return -1 - k
        for q in range(kpool):
            c = keys[j0 + q] & _CELL_MASK
            if c >= dirty.size:
                return -1 - k
            if dirty[c]:
                out[n] = k
                n += 1
                break
    return n


def dirty_pools(keys: np.ndarray, starts: np.ndarray, kpool: int, dirty: np.ndarray
                ) -> np.ndarray:
    """The pools (indices into `starts`) one of whose members' cells is `dirty`.

    Parameters
    ----------
    keys : array of int64, shape (n,), C-contiguous
        A sequence's pairs, `pos << CELL_BITS | cell` (engine/layout.py `SeqLayout`).
    starts : array of int64, shape (n_pools,), C-contiguous
        Its pools' first pairs, ascending; pool k's members are keys[starts[k]:+kpool].
    dirty : array of bool, shape (kv_size,), C-contiguous
        Per cell of the sequence's stream, whether its key changed.

    Returns
    -------
    array of int64
        Ascending and distinct (pools do not overlap). One pass over the pooled
        pairs, checking each index before it reads: a start or cell out of range is
        `IndexError` (the door names it).
    """
    out = np.empty(starts.size, dtype=np.int64)
    n = _dirty_pools_into(keys, starts, kpool, dirty, out)
    if n < 0:
        raise IndexError(f"pool {-1 - n}: a member pair or cell outside the arrays")
    return out[:n]


@_value_kernel("i8(i8[::1], i8[::1], i8, i8[::1], i8[::1], i8[::1])")
def _pools_of_pairs_into(keys, starts, kpool, members, reps, out):
    n = 0
    for which in range(2):
        wanted = members if which == 0 else reps
        for w in wanted:
            j = _bisect(keys, w, False)  # the first pair >= w
            if j == keys.size or keys[j] != w:
                return -1
            k = _bisect(starts, j, True) - 1  # the last pool starting at or before j
            if k < 0:
                continue
            last = starts[k] + kpool - 1
            if j > last or (which == 1 and j != last):
                continue
            i = n  # insert k, keeping out[:n] ascending and distinct
            while i > 0 and out[i - 1] > k:
                i -= 1
            if i > 0 and out[i - 1] == k:
                continue
            q = n
            while q > i:
                out[q] = out[q - 1]
                q -= 1
            out[i] = k
            n += 1
    return n


def pools_of_pairs(keys: np.ndarray, starts: np.ndarray, kpool: int, members: np.ndarray,
                   reps: np.ndarray) -> np.ndarray | None:
    """The pools with one of the pairs `members` among their members, or one of the
    pairs `reps` as their rep (last member): found by binary search, O(log n) a pair.

    Parameters
    ----------
    keys : array of int64, shape (n,), C-contiguous
        A sequence's pairs, ascending (engine/layout.py `SeqLayout.keys`).
    starts : array of int64, shape (n_pools,), C-contiguous
        Its pools' first pairs, ascending.
    members, reps : arrays of int64, C-contiguous
        Pairs, `pos << CELL_BITS | cell`.

    Returns
    -------
    array of int64, or None
        Ascending and distinct; None when a pair asked for is not among `keys` (the
        caller's premise, that they are, does not hold). Reads only inside the arrays.
    """
    out = np.empty(members.size + reps.size, dtype=np.int64)
    n = _pools_of_pairs_into(keys, starts, kpool, members, reps, out)
    return None if n < 0 else out[:n]


@_value_kernel("i8(i8[::1], b1[:, ::1], i8[::1])")
def _held_counts(cells, has, off):
    n_col, kv = has.shape
    for c in range(n_col + 1):
        off[c] = 0
    for i in range(cells.size):
        x = cells[i]
        if x < 0 or x >= kv:
            return -1 - i
        for c in range(n_col):
            if has[c, x]:
                off[c + 1] += 1
    for c in range(n_col):
        off[c + 1] += off[c]
    return 0


@_value_kernel("void(i8[::1], b1[:, ::1], i8[::1], i8[::1], i8[::1], i8[::1])")
def _held_fill(cells, has, pos, off, at, out):
    n_col = has.shape[0]
    for c in range(n_col):
        at[c] = off[c]
    for i in range(cells.size):
        x = cells[i]
        for c in range(n_col):
            if has[c, x]:
                out[at[c]] = (pos[x] << _CELL_BITS) | x
                at[c] += 1


def held_pairs(cells: np.ndarray, has: np.ndarray, pos: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence column of a stream, the pairs of the cells `cells` it holds.

    Parameters
    ----------
    cells : array of int64, shape (n,), C-contiguous
        Cells of the stream, in any order (a cell listed twice gives its pair twice).
    has : array of bool, shape (n_col, kv_size), C-contiguous
        Which column holds which cell (cache/cells.py `Stream.has`).
    pos : array of int64, shape (kv_size,), C-contiguous
        Each cell's pos.

    Returns
    -------
    (off, pairs) : arrays of int64
        Column c's pairs, `pos << CELL_BITS | cell`, are pairs[off[c]:off[c + 1]], in
        the order of `cells`. A cell outside the stream is `IndexError`.
    """
    off = np.empty(has.shape[0] + 1, dtype=np.int64)
    bad = _held_counts(cells, has, off)
    if bad < 0:
        raise IndexError(f"cells[{-1 - bad}] is cell {cells[-1 - bad]}, outside the stream")
    out = np.empty(off[-1], dtype=np.int64)
    _held_fill(cells, has, pos, off, np.empty(has.shape[0], dtype=np.int64), out)
    return off, out


_NEW, _NONE, _SCAN, _NO_TAIL = np.int64(NEW), np.int64(NONE), np.int64(SCAN), np.int64(NO_TAIL)
_NO_PAIR = np.int64(NO_PAIR)


@numba.njit(cache=_CACHED, inline="always")
def _least_of(cells, pos):
    """(the least pair `pos << CELL_BITS | cell` of `cells`, INT64_MAX for none; the
    first index whose cell is outside `pos`, or -1)."""
    least = _NO_PAIR
    for i in range(cells.size):
        c = cells[i]
        if c < 0 or c >= pos.size:
            return least, i
        p = (pos[c] << _CELL_BITS) | c
        if p < least:
            least = p
    return least, -1


def _recheck_ways_rule(start, n_bad, kept, known, rep_pos, rep_rows, kv_size, dirty,
                       too_many, cells, pos, least, how, tail):  # pragma: no cover
    got, bad = _least_of(cells, pos)
    if bad >= 0:
        return -2 - bad, 0
    if got < least:
        least = got
    before = 0
    for s in range(kept.size):
        n_pools = start[s + 1] - start[s]
        h = _NEW if kept[s] < n_bad[s] or n_bad[s] < n_pools else _NONE
        t = _NO_TAIL
        if dirty:
            if not known[s]:
                if n_pools > 0:
                    h = _SCAN
            elif kept[s] > 0:
                if too_many:
                    h = _SCAN
                else:
                    last = start[s] + kept[s] - 1
                    if last < 0 or last >= rep_pos.size or last >= rep_rows.size:
                        return s, 0
                    t = (rep_pos[last] << _CELL_BITS) | (rep_rows[last] % kv_size)
                    if least <= t:
                        before = 1
        how[s] = h
        tail[s] = t
    return -1, before


# recheck.py's rule, once: `recheck_ways`' kernel, and inside `recheck_one`'s
_recheck_ways_into = kernel(_recheck_ways_rule, "_recheck_ways_into",
                            "UniTuple(i8, 2)(i8[::1], i8[::1], i8[::1], b1[::1], i8[::1], "
                            "i8[::1], i8, b1, b1, i8[::1], i8[::1], i8, i8[::1], i8[::1])",
                            shared=True)
_recheck_ways_in = inner(_recheck_ways_rule)


_ASK_AGAIN = np.int64(-2)  # `recheck_one`: the verifier's general way answers


def _recheck_one_into(start, n_bad, kept, known, rep_pos, rep_rows, kv_size, dirty, too_many,
                      cells, pos, how, tail, keys, pools, row0, slot_of, n_handed, key, gate,
                      pooled, pool_of, pool_gen, key_gen, ms, w, bits, want, out
                      ):  # pragma: no cover - compiled
    err, before = _recheck_ways_in(start, n_bad, kept, known, rep_pos, rep_rows, kv_size,
                                   dirty, too_many, cells, pos, _NO_PAIR, how, tail)
    if err != -1 or before:
        return _ASK_AGAIN
    if how[0] == _NONE:
        return NONE
    if how[0] != _NEW:
        return _ASK_AGAIN
    kpool = ms.size
    k0 = kept[0]
    for k in range(k0, start[1] - start[0]):  # `rows_differ` of the pools past the kept
        if k >= pools.size or k >= rep_rows.size:
            return _ASK_AGAIN
        j0 = pools[k]
        if j0 < 0 or j0 > keys.size - kpool:
            return _ASK_AGAIN
        sr = _slot(slot_of, n_handed, rep_rows[k])
        if sr < 0:
            return _ASK_AGAIN
        for q in range(kpool):  # member q's row (`SeqLayout.members`), then its slot
            ms[q] = _slot(slot_of, n_handed, row0 + (keys[j0 + q] & _CELL_MASK))
            if ms[q] < 0:
                return _ASK_AGAIN
        out[k - k0] = _differs(key, gate, pooled, pool_of, pool_gen, key_gen, ms, sr, w, bits,
                               want)
    return NEW


_RECHECK_ONE_SIG = ("i8(i8[::1], i8[::1], i8[::1], b1[::1], i8[::1], i8[::1], i8, b1, b1, "
                    "i8[::1], i8[::1], i8[::1], i8[::1], i8[::1], i8[::1], i8, {}[::1], i8, "
                    "f4[:, ::1], i1[:, ::1], f4[:, ::1], i8[:, ::1], i8[::1], i8[::1], "
                    "i8[::1], f4[:, ::1], i4[:, ::1], f4[::1], b1[::1])")
# one kernel per slot map dtype, as `_write_rows_i4`, `_i8`
_recheck_one_i4 = kernel(_recheck_one_into, "_recheck_one_i4", _RECHECK_ONE_SIG.format("i4"),
                         shared=True)
_recheck_one_i8 = kernel(_recheck_one_into, "_recheck_one_i8", _RECHECK_ONE_SIG.format("i8"),
                         shared=True)


def recheck_one(start: np.ndarray, n_bad: np.ndarray, kept: np.ndarray, known: np.ndarray,
                rep_pos: np.ndarray, rep_rows: np.ndarray, kv_size: int, dirty: bool,
                too_many: bool, cells: np.ndarray, pos: np.ndarray, keys: np.ndarray,
                pools: np.ndarray, row0: int, slot_of: np.ndarray, n_handed: int,
                key: np.ndarray, gate: np.ndarray, pooled: np.ndarray, pool_of: np.ndarray,
                pool_gen: np.ndarray, key_gen: np.ndarray
                ) -> tuple[int, np.ndarray] | None:
    """The verification of a layout of one sequence in one pass, where its way is `NONE`
    or `NEW` (recheck.py): the way, by `recheck_ways`' rule, then for `NEW` the
    verdicts of the pools past the kept ones, as `rows_differ` gives them.

    Parameters
    ----------
    start, n_bad, kept, known, rep_pos, rep_rows, kv_size, dirty, too_many, cells, pos :
        as `recheck_ways`, of one sequence (start (2,), the others (1,)), the changed
        cells those of its one stream, with no least pair of another
    keys, pools : arrays of int64, C-contiguous
        The sequence's pairs and its pools' first pairs (engine/layout.py `SeqLayout`);
        member q of pool k is row `row0 + (keys[pools[k] + q] & CELL_MASK)`, its rep row
        `rep_rows[k]`
    slot_of, n_handed, key, gate, pooled, pool_of, pool_gen, key_gen : as `rows_differ`

    Returns
    -------
    (way, verdicts), or None
        `NONE` and no verdict, or `NEW` and, for each pool k of kept[0]..n_pools (in
        order), whether its rep row differs from its pooling. None where the verifier's
        general way must answer: a way that looks up or scans, a changed pair at or
        before the kept tail, or a cell, pair, row or slot outside its array (that way
        says which).
    """
    n_new = max(int(start[1] - start[0] - kept[0]), 0)
    out = np.zeros(n_new, dtype=np.bool_)
    want = np.empty(key.shape[1], dtype=np.float32)
    into = _recheck_one_i4 if slot_of.dtype == np.int32 else _recheck_one_i8
    way = into(start, n_bad, kept, known, rep_pos, rep_rows, kv_size, dirty, too_many, cells,
               pos, np.empty(1, dtype=np.int64), np.empty(1, dtype=np.int64), keys, pools,
               row0, slot_of, n_handed, key, gate, pooled, pool_of, pool_gen, key_gen,
               np.empty(pool_of.shape[1], dtype=np.int64),
               *_scratch(pool_of.shape[1], key.shape[1]), want, out)
    if way == _ASK_AGAIN:
        return None
    return int(way), out if way == NEW else out[:0]


def _recheck_many_into(start, n_bad, kept, known, rep_pos, rep_rows, kv_size, dirty,
                       too_many, cells, pos, has, ids, keys, n_keys, pools, reps, strm,
                       slot_of, n_handed, key, gate, pooled, pool_of, pool_gen, key_gen, how,
                       tail, pairs, ms, w, bits, want, out):  # pragma: no cover - compiled
    err, before = _recheck_ways_in(start, n_bad, kept, known, rep_pos, rep_rows, kv_size,
                                   dirty, too_many, cells, pos, _NO_PAIR, how, tail)
    if err != -1:
        return _ASK_AGAIN
    n = kept.size
    for s in range(n):
        h = how[s]
        if h != _NEW and h != _NONE:  # a scan
            return _ASK_AGAIN
        if kept[s] < 0 or kept[s] > start[s + 1] - start[s]:  # kept more than it holds
            return _ASK_AGAIN
    if before:
        # `_DirtyPairs.lowest`: a sequence holding a changed pair at or before its tail
        # looks up (LOOK), which this pass leaves to the general way. Column by column,
        # each reading its own row of `has` at the changed cells whose pair is at or
        # before its sequence's tail (the cells inside `pos`: `_least_of` checked them)
        if has.shape[1] < pos.size or has.shape[0] > ids.size or pairs.size < cells.size:
            return _ASK_AGAIN
        least = _NO_PAIR
        for i in range(cells.size):
            c = cells[i]
            pairs[i] = (pos[c] << _CELL_BITS) | c
            if pairs[i] < least:
                least = pairs[i]
        for col in range(has.shape[0]):
            s = ids[col]
            if s < 0 or s >= n:
                return _ASK_AGAIN
            t = tail[s]
            if t == _NO_TAIL or t < least:
                continue
            row = has[col]
            for i in range(cells.size):
                if pairs[i] <= t and row[cells[i]]:
                    return _ASK_AGAIN
    # `rows_differ` of each NEW sequence's pools past its kept ones, in layout order,
    # their member and rep rows read in its columns (`SeqLayout.members`)
    kpool = ms.size
    e = np.int64(0)  # the verdicts written
    for s in range(n):
        if how[s] != _NEW:
            continue
        if (s >= keys.shape[0] or s >= n_keys.size or s >= pools.shape[0]
                or s >= reps.shape[0] or s >= strm.size or n_keys[s] > keys.shape[1]):
            return _ASK_AGAIN
        row0 = strm[s] * kv_size
        for k in range(kept[s], start[s + 1] - start[s]):
            if e >= out.size or k >= pools.shape[1] or k >= reps.shape[1]:
                return _ASK_AGAIN
            j0 = pools[s, k]
            if j0 < 0 or j0 > n_keys[s] - kpool:
                return _ASK_AGAIN
            sr = _slot(slot_of, n_handed, reps[s, k])
            if sr < 0:
                return _ASK_AGAIN
            for q in range(kpool):
                ms[q] = _slot(slot_of, n_handed, row0 + (keys[s, j0 + q] & _CELL_MASK))
                if ms[q] < 0:
                    return _ASK_AGAIN
            out[e] = _differs(key, gate, pooled, pool_of, pool_gen, key_gen, ms, sr, w, bits,
                              want)
            e += 1
    return np.int64(e)


_RECHECK_MANY_SIG = ("i8(i8[::1], i8[::1], i8[::1], b1[::1], i8[::1], i8[::1], i8, b1, b1, "
                     "i8[::1], i8[::1], b1[:, ::1], i8[::1], i8[:, ::1], i8[::1], i8[:, ::1], "
                     "i8[:, ::1], i8[::1], {}[::1], i8, f4[:, ::1], i1[:, ::1], f4[:, ::1], "
                     "i8[:, ::1], i8[::1], i8[::1], i8[::1], i8[::1], i8[::1], i8[::1], "
                     "f4[:, ::1], i4[:, ::1], f4[::1], b1[::1])")
# one kernel per slot map dtype, as `_write_rows_i4`, `_i8`
_recheck_many_i4 = kernel(_recheck_many_into, "_recheck_many_i4",
                          _RECHECK_MANY_SIG.format("i4"))
_recheck_many_i8 = kernel(_recheck_many_into, "_recheck_many_i8",
                          _RECHECK_MANY_SIG.format("i8"))


def recheck_many(start: np.ndarray, n_bad: np.ndarray, kept: np.ndarray, known: np.ndarray,
                 rep_pos: np.ndarray, rep_rows: np.ndarray, kv_size: int, dirty: bool,
                 too_many: bool, cells: np.ndarray, pos: np.ndarray, has: np.ndarray,
                 ids: np.ndarray, keys: np.ndarray, n_keys: np.ndarray, pools: np.ndarray,
                 reps: np.ndarray, strm: np.ndarray, slot_of: np.ndarray, n_handed: int,
                 key: np.ndarray, gate: np.ndarray, pooled: np.ndarray, pool_of: np.ndarray,
                 pool_gen: np.ndarray, key_gen: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """The verification of a layout of many sequences and one stream in one pass, where
    every way is `NONE` or `NEW` (recheck.py): each sequence's way, by `recheck_ways`'
    rule and, where a changed pair lies at or before some tail, by the changed pairs
    each sequence holds (`_DirtyPairs.lowest`'s test); then the verdicts of every `NEW`
    sequence's pools past its kept ones, as `rows_differ` gives them, their rows read
    in the layout's flat columns.

    Parameters
    ----------
    start, n_bad, kept, known, rep_pos, rep_rows, kv_size, dirty, too_many, cells, pos :
        as `recheck_ways`, the changed cells those of the one stream, with no least pair
        of another
    has : array of bool, shape (n_col, n_cells), C-contiguous
        The stream's holders: column col holds cell c where has[col, c].
    ids : array of int64, shape (n_col,)
        The sequence of each column.
    keys, n_keys, pools, reps, strm : arrays of int64, C-contiguous
        Every sequence's pairs (row s, its first n_keys[s] live), its pools' first
        pairs and rep rows (row s, pool k at column k) and its stream
        (engine/layout.py `FlatColumns`): member q of pool k of s is row
        `strm[s] * kv_size + (keys[s, pools[s, k] + q] & CELL_MASK)`, its rep row
        `reps[s, k]`.
    slot_of, n_handed, key, gate, pooled, pool_of, pool_gen, key_gen : as `rows_differ`

    Returns
    -------
    (how, verdicts), or None
        Every sequence's way (`NONE` or `NEW`), and for each `NEW` sequence in turn, for
        each of its pools past the kept ones in order, whether its rep row differs from
        its pooling. None where the verifier's general way must answer: a way that scans,
        a sequence holding a changed pair at or before its tail (a look-up), a sequence
        that kept more pools than it holds, or a cell, column, pair, pool, row or slot
        outside its array (that way says which).
    """
    n = kept.size
    how = np.empty(n, dtype=np.int64)
    # the pairs are read only before a tail, and too many changed cells leave no tail
    tail, pairs, ms, w, bits, want, out = _many_scratch(n, 0 if too_many else cells.size,
                                                        int(start[-1]), pool_of.shape[1],
                                                        key.shape[1])
    into = _recheck_many_i4 if slot_of.dtype == np.int32 else _recheck_many_i8
    got = into(start, n_bad, kept, known, rep_pos, rep_rows, kv_size, dirty, too_many, cells,
               pos, has, ids, keys, n_keys, pools, reps, strm, slot_of, n_handed, key, gate,
               pooled, pool_of, pool_gen, key_gen, how, tail, pairs, ms, w, bits, want, out)
    return None if got == _ASK_AGAIN else (how, out[:got].copy())


# `recheck_many`'s scratch, kept from call to call by each thread (the kernel writes
# each element before it reads it, and the verdicts are copied out before the call
# returns; a thread of its own, since a Dask worker runs its tasks on threads, whose
# calls could otherwise interleave between a kernel and that copy): int64 [n + cells +
# kpool] (tails, pairs, member slots; the cells a verification looks up, `too_many`
# past that, so a few pages), the pooling's rows, a row of floats and bool [pools]
# (the verdicts, at most one a pool: a byte a pool, next to the layout's dozens). A
# step of parallel slots allocates none of them
_MANY_SCRATCH = threading.local()


def _many_scratch(n: int, n_cells: int, n_pools: int, kpool: int, n_embd: int
                  ) -> tuple[np.ndarray, ...]:
    """(tails [n], pairs [n_cells], member slots [kpool], the pooling's scratch rows as
    float32 and int32, a row [n_embd], verdicts [n_pools or more]): views of
    `_MANY_SCRATCH` (this thread's), made again for another kpool or n_embd, grown
    when short."""
    held: dict[str, np.ndarray] = _MANY_SCRATCH.__dict__
    if "w" not in held or held["w"].shape != (kpool + 2, n_embd):  # another backend's
        w, bits = _scratch(kpool, n_embd)
        held.update(w=w, bits=bits, want=np.empty(n_embd, dtype=np.float32),
                    ints=np.empty(0, dtype=np.int64), out=np.empty(0, dtype=np.bool_))
    need = n + n_cells + kpool
    ints, out = held["ints"], held["out"]
    if ints.size < need:
        ints = held["ints"] = np.empty(max(need, 2 * ints.size), dtype=np.int64)
    if out.size < n_pools:
        out = held["out"] = np.empty(max(n_pools, 2 * out.size), dtype=np.bool_)
    return (ints[:n], ints[n:n + n_cells], ints[n + n_cells:need], held["w"], held["bits"],
            held["want"], out)


# -- a step of one sequence in one call ------------------------------------------------

# the three passes `one_step` runs in turn, each as its own kernel runs it (under its
# kernel's argument types: `shared`, so that one compile serves both)
_write_rows_in = inner(_write_rows_into)
_scatter_singles_in = inner(_scatter_singles_into)
_recheck_one_in = inner(_recheck_one_into)


def _one_step_into(state, rows, key_ids, slot_of, free, n_handed, pristine, gen, n_ubatch,
                   decode_kind, key, gate, pooled, pooled_bits, slot_row, key_gen, pool_gen,
                   pool_of, w_kind, w_ubatch, w_a, w_b, out, entry_rows, rep, order, grows,
                   entry_pool, pool_start, pooled_kind, padding_kind, s_out, changed, start,
                   n_bad, kept, known, rep_pos, rep_rows, kv_size, lookup_max, dirty_before,
                   pos, keys, pools, row0, scatter, cells, how, tail, ms, val, val_bits, w,
                   bits, want, verdicts, got):  # pragma: no cover - compiled
    n = rows.size
    for j in range(1, n):  # distinct, as `write_rows`' door asks them
        for i in range(j):
            if rows[i] == rows[j]:
                got[0] = NOT_DISTINCT
                return WROTE_NOTHING
    why, at = _write_rows_in(state, rows, key_ids, slot_of, free, n_handed, pristine, gen,
                             n_ubatch, decode_kind, key, gate, pooled, slot_row, key_gen,
                             pool_gen, w_kind, w_ubatch, w_a, w_b, out, True)
    got[0] = why
    got[1] = at
    if why != WROTE:
        return WROTE_NOTHING
    handed = n_handed + at - min(at, free.size)  # `SlotTable.handed_out`
    n_changed = 0
    if scatter:
        g, _why, n_changed, n_kept = _scatter_singles_in(
            slot_of, slot_row, handed, key, gate, pooled, pooled_bits, pool_of, pool_gen,
            key_gen, gen + 1, entry_rows, rep, order, grows, entry_pool, pool_start, n_ubatch,
            pooled_kind, padding_kind, w_kind, w_ubatch, w_a, w_b, s_out, changed, ms, val,
            val_bits, w, bits)
        if g >= 0:
            return ROWS_WRITTEN
        got[2] = n_changed
        got[3] = n_kept
    # the changed cells the verification reads: those before, the rows written (keys
    # and pooled rows), the rows the scatter changed (`Verifier.touch`, in any order:
    # the rule reads their least pair and their count)
    m = dirty_before.size
    for i in range(m):
        cells[i] = dirty_before[i]
    for j in range(n):
        cells[m + j] = rows[j]
        cells[m + n + j] = rows[j]
    m += 2 * n
    for i in range(n_changed):
        cells[m + i] = grows[changed[i]]
    m += n_changed
    way = _recheck_one_in(start, n_bad, kept, known, rep_pos, rep_rows, kv_size, True,
                          m > lookup_max, cells[:m], pos, how, tail, keys, pools, row0,
                          slot_of, handed, key, gate, pooled, pool_of, pool_gen, key_gen, ms,
                          w, bits, want, verdicts)
    if way == _ASK_AGAIN:
        return SCATTERED
    got[4] = way
    return RECHECKED


_ONE_STEP_SIG = ("i8(u8, i8[::1], i8[::1], {}[::1], i8[::1], i8, i8, i8, i8, i1, f4[:, ::1], "
                 "i1[:, ::1], f4[:, ::1], i4[:, ::1], i8[::1], i8[::1], i8[::1], i8[:, ::1], "
                 "i1[::1], i8[::1], i8[::1], i8[::1], i8[::1], i8[:, ::1], i8[::1], i8[::1], "
                 "i8[::1], i8[::1], i8[::1], i8, i8, i8[::1], i8[::1], i8[::1], i8[::1], "
                 "i8[::1], b1[::1], i8[::1], i8[::1], i8, i8, i8[::1], i8[::1], i8[::1], "
                 "i8[::1], i8, b1, i8[::1], i8[::1], i8[::1], i8[::1], f4[::1], i4[::1], "
                 "f4[:, ::1], i4[:, ::1], f4[::1], b1[::1], i8[::1])")
# one kernel per slot map dtype, as `_write_rows_i4`, `_i8`
_one_step_i4 = kernel(_one_step_into, "_one_step_i4", _ONE_STEP_SIG.format("i4"))
_one_step_i8 = kernel(_one_step_into, "_one_step_i8", _ONE_STEP_SIG.format("i8"))


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
    """A ubatch of one sequence in one pass, where each of its three parts can: the
    decode's rows written (`write_rows`, at generation `gen`), the scatter of a plan of
    race groups of one entry each (`scatter_singles`, at `gen + 1`, with the slots the
    write handed out; not `scatter`: none, the plan standing), then the verification of
    the layout's one sequence (`recheck_one`, its changed cells `dirty_before`, the rows
    written and the rows the scatter changed). Each part runs as its own kernel runs
    it; the first that hands back (or refuses) ends the pass, none of its writes made.

    Parameters
    ----------
    state, rows, key_ids, slot_of, free, n_handed, pristine, gen, n_ubatch, decode_kind,
    key, gate, pooled, slot_row, key_gen, pool_gen, w_kind, w_ubatch, w_a, w_b :
        as `write_rows` (`decode_kind` its `kind`); `rows` distinct (checked here)
    pool_of, entry_rows, rep, order, grows, entry_pool, pool_start, pooled_kind,
    padding_kind : as `scatter_singles` (`grows` its group rows)
    start, n_bad, kept, known, rep_pos, rep_rows, kv_size, pos, keys, pools, row0 :
        as `recheck_one`
    lookup_max : int
        The changed cells past which the verification scans (`too_many`).
    dirty_before : array of int64
        The one stream's cells changed before this ubatch.

    Returns
    -------
    (reached, why, at, slots, changed, n_kept, way, verdicts), or None, nothing done
        (more than `ONE_STEP_MAX_ROWS` rows, or a write the parallel key build takes).
        `reached`: `WROTE_NOTHING` (`why`, `at`: `write_rows`' refusal, or
        `NOT_DISTINCT`), `ROWS_WRITTEN` (`at`: the rows that got a slot; the scatter
        refused or met a row without a slot), `SCATTERED` (also `slots`, `changed`,
        `n_kept`: `scatter_singles`' answer; the verification hands back) or
        `RECHECKED` (also `way`, `verdicts`: `recheck_one`'s answer). Without
        `scatter`, `slots` and `changed` are empty and `n_kept` 0.
    """
    n = rows.size
    if n > ONE_STEP_MAX_ROWS or (PARALLEL and n * key.shape[1] >= PARALLEL_MIN_KEYS):
        return None
    n_groups, kpool, n_embd = rep.size, pool_of.shape[1], key.shape[1]
    s = np.empty(n_groups, dtype=np.int64)
    changed = np.empty(n_groups, dtype=np.int64)
    val = np.empty(n_embd, dtype=np.float32)
    verdicts = np.zeros(max(int(start[1] - start[0] - kept[0]), 0), dtype=np.bool_)
    got = np.array([0, 0, 0, 0, NONE], dtype=np.int64)  # `way` NONE unless it rechecked
    into = _one_step_i4 if slot_of.dtype == np.int32 else _one_step_i8
    reached = into(state, rows, key_ids, slot_of, free, n_handed, pristine, gen, n_ubatch,
                   decode_kind, key, gate, pooled, pooled.view(np.int32), slot_row, key_gen,
                   pool_gen, pool_of, w_kind, w_ubatch, w_a, w_b, np.empty(n, dtype=np.int64),
                   entry_rows, rep, order, grows, entry_pool, pool_start, pooled_kind,
                   padding_kind, s, changed, start, n_bad, kept, known, rep_pos, rep_rows,
                   kv_size, lookup_max, dirty_before, pos, keys, pools, row0, scatter,
                   np.empty(dirty_before.size + 2 * n + n_groups, dtype=np.int64),
                   np.empty(1, dtype=np.int64), np.empty(1, dtype=np.int64),
                   np.empty(kpool, dtype=np.int64), val, val.view(np.int32),
                   *_scratch(kpool, n_embd), np.empty(n_embd, dtype=np.float32), verdicts,
                   got)
    why, at, n_changed, n_kept, way = got.tolist()
    slots = s if reached >= SCATTERED and scatter else s[:0]
    return (int(reached), why, at, slots, changed[:n_changed], n_kept, way,
            verdicts if reached == RECHECKED and way == NEW else verdicts[:0])


def recheck_ways(start: np.ndarray, n_bad: np.ndarray, kept: np.ndarray, known: np.ndarray,
                 rep_pos: np.ndarray, rep_rows: np.ndarray, kv_size: int, dirty: bool,
                 too_many: bool, cells: np.ndarray, pos: np.ndarray, least: int
                 ) -> tuple[np.ndarray, np.ndarray, bool]:
    """How each sequence finds its pools to recheck, its kept tail (recheck.py's rule,
    for every sequence in one pass), and whether the least changed pair lies at or
    before some tail.

    Parameters
    ----------
    start : array of int64, shape (n + 1,), C-contiguous
        Each sequence's first pool in the layout (and the total).
    n_bad, kept : arrays of int64, shape (n,), C-contiguous
        The verdicts each sequence keeps; the pools the update kept.
    known : array of bool, shape (n,), C-contiguous
        Whether each sequence's pairs are known to equal the cache's.
    rep_pos, rep_rows : arrays of int64, C-contiguous
        Every pool's rep pos and rep row, in layout order.
    cells, pos : arrays of int64, C-contiguous
        Changed cells of one stream and that stream's cell positions: their pairs are
        changed pairs (`least_pair`'s rule).
    least : int
        The least changed pair of the other streams (INT64_MAX for none).

    Returns
    -------
    (how, tail, before) : arrays of int64, shape (n,), and a bool
        The way of each sequence (`NEW`, `NONE` or `SCAN`; `LOOK` is the verifier's
        to decide), its tail (`NO_TAIL` where it has none), and whether the least of
        `least` and the pairs of `cells` is at or below some tail. A cell outside the
        stream, or a last kept pool outside the columns, is `IndexError`.
    """
    how = np.empty(kept.size, dtype=np.int64)
    tail = np.empty(kept.size, dtype=np.int64)
    err, before = _recheck_ways_into(start, n_bad, kept, known, rep_pos, rep_rows, kv_size,
                                     dirty, too_many, cells, pos, least, how, tail)
    if err <= -2:
        i = -2 - err
        raise IndexError(f"cells[{i}] is cell {cells[i]}, outside the stream")
    if err >= 0:
        raise IndexError(f"sequence {err}: its last kept pool is outside the layout's columns")
    return how, tail, bool(before)


@_value_kernel("i8(i8[::1], i8[::1], i8[::1])")
def _least_pair(cells, pos, at):
    least, bad = _least_of(cells, pos)
    at[0] = bad
    return least


def least_pair(cells: np.ndarray, pos: np.ndarray) -> int:
    """The least pair `pos << CELL_BITS | cell` of the cells `cells` of a stream whose
    cells have the positions `pos` (INT64_MAX for no cell). A cell outside the stream
    is `IndexError`."""
    at = np.full(1, -1, dtype=np.int64)
    least = _least_pair(cells, pos, at)
    if at[0] >= 0:
        raise IndexError(f"cells[{at[0]}] is cell {cells[at[0]]}, outside the stream")
    return int(least)
