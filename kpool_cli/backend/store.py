"""The value backend: key, gate and pooled rows, and the per-ubatch value verdicts.

Owns `ValueBackend`, the replay's value backend (the `Backend` protocol of
`kpool_cli.replay`: write_rows, zero_rows, copy_stream, snapshot, restore, clear,
run_ubatch -> ValueFacts; and content, gather), the thin owner of its parts, which
says in which order they act on each call:
- `slots.py`: rows -> slots, the per-slot arrays (key, gate, pooled, writers,
  poolings) and their growth in anonymous memory maps, the generations;
- `guards.py`: `PlanError` and the index and shape checks (the rows the replay
  hands in are checked here, where they come in);
- `guarded.py`: the kernels, each behind its checks, and the time spent in them;
- `writers.py`: who last wrote each row (for `content`), and the racing writers;
- `verify.py`: what changed, and the incremental verification of the bad pools;
and itself: the pool and scatter of a ubatch (ENGINE.md §1 step 4), the snapshots
(a state_write's rows whole, racing writers included), the entry points
(`BACKENDS`, `kernel_module`, `make_backend`) and the memory sums.

Pool and scatter: every entry of the plan is pooled, and the last entry of each
row stored (set_rows run sequentially). A scatter entry whose rep slot holds the
pooling of the same member slots, none written since (`pool_of`, `pool_gen`,
`key_gen`: `slots.py`), keeps that value instead of pooling again (ENGINE.md §6:
cache-safe re-pools every pool each ubatch; a pool whose members and keys did not
change pools to the same bits). A scatter of the last plan again, none of its rows
written since, keeps every entry without asking (`_Standing`).

A ubatch of one sequence (every step of one slot) hands its write in with its plan
(`run_ubatch(ctx, written)`: nothing reads the values between the cells' write and
the plan) and, where its plan is race groups of one entry each, runs the write, the
scatter and the verification in one kernel call (`_one_step`,
`GuardedKernels.one_step`; the write and the verification alone where the plan
stands: rep-once's steps that close no pool); each part that call ran is told to
the parts that keep track as its own call tells them, and the parts it handed back
run as they always do.

Invariants:
- the stored state is a function of the trace alone: the scatter picks one writer
  per row (the last entry) before any kernel runs, so thread order never matters;
  which slot a row gets never changes a value (`slots.py`);
- every call that writes values takes a new generation first (`next_gen`), and
  tells each part what it wrote: the slot table (`wrote`, or the scatter's
  `pool_of`/`pool_gen`: bit-equal to pooling every entry), the writers (`stamp`,
  `drop_raced`), the verification (`touch`);
- after `run_ubatch`, `bad[s][k]` is True exactly when the rep row of pool k of s
  differs from the pooling of the pool's current members with their current keys
  and gates, or is a race of different values (`verify.py`);
- while a plan stands (`_Standing`), each of its entries' rep slots held the pooling
  of that entry's own member slots after its last scatter, and the rows written
  since are the verification's touched rows (since the last scatter, whenever
  `verify` ran): a scatter of it, none of those rows among its own, keeps every
  entry;
- nothing reaches a kernel unchecked (`guards.py`, `guarded.py`), and a call
  refused for what the replay handed in changes nothing: those checks run before
  the call's first write (tests/test_backend_kernels.py holds the state equal).

Memory: `bytes_held()` says what an instance holds, `ValueBackend.bytes_bound`
what a trace can make it hold (`budget.py` adds the other parts of a replay). Each
part's share is computed next to what allocates it (`SlotTable`, `Writers`,
`Verifier`); this module adds the snapshots and one ubatch's temporaries.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ..arrays import SameArrays, same_referents, union, unique
from ..cache.kv import Reach
from ..contracts.report_format import VALUE_BACKENDS
from ..engine.context import UbatchContext, groups_entries
from ..engine.layout import Layout, LayoutChange, pools_past
from ..engine.marking import entries_bound
from ..engine.scatter import ScatterPlan
from ..signals import masked
from ..trace.model import CacheConfig, Trace
from .facts import (
    DECODE_ZERO,
    DROP_ZERO,
    PADDING,
    POOLED,
    RowContent,
    ValueFacts,
    groups_equal,
)
from .guarded import GuardedKernels
from .guards import (
    ANY,
    RECHECKED,
    ROWS_WRITTEN,
    SCATTERED,
    WROTE_NOTHING,
    PlanError,
    checked_index,
    checked_rows,
)
from .keys import seed_state
from .slots import SlotTable
from .verify import LOOKUP_MAX_ROWS, Verifier
from .writers import Writers

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "PlanError", "ValueBackend", "kernel_module",
           "make_backend"]

BACKENDS = (*VALUE_BACKENDS, "none")  # "none": a model-only replay
DEFAULT_BACKEND = "numba"


def kernel_module(name: str) -> ModuleType:
    """The kernels of backend `name` ("numba" imports numba: do it only when asked)."""
    if name == "numba":
        # numba loads (or compiles) each kernel on its first call, and an inner one
        # while kernels.py is imported
        from ..jit import cache_loads_only

        with masked(), cache_loads_only():
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


@dataclass(slots=True)
class _Saved:
    """A state_write's rows: their arrays and racing writers, in snapshot order."""

    key: np.ndarray
    gate: np.ndarray
    pooled: np.ndarray
    alt: dict[int, np.ndarray]  # snapshot index -> racing writers

    def nbytes(self) -> int:
        return (self.key.nbytes + self.gate.nbytes + self.pooled.nbytes
                + sum(Writers.ALT_ROW_BYTES + w.nbytes for w in self.alt.values()))


_NO_GROUPS = np.empty(0, dtype=np.int64)
_NO_GROUPS.flags.writeable = False


class _Standing:
    """The last scatter, kept while a scatter of the same plan would keep every entry
    (ENGINE.md §6: cache-safe re-pools every pool each ubatch; a pool whose members and
    keys did not change pools to the same bits).

    It is set after a scatter that handed out no slot and in which each race group's
    entries name one pooling (the same member slots): every entry's rep slot then
    holds the pooling of the entry's own members, none written since (slots.py's
    invariants). A later scatter of the very same plan (its entries', race groups'
    and the layout's `pool_start` arrays, by identity, as `SameArrays` compares them:
    a re-pool-all plan is the layout's own columns while its pools stand) with none
    of the plan's rows touched since (`Verifier.touched`: every write of a key, a gate
    or a pooled row outside a scatter tells the verifier its rows, and a scatter's own
    writes are behind it) keeps every entry, as `fresh_groups` would say, and does
    nothing else a reader can see but stamp its winners' slots again (the same
    writers, now). So a ubatch of cache-safe on pools that stand costs the rows
    written, not the pools marked.

    A standing plan that was every pool of the layout (a re-pool-all plan, unpadded)
    also vouches for part of the next such plan, built on the very next update
    (`new_entries`): the pools that update kept (`LayoutChange.kept`: the same pairs,
    so the same member and rep rows) were the standing plan's, and while none of its
    rows is touched each of their entries keeps its pooling, as above; only the race
    groups of the other entries (the pools added or regrouped) are asked. So a ubatch
    of cache-safe whose update closed a pool asks the new pool, not every pool.

    Memory: a stamp per global row (`ROW_BYTES`), the plan's rows stamped the first
    time the plan is met again (a plan never met again costs none; rep-once's padded
    steps that mark no pool meet theirs again while the rep rows stand; a plan the
    last one vouched for but a few entries stamps those entries' rows alone: `set`),
    and the plan's member and rep rows and its race groups' slots (`ENTRY_BYTES` each). A
    row of the standing plan holds the plan's stamp, so a new plan unstamps nothing:
    its stamp is the next one. A plan grown from the standing one keeps its stamp
    (`set`), and so do the rows of the pools it dropped: a row that holds the stamp
    is the plan's or was, which can only send a scatter down the full path. After
    the last stamp, every row is unstamped at once (a new zeroed array), at most once
    every 255 plans."""

    ROW_BYTES = 1
    ENTRY_BYTES = 8  # per member row and rep row kept, and per race group's slot
    _STAMP_LAST = np.iinfo(np.uint8).max

    def __init__(self, n_rows: int) -> None:
        self.rows = np.zeros(n_rows, dtype=np.uint8)  # a plan's stamp on its rows
        self._stamp = 0  # the last stamp given
        self._plan: tuple[np.ndarray, ...] = ()  # its member rows and rep rows
        self._stamped = False  # `_plan`'s rows hold `_stamp`
        self._arrays: tuple[weakref.ref, ...] = ()
        self._slots: np.ndarray | None = None  # the slots of its race groups' rows
        # an every-pool plan's layout: the serial of the update that left it
        self._every: int | None = None
        self._every_start: np.ndarray | None = None  # its layout's pool_start

    def set(self, arrays: tuple[np.ndarray, ...], entry_rows: np.ndarray, rep: np.ndarray,
            slots: np.ndarray, every: tuple[int, np.ndarray] | None = None,
            new: np.ndarray | None = None) -> None:
        """The plan of `arrays` (member rows `entry_rows`, rep rows `rep`, its race
        groups' `slots`) stands. `new`: when the last standing plan vouched for every
        entry of this one but `new` (`new_entries`, which found none of its rows
        touched, so they hold the stamp), the stamp carries: only the new entries'
        rows take it now, where a plan met afresh stamps all its rows the first time
        it is met again. The rows of the last plan's pools that this one dropped keep
        the stamp: a write to one of them only sends a later ubatch down the full
        path (`_untouched` says touched), which stamps afresh. `every`: the plan is every
        pool of the layout as the update of serial every[0] left it, whose pool_start
        is every[1]."""
        self.clear()
        self._plan, self._arrays, self._slots = (entry_rows, rep), tuple(
            map(weakref.ref, arrays)), slots
        if every is not None:
            self._every, self._every_start = every
        if new is not None:
            self.rows[entry_rows[new]] = self._stamp
            self.rows[rep[new]] = self._stamp
            self._stamped = True

    def clear(self) -> None:
        self._plan, self._stamped, self._arrays, self._slots = (), False, (), None
        self._every = self._every_start = None

    def is_plan(self, arrays: tuple[np.ndarray, ...]) -> bool:
        """`arrays` are the standing plan's (`slots` then asks what was touched)."""
        # held weakly: the plan's memory is its rows and slots alone
        return self._slots is not None and same_referents(self._arrays, arrays)

    def slots(self, arrays: tuple[np.ndarray, ...],
              touched: Callable[[], np.ndarray | None]) -> np.ndarray | None:
        """The slots of the race groups' rows when `arrays` are the standing plan's and
        none of its rows is `touched()` (None: every row is); else None."""
        if not self.is_plan(arrays):
            return None
        return self._slots if self._untouched(touched) else None

    @property
    def race_slots(self) -> np.ndarray | None:
        """The slots of the standing plan's race groups' rows (never written)."""
        return self._slots

    def stood(self, change: LayoutChange) -> None:
        """A scatter of the very plan kept every entry after the update `change` (which
        changed no pool of an every-pool plan: its arrays are the layout's own)."""
        if self._every is not None:
            self._every = change.serial

    def new_entries(self, layout: Layout, change: LayoutChange, entry_pool: np.ndarray,
                    touched: Callable[[], np.ndarray | None]) -> np.ndarray | None:
        """The entries (ascending) of a plan of every pool of `layout` that the standing
        plan does not vouch for, when it vouches for the others: it was every pool of
        the layout as the update before `change` left it, and none of its rows is
        `touched()`. The others are the pools `change` kept, each its entry in the
        standing plan, keeping its pooling. Else None. (It rests on the layout's
        pools changing only in `Layout.update`, which counts `serial`, and on a
        sequence's stream never moving, so a kept pool's member rows are its own.)"""
        if not self.may_vouch(layout, change, entry_pool) or not self._untouched(touched):
            return None
        # each sequence's other pools follow its kept ones
        return pools_past(layout.pool_start(), np.asarray(change.kept, dtype=np.int64))

    def may_vouch(self, layout: Layout, change: LayoutChange, entry_pool: np.ndarray) -> bool:
        """The standing plan was every pool of `layout` as the update before `change`
        left it, and the plan of `entry_pool` is every pool of it now: `new_entries`
        then asks what was touched."""
        return (self._every is not None and change.serial == self._every + 1
                and layout.is_every_pool(entry_pool))

    def dropped_none(self, change: LayoutChange) -> bool:
        """The update `change`, which `new_entries` found the standing plan vouches
        for (ask it first), kept every pool of that plan: its new plan is the standing
        one with pools appended to its sequences, and each race group without a new
        entry is one of the standing plan's, with the same entries (the same pools, in
        the same order) and so the same last one."""
        assert self._every_start is not None
        return tuple(np.diff(self._every_start).tolist()) == change.kept

    def _untouched(self, touched: Callable[[], np.ndarray | None]) -> bool:
        """None of the standing plan's rows is `touched()` (None: every row is)."""
        rows = touched()
        if rows is None:
            return False
        if not self._stamped:
            if self._stamp == self._STAMP_LAST:
                self.rows = np.zeros(self.rows.size, dtype=np.uint8)
                self._stamp = 0
            self._stamp += 1
            for a in self._plan:
                self.rows[a] = self._stamp
            self._stamped = True
        return not bool((self.rows[rows] == self._stamp).any())

    def bytes_held(self) -> int:
        return (self.rows.nbytes + sum(a.nbytes for a in self._plan)
                + (0 if self._slots is None else self._slots.nbytes))


def _own_columns(layout: Layout, plan: ScatterPlan) -> bool:
    """`plan` is every pool of `layout` made of the layout's own columns, by identity
    (`Layout.every_pool`, `pool_members`, `pool_cells`: a re-pool-all plan, unpadded,
    as engine/scatter.py builds it): its kept pools' rows are the layout's, carried
    over an update that keeps their pairs. A plan built otherwise (a doctored one, a
    future builder's) is never vouched for by its layout."""
    return (layout.is_every_pool(plan.entry_pool) and plan.entry_rows is layout.pool_members()
            and plan.entry_rep is layout.pool_cells())


class ValueBackend:
    """Key rows, pooling, scatter and gather for one replay, and KP001 values / KP003."""

    # the parts' sizes, as the memory tests and the budget read them
    SLOTS_MIN = SlotTable.SLOTS_MIN
    SLOT_GROWTH = SlotTable.SLOT_GROWTH
    SLOT_ARRAYS = SlotTable.SLOT_ARRAYS
    SLOT_BYTES = SlotTable.SLOT_BYTES
    # bytes per global row: the two dirty masks and the standing plan's (the row ->
    # slot map's dtype's size comes on top of these)
    ROW_BYTES = Verifier.ROW_BYTES + _Standing.ROW_BYTES
    ALT_ROW_BYTES = Writers.ALT_ROW_BYTES

    def __init__(self, config: CacheConfig, seed: int, kernels: str = DEFAULT_BACKEND) -> None:
        self.name = kernels
        self.k = kernel_module(kernels)
        self.config = config
        self.kpool, self.kv_size = config.kpool, config.kv_size
        self.n_rows, self.n_embd = config.n_rows, config.n_embd
        self.state = seed_state(seed)
        self.slots = SlotTable(config)
        self.kernels = GuardedKernels(self.k, self.state, self.slots)
        self.writers = Writers(config, self.slots)
        self.verifier = Verifier(config, self.slots, self.kernels, self.writers)
        self.snapshots: dict[str, _Saved] = {}
        self.pools_kept = 0  # scatter entries that kept their rep slot's pooling
        self.ubatches_standing = 0  # scatters that kept every entry by the last plan's
        # a plan that stands (engine/scatter.py) hands on the last plan's entries and
        # race groups (`SameArrays`): their checks stand too
        self._plan_checked = SameArrays(self._check_plan)
        self._standing = _Standing(self.n_rows)
        self._ones = _NO_GROUPS.astype(bool)  # `_all_equal`'s: read-only, grown by doubling
        self._ones.flags.writeable = False
        self._equal = self._ones  # `_all_equal`'s last

    # -- what the parts keep, as the rules, the tests and the benchmark read it ------------

    @property
    def bad(self) -> list[np.ndarray]:
        """The bad pools of every sequence (`verify.py`)."""
        return self.verifier.bad

    @property
    def alt(self) -> dict[int, np.ndarray]:
        """Row -> its racing writers, int64 [g, 2] (`writers.py`)."""
        return self.writers.alt

    @property
    def n_ubatch(self) -> int:
        """run_ubatch calls so far: the index of the current ubatch."""
        return self.writers.n_ubatch

    def time_kernels(self) -> None:
        """Time each kernel from now on (`kernel_time`)."""
        self.kernels.time_kernels()

    @property
    def kernel_time(self) -> dict[str, float]:
        """Seconds spent inside each kernel since `time_kernels` (`guarded.py`)."""
        return self.kernels.time

    @property
    def pools_checked(self) -> int:
        """Pools the incremental verification rechecked (`verify.py`)."""
        return self.verifier.pools_checked

    @property
    def n_slots(self) -> int:
        """Slots in use (the zero row not counted)."""
        return self.slots.n_slots

    # -- memory --------------------------------------------------------------------------

    @classmethod
    def bytes_bound(cls, config: CacheConfig, reach: Reach, kernels: str) -> int:
        """Bytes a backend can hold in a replay that reaches `reach`, temporaries of one
        ubatch included.

        Fixed: per global row the slot map, the two dirty masks and the standing
        plan's mask (`_Standing`; its member and rep rows and its groups' slots are a
        term of each entry). Slots: at most
        one per row that gets data, so at most `reach.value_rows` (rows the cache
        writes, padding rows, copies of both); capacity grows by 1/SLOT_GROWTH (in
        place) up to that. `alt`: at most an entry per row with a slot, a writer per
        sequence (and row 0's padding under row-zero padding, a writer per entry).
        Snapshots: their rows whole. One ubatch: its entries' pooled values and
        member slots (the numpy twin's pooling also keeps kpool-wide gate copies and
        weights: about 3 kpool + 12 rows an entry); a ubatch has at most
        `marking.entries_bound` entries, a sequence holding at most `reach.cells`
        cells."""
        e, kpool = config.n_embd, config.kpool
        slots = SlotTable.slots_bound(config, reach.value_rows)
        entries = entries_bound(reach.cells, config.kv_size, kpool, config.n_seq_max)
        snapshots = reach.snapshot_rows * (SlotTable.row_bytes(config)
                                           + Writers.alt_row_bytes(config))
        per_entry = 4 * e * (1 if kernels == "numba" else 3 * kpool + 12) + 3 * 8 * kpool
        return (SlotTable.bytes_bound(config, reach.value_rows)
                + Verifier.bytes_bound(config, reach)
                + Writers.bytes_bound(config, slots, entries)
                + config.n_rows * _Standing.ROW_BYTES
                + entries * (kpool + 2) * _Standing.ENTRY_BYTES
                + snapshots
                + entries * per_entry)

    def bytes_held(self) -> int:
        """Bytes of the arrays this backend holds now (snapshots and racing writers
        included; the dirty-row lists of one ubatch and Python objects not)."""
        return (self.slots.bytes_held() + self.verifier.bytes_held()
                + self.writers.bytes_held() + self._standing.bytes_held()
                + sum(sv.nbytes() for sv in self.snapshots.values()))

    def row_values(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """A copy of the `name` ("key", "gate" or "pooled") rows `rows` (every row when
        None: for small caches), [len(rows), n_embd]: float32, the gates int8
        (`slots.SLOT_ARRAYS`)."""
        if name not in ("key", "gate", "pooled"):
            raise ValueError(f"no row array {name!r}")
        rows = (np.arange(self.n_rows) if rows is None
                else checked_rows(rows, self.n_rows, ANY, False, "row_values", "rows"))
        return getattr(self.slots, name)[self.slots.of(rows)]

    # -- the Backend protocol (kpool_cli.replay) ----------------------------------------------

    def write_rows(self, rows: np.ndarray, key_ids: np.ndarray) -> None:
        """A ubatch's cells are written: new key and gate rows, pooled slots zeroed, the
        writer stamped (`GuardedKernels.write_rows`, one kernel pass with the slots
        the rows without one are handed)."""
        rows = checked_rows(rows, self.n_rows, ANY, True, "write_rows", "rows")
        key_ids = checked_index(key_ids, None, 0, rows.shape, False, "write_rows", "key_ids",
                                "key id")
        self.slots.next_gen()
        self.kernels.write_rows(rows, key_ids, self.writers.n_ubatch, DECODE_ZERO)
        self._wrote(rows)

    def _wrote(self, rows: np.ndarray) -> None:
        """A decode's `rows` were written (keys, gates, zeroed pooled rows, the
        writer): their racing writers go, and the verifier is told."""
        self.writers.drop_raced(rows)
        self.verifier.touch(rows, True, True)

    def zero_rows(self, rows: np.ndarray) -> None:
        """state_drop: rows only the dropped sequence held are zeroed whole (a zero row
        already is: `writers.py`)."""
        rows = checked_rows(rows, self.n_rows, ANY, True, "zero_rows", "rows")
        t = self.slots
        s = t.of(rows)
        has = s > 0
        rows, s = rows[has], s[has]
        t.next_gen()
        t.wrote(s)
        t.key[s] = 0
        t.gate[s] = 0
        t.pooled[s] = 0
        self.writers.stamp(s, DROP_ZERO)
        self.writers.drop_raced(rows)
        self.verifier.touch(rows, True, True)

    def copy_stream(self, src: int, dst: int) -> None:
        """Cross-stream seq_cp: every row of stream src (pooled slots included) to dst.
        Costs the rows of the two streams that have slots."""
        n_stream = self.config.n_stream
        for name, strm in (("src", src), ("dst", dst)):
            if not 0 <= strm < n_stream:
                raise PlanError(f"copy_stream: {name} is stream {strm}, outside the "
                                f"{n_stream} streams 0..{n_stream - 1}", "copy_stream", name)
        t = self.slots
        t.next_gen()
        gone, dst_rows, s_dst = t.copy_stream(src, dst)
        t.wrote(s_dst)
        self.writers.copy_stream(s_dst, src, dst)
        self.verifier.touch(np.concatenate((gone, dst_rows)), True, True)

    def snapshot(self, slot: str, rows: np.ndarray) -> None:
        """state_write: save the rows whole (pooled slots included), in snapshot order."""
        rows = checked_rows(rows, self.n_rows, ANY, True, "snapshot", "rows")
        t = self.slots
        s = t.of(rows)
        self.snapshots[slot] = _Saved(t.key[s], t.gate[s], t.pooled[s],
                                      self.writers.races_of(rows))

    def restore(self, slot: str, rows: np.ndarray) -> None:
        """state_read: the saved rows come back whole into `rows` (snapshot order)."""
        rows = checked_rows(rows, self.n_rows, ANY, True, "restore", "rows")
        saved = self.snapshots[slot]
        if rows.size != saved.key.shape[0]:
            raise PlanError(f"restore: {rows.size} rows for snapshot {slot!r} of "
                            f"{saved.key.shape[0]}", "restore", "rows")
        t = self.slots
        t.next_gen()
        s = t.own(rows, zero_new=False)
        t.wrote(s)
        t.key[s] = saved.key
        t.gate[s] = saved.gate
        t.pooled[s] = saved.pooled
        self.writers.restored(s, rows, slot, saved.alt)
        self.verifier.touch(rows, True, True)

    def clear(self) -> None:
        """Every row zeroed: every slot freed (costs the slots, not the rows)."""
        self.slots.clear()
        self.writers.clear()
        self.verifier.all_changed()
        self._standing.clear()

    def run_ubatch(self, ctx: UbatchContext,
                   written: tuple[np.ndarray, np.ndarray] | None = None) -> ValueFacts:
        """Pool the new entries of the ubatch of `ctx` (which has a plan), scatter them,
        verify what changed (`ctx.change`: the layout update's). `written`: the
        ubatch's rows and key ids, written first (`write_rows`), where the replay
        hands them in here (nothing reads the values between its cells' write and
        its plan). Returns the facts the rules read: which race groups write equal
        values, the bad pools of every sequence, and what the first bad pool of each
        holds.

        A ubatch of one sequence whose plan is race groups of one entry each (every
        step of one slot: `_one_step`) runs the write, the scatter and the
        verification in one kernel call where each can; what that call hands back
        runs here as it always does."""
        # how far the one call went (`guards.py`): the rest runs here
        reached, equal = ROWS_WRITTEN, None
        if written is not None:
            reached, equal = self._one_step(ctx, *written)
            if reached == WROTE_NOTHING:
                self.write_rows(*written)
        if equal is None:
            equal = self._scatter(ctx)
        if reached != RECHECKED:
            self.verifier.verify(ctx.layout, ctx.change, ctx.cache,
                                 one_tried=reached == SCATTERED)
        bad = {s: self.verifier.bad_of(s) for s in sorted(self.verifier.bad_seqs)}
        first_bad = {}
        for s, pools in bad.items():
            k = int(np.argmax(pools))
            row = int(ctx.layout.seqs[s].rep_rows.view[k])
            first_bad[s] = (k, row, self.content(row))
        self.writers.n_ubatch += 1
        return ValueFacts(equal, bad, first_bad, equal is self._equal)

    def _one_step(self, ctx: UbatchContext, rows: np.ndarray, key_ids: np.ndarray
                  ) -> tuple[int, np.ndarray | None]:
        """`write_rows(rows, key_ids)`, `_scatter(ctx)` and `verify` in one kernel call
        (`GuardedKernels.one_step`), where the ubatch is what that call takes: a
        layout and cache of one sequence and one stream whose one-call verification
        may answer (`Verifier.one_open`), a plan of race groups of one entry each
        that no standing plan vouches for (`_Standing.may_vouch`: `_scatter`'s
        `singles`, decided before the write), or the plan that stands, none of its
        rows touched, the write's included (then the call scatters nothing:
        `_stood`). Each part
        the call ran is told to the parts that keep track, in the order and the
        words of `write_rows`, `_scatter` and `verify`. Returns how far the call went
        (`guards.py`: `WROTE_NOTHING` for a ubatch it does not take) and, when it
        scattered, the groups' `_all_equal`."""
        layout, plan, cache, change = ctx.layout, ctx.plan, ctx.cache, ctx.change
        assert plan is not None  # the replay runs a backend on a plan only
        standing, writers, verifier = self._standing, self.writers, self.verifier
        n = plan.entry_rep.size
        if n == 0 or n != ctx.rows.size or not verifier.one_open(layout, cache):
            return WROTE_NOTHING, None
        pool_start = layout.pool_start()
        arrays = (plan.entry_rep, plan.entry_rows, plan.entry_pool, ctx.order, ctx.starts,
                  ctx.rows, pool_start)
        if standing.may_vouch(layout, change, plan.entry_pool):
            return WROTE_NOTHING, None
        kept_slots = None
        if standing.is_plan(arrays):
            # `_standing_slots`, asked before the write: what it touches, it counts
            kept_slots = standing.slots(arrays, lambda: verifier.touched_with(rows))
            if kept_slots is None:
                return WROTE_NOTHING, None
        n_pools, n_bad, kept, known, rep_pos, rep_rows, before, pos, keys, pools, row0 = \
            verifier.one_args(layout, change, cache, True)
        got = self.kernels.one_step(
            rows, key_ids, writers.n_ubatch, DECODE_ZERO, plan.entry_rows, plan.entry_rep,
            ctx.order, ctx.rows, plan.entry_pool, pool_start, POOLED, PADDING, n_pools, n_bad,
            kept, known, rep_pos, rep_rows, LOOKUP_MAX_ROWS, before, pos, keys, pools, row0,
            kept_slots is None)
        if got is None or got[0] == WROTE_NOTHING:
            return WROTE_NOTHING, None
        reached, _why, _at, slots, changed, n_kept, way, verdicts = got
        t = self.slots
        # `write_rows`, after its kernel (the slots handed out are counted: the door)
        t.next_gen()
        self._wrote(rows)
        if reached == ROWS_WRITTEN:
            return reached, None
        if kept_slots is not None:  # `_scatter` of the plan that stands
            equal = self._stood(change, kept_slots, n)
        else:  # `_scatter`'s singles, after their kernel
            standing.clear()
            t.next_gen()
            equal = self._singles_scattered(arrays, plan.entry_rows, plan.entry_rep, slots,
                                            ctx.rows[changed], n_kept,
                                            self._every(layout, change, plan))
        if reached == RECHECKED:
            verifier.verified_one(layout, change, way, verdicts)
        return reached, equal

    # -- pool and scatter (ENGINE.md §1 step 4) ----------------------------------------------

    def _scatter(self, ctx: UbatchContext) -> np.ndarray:
        """Pool every entry of `ctx.plan`, store the last entry's value per row (set_rows
        run sequentially; rows and their entries are the context's race groups),
        remember the racing writers. Returns [n_groups] bool: the entries of each race
        group write equal values (`values.groups_equal`).

        What changed costs, not what was marked: an entry whose rep slot keeps its
        pooling (`_fresh_groups`) writes the value that slot holds, so a race group of such
        entries alone (every entry of a group has the same rep row, so the same slot)
        writes equal values and leaves its row as it was. Only the other groups' values
        are pooled (or gathered), scattered and compared, and have their pooling
        recorded, in one kernel pass (`kernels.scatter_fresh`);
        every winner's slot is stamped (`Writers.stamp_winners`, one kernel pass, over
        the new entries' groups alone when the standing plan grew by appended pools,
        the other groups' winners writing again: `_Standing.dropped_none`; the
        plan's pools were checked first, by `_check_plan`, and its groups by
        `fresh_groups`, before the first write, so its refusal is kpool's bug). Under
        cache-safe, which re-marks every pool, a ubatch so touches the float rows of
        the pools that changed alone; and while the last plan stands (`_Standing`: the
        same plan, none of its rows written since), nothing is asked of its entries at
        all. A plan of race groups of one entry each, none racing and none vouched for
        (rep-once's, most ubatches) takes the three kernel passes in one
        (`_scatter_singles`), with no array made between them."""
        layout, plan = ctx.layout, ctx.plan
        assert plan is not None  # the replay runs a backend on a plan only
        n = plan.entry_rep.size
        t, writers = self.slots, self.writers
        order, starts, rows = ctx.order, ctx.starts, _i64(ctx.rows)
        arrays = (plan.entry_rep, plan.entry_rows, plan.entry_pool, order, starts, ctx.rows,
                  layout.pool_start())
        standing = self._standing
        # the very plan that stands was checked when it was scattered
        kept_slots = self._standing_slots(arrays) if n else None
        if kept_slots is not None:
            return self._stood(ctx.change, kept_slots, n, rows.size)
        # the entries the standing plan does not vouch for: of a plan it vouches for,
        # only they are checked (`_check_plan`), and only their groups are asked which
        # pool afresh (`_fresh_groups`: a few, under cache-safe); that pass refuses
        # groups that are not the race groups of `rep` before anything is written
        new = self._vouched(ctx)
        # a plan of the layout's own columns (a re-pool-all plan, unpadded) has the kept
        # pools' rows where the standing plan, of its own columns too, had them:
        # checked then (`_check_plan`)
        own = new is not None and _own_columns(layout, plan)
        rep, entry_rows = self._plan_checked(plan.entry_rep, plan.entry_rows, plan.entry_pool,
                                             n_pool_real=layout.n_pool_real,
                                             new=new if own else None)
        # the race groups of the entries the standing plan does not vouch for (each
        # entry's rep row is its group's row, and the rows ascend); None: it vouches
        # for none
        grown = None if new is None else unique(rows.searchsorted(rep[new]))
        # every group of one entry, none racing, none vouched for (a rep-once decode's
        # plan, most ubatches): the pass below in one kernel call (`_scatter_singles`)
        singles = grown is None and 0 < n == rows.size and not writers.alt
        if not singles:
            # the fresh groups, their entries (ascending) and which of those keep their
            # pooling: what follows costs the fresh groups (under cache-safe, the
            # pools that changed), not every group
            todo, ents, keep, n_kept = self._fresh(entry_rows, rep, order, starts, rows,
                                                   grown)
        # the standing plan with pools appended alone (`dropped_none`), whose race
        # groups' slots are this plan's but the new groups'
        appended = new is not None and standing.dropped_none(ctx.change)
        grown_from = standing.race_slots if appended else None
        standing.clear()
        t.next_gen()
        if n == 0:
            return np.ones(0, dtype=bool)
        every = self._every(layout, ctx.change, plan)
        if singles:
            got = self._scatter_singles(entry_rows, rep, order, rows, plan.entry_pool,
                                        layout.pool_start())
            if got is not None:
                # what the pass below does after its writes, for groups none of which
                # races, of a scatter that handed out no slot: the plan stands
                s, wrote_new, n_kept = got
                return self._singles_scattered(arrays, entry_rows, rep, s, rows[wrote_new],
                                               n_kept, every, new)
            # a group's row is a zero row, whose slot `own` hands out: the pass below
            todo, ents, keep, n_kept = self._fresh(entry_rows, rep, order, starts, rows,
                                                   grown)
        self.pools_kept += n_kept
        # the fresh entries' slots as they are before `own` below hands the zero rows
        # theirs
        if todo.size:
            sizes = starts[todo + 1] - starts[todo]
            members, reps = t.of(entry_rows[ents]), t.of(rep[ents])
        n_slots = t.n_slots
        s = self._owned(rows, grown, grown_from)
        # a slot handed out now may be a member's that entries read as a zero row: the
        # plan stands from a scatter that hands out none
        stands = t.n_slots == n_slots
        # the groups whose rows are re-checked (a row whose racing writers go, one
        # written with another value), and those whose entries write unequal values:
        # fresh groups alone can be (others keep their pooling), so neither is a pass
        # over every group
        changed = [np.flatnonzero(writers.raced(rows))] if writers.alt else []
        unequal = _NO_GROUPS
        if todo.size:
            # each fresh group's last entry, as an index into `ents`
            last = order[starts[todo + 1] - 1]
            src = last if ents.size == n else ents.searchsorted(last)
            # the entries' values (a kept one's: its rep slot's, bit-equal to pooling
            # it), each fresh group's row written with its last one's and its pooling
            # (a group of kept entries alone leaves its slot's pooling as recorded:
            # pool_of is their members already, pool_gen still above their key_gen)
            vals, wrote_new = self.kernels.scatter_fresh(members, reps, keep, s[todo], src)
            # a row that got the value it held changes no verdict: only the others (and
            # the rows whose racing writers change) are re-checked
            changed.append(todo[wrote_new])
            raced = sizes > 1  # of the fresh groups: a group of kept entries alone
            if raced.any():      # writes equal values
                sub, sub_starts = groups_entries(order, starts, todo[raced])
                # a group of kept entries alone names one pooling: each of these must
                # too, or the plan does not stand
                equal, one_pooling = groups_equal(
                    vals.view(np.uint32), entry_rows[ents], ents.searchsorted(sub),
                    sub_starts)
                unequal = todo[raced][~equal]
                stands = stands and bool(one_pooling.all())
        if appended:
            # a group without a new entry has the standing plan's last entry, which
            # wrote it again; the new entries' groups are stamped
            assert grown is not None
            writers.wrote_again(s, grown_from)
            writers.stamp_winners(self.kernels, *groups_entries(order, starts, grown),
                                  plan.entry_pool, layout.pool_start(), s[grown])
        else:
            writers.stamp_winners(self.kernels, order, starts, plan.entry_pool,
                                  layout.pool_start(), s)
        writers.drop_raced(rows)
        if unequal.size:
            for g, racers in zip(unequal.tolist(), ctx.group_writers(unequal), strict=True):
                writers.alt[int(rows[g])] = np.array(racers, dtype=np.int64)
            changed.append(unequal)
        # ascending, each once (the groups' rows ascend)
        self.verifier.touch(rows[union(changed)], False, True)
        self.verifier.scattered()
        if stands:
            standing.set(arrays, entry_rows, rep, s, every, new)
        if not unequal.size:
            return self._all_equal(rows.size)
        equal_groups = np.ones(rows.size, dtype=bool)
        equal_groups[unequal] = False
        return equal_groups

    def _owned(self, rows: np.ndarray, grown: np.ndarray | None,
               grown_from: np.ndarray | None) -> np.ndarray:
        """The slots of the race groups' `rows`, each zero row given one
        (`SlotTable.own`). Of a plan grown from the standing one by appended pools
        (`grown_from`, the standing plan's race groups' slots; `grown`, the groups with
        a new entry), when no new entry joined a group of the standing plan (the
        groups without one are then exactly its groups, in its order, each with its
        slot), only the grown groups' rows are asked, and the others' slots are
        `grown_from`'s: no pass over every group's row."""
        t = self.slots
        if grown_from is None or grown is None or grown_from.size != rows.size - grown.size:
            return t.own(rows, zero_new=True)
        return np.insert(grown_from, grown - np.arange(grown.size),
                         t.own(rows[grown], zero_new=True))

    def _stood(self, change: LayoutChange, kept_slots: np.ndarray, n: int,
               n_groups: int | None = None) -> np.ndarray:
        """A scatter of the standing plan's n entries (`_Standing`), after the update
        `change`, which keeps every entry: what the pass would do, which changes no row
        (so it tells the verifier of none); its race groups' rows' slots `kept_slots`
        written again by their writers. Returns `_all_equal` of its groups (n_groups,
        n where None)."""
        self.slots.next_gen()
        self._standing.stood(change)
        self.pools_kept += n
        self.ubatches_standing += 1
        self.writers.wrote_again(kept_slots)
        self.verifier.scattered()
        return self._all_equal(n if n_groups is None else n_groups)

    @staticmethod
    def _every(layout: Layout, change: LayoutChange, plan: ScatterPlan
               ) -> tuple[int, np.ndarray] | None:
        """What a plan that stands keeps of a re-pool-all plan (`_Standing.set`): the
        update's serial and the layout's pool starts, when `plan` is every pool of
        `layout`, made of its own columns (`_own_columns`); else None."""
        return ((change.serial, layout.pool_start()) if _own_columns(layout, plan)
                else None)

    def _singles_scattered(self, arrays: tuple[np.ndarray, ...], entry_rows: np.ndarray,
                           rep: np.ndarray, slots: np.ndarray, changed_rows: np.ndarray,
                           n_kept: int, every: tuple[int, np.ndarray] | None,
                           new: np.ndarray | None = None) -> np.ndarray:
        """After the pass of a scatter of race groups of one entry each (`singles`),
        none racing, which handed out no slot: the entries kept counted, the rows whose
        bits changed told to the verifier, and the plan stands (`_Standing.set`).
        Returns `_all_equal` of its groups (one a slot of `slots`)."""
        self.pools_kept += n_kept
        self.verifier.touch(changed_rows, False, True)
        self.verifier.scattered()
        self._standing.set(arrays, entry_rows, rep, slots, every, new)
        return self._all_equal(slots.size)

    def _scatter_singles(self, entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
                         rows: np.ndarray, entry_pool: np.ndarray, pool_start: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, int] | None:
        """`_fresh`, `scatter_fresh` and the winners' stamps of a plan of race groups of
        one entry each (group g: entry `order[g]`, row `rows[g]`), none racing, in one
        kernel pass (`Writers.scatter_singles`): (the groups' slots, the groups whose
        bits changed, the entries kept), or None, nothing written, when a group's row
        has no slot yet."""
        return self.writers.scatter_singles(self.kernels, entry_rows, rep, order, rows,
                                            entry_pool, pool_start)

    def _all_equal(self, n_groups: int) -> np.ndarray:
        """[n_groups] True, read-only: the same array while the count holds (no array
        a ubatch of a plan that stands), and by its identity `run_ubatch` says every
        group equal (`ValueFacts.all_equal`, which KP001 keys its valued finding by).
        A view of `_ones`, which grows by doubling: a count that grows (a cache-safe
        plan's, each pool a slot closes) costs no pass."""
        got = self._equal
        if got.size != n_groups:
            if self._ones.size < n_groups:
                self._ones = np.ones(max(n_groups, 2 * self._ones.size), dtype=bool)
                self._ones.flags.writeable = False
            got = self._equal = self._ones[:n_groups]
        return got

    def _check_plan(self, entry_rep: np.ndarray, entry_rows: np.ndarray,
                    entry_pool: np.ndarray, *, n_pool_real: int, new: np.ndarray | None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """The plan's rep rows and member rows, checked (with its pools, each real one
        below `n_pool_real`, the plan's layout's): int64, C-contiguous. `new`: the
        entries the standing plan does not vouch for (`_vouched`), when it vouches for
        the others and the plan's member and rep rows are the layout's own columns
        (`Layout.pool_members`, `pool_cells`, by identity): the plan is then every
        pool of its layout (`entry_pool` is its `every_pool`, 0..n_pool_real-1), and
        each other entry's rows are those its pool had in the standing plan, which
        were checked (the pools an update keeps keep their pairs, and the layout's
        columns carry their rows: `_Standing.new_entries`), so the ranges of the new
        entries alone are read, not a pass over every pool. A plan built otherwise
        (a plug-in's, a doctored one) is checked whole."""
        where = "run_ubatch"
        if new is None:
            rep = checked_rows(entry_rep, self.n_rows, ANY, False, where,
                               "the plan's entry_rep")
            rows = checked_rows(entry_rows, self.n_rows, (rep.size, self.kpool), False,
                                where, "the plan's entry_rows")
            checked_index(entry_pool, -1, n_pool_real, rep.shape, False, where,
                          "the plan's entry_pool", "pool")
            return rep, rows
        # integers of the right shapes (no range: lo None), then the new entries' ranges
        rep = checked_index(entry_rep, None, 0, (n_pool_real,), False, where,
                            "the plan's entry_rep", "row")
        rows = checked_index(entry_rows, None, 0, (n_pool_real, self.kpool), False, where,
                             "the plan's entry_rows", "row")
        checked_rows(rep[new], self.n_rows, ANY, False, where, "the plan's new entry_rep")
        checked_rows(rows[new], self.n_rows, (new.size, self.kpool), False, where,
                     "the plan's new entry_rows")
        return rep, rows

    def _standing_slots(self, arrays: tuple[np.ndarray, ...]) -> np.ndarray | None:
        """When the scatter of the plan of `arrays` keeps every entry because the last
        one's stands (`_Standing`), the slots of its race groups' rows; else None."""
        return self._standing.slots(arrays, self.verifier.touched)

    def _vouched(self, ctx: UbatchContext) -> np.ndarray | None:
        """The entries (ascending) of the plan of `ctx` that the standing plan does not
        vouch for, when it vouches for the others (`_Standing.new_entries`); else None."""
        assert ctx.plan is not None
        return self._standing.new_entries(ctx.layout, ctx.change, ctx.plan.entry_pool,
                                          self.verifier.touched)

    def _fresh(self, entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
               starts: np.ndarray, rows: np.ndarray, grown: np.ndarray | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """`_fresh_groups` asked of the race groups `grown` (ascending), those of the
        entries the standing plan does not vouch for (`_vouched`: a group of vouched
        entries alone keeps its pooling, as the kernel would find), or of every group
        (None): (the fresh groups, ascending; their entries, ascending; which of those
        keep their pooling; the entries kept, of all)."""
        if grown is None:
            fresh, kept, n_kept, in_fresh = self._fresh_groups(entry_rows, rep, order,
                                                               starts, rows)
            todo = np.flatnonzero(fresh)
            if todo.size == fresh.size:  # every group: every entry (groups partition them)
                return todo, np.arange(rep.size, dtype=np.int64), kept, n_kept
            ents = np.flatnonzero(in_fresh)
            return todo, ents, kept[ents], n_kept
        if grown.size == 0:  # every entry vouched for
            return grown, grown, np.ones(0, dtype=bool), rep.size
        # those groups' entries, asked as a plan of their own (its entries in order)
        ents, sub = groups_entries(order, starts, grown)
        sub_fresh, sub_kept, n_sub_kept, in_fresh = self._fresh_groups(
            entry_rows[ents], rep[ents], np.arange(ents.size), sub, rows[grown])
        ents, keep = ents[in_fresh], sub_kept[in_fresh]
        by_entry = np.argsort(ents, kind="stable")
        return (grown[sub_fresh], ents[by_entry], keep[by_entry],
                rep.size - sub_kept.size + n_sub_kept)

    def _fresh_groups(self, entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
                      starts: np.ndarray, rows: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """[n_groups] bool, [n] bool, int, [n] bool: the race groups (`order`, `starts`,
        `rows`) with an entry that does not keep its rep slot's pooling, which entries
        keep it, how many, and which entries are in such a group. An entry (member
        rows `entry_rows`, rep row `rep`) keeps the value its rep slot holds when that
        is the pooling of the same member slots, none of them written since
        (`pool_of`, `pool_gen`; slots.py's invariants): the `fresh_groups` kernel,
        one pass over the entries by their rows, which also refuses groups that are
        not the race groups of `rep` (PlanError)."""
        return self.kernels.fresh_groups(entry_rows, rep, order, starts, rows)

    def gather(self, layout: Layout) -> np.ndarray:
        """[n_pool_real, n_embd] float32: every pool's row through pool_cells
        (ggml_get_rows), as the graph reads them."""
        rows = checked_rows(layout.pool_cells(), self.n_rows, ANY, False, "gather",
                            "the layout's pool_cells")
        return self.kernels.gather(self.slots.of(rows))

    # -- what a row holds --------------------------------------------------------------

    def content(self, row: int) -> RowContent:
        """What row `row`'s pooled slot holds, and who wrote it (`writers.py`)."""
        return self.writers.content(row)
