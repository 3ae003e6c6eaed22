"""The value backend: key, gate and pooled rows, and the per-ubatch value verdicts.

Owns, for every global row (`n_rows = n_stream * kv_size`):
- `key`, `gate`, `pooled`: float32 [n_rows, n_embd] (the cell's indexer key, its
  per-dimension gate logits, and the pooled slot a rep row holds);
- who last wrote the pooled slot (`w_kind`, `w_ubatch`, `w_a`, `w_b`), for messages;
- `alt`: the rows whose last scatter was a race between entries of different
  values, with every racing entry's value (the stored value is the last entry's,
  as a sequential set_rows leaves it; the verdicts consider them all);
- the bad pools of every sequence (`bad[s]`, bool [n_pools of s]) and what changed
  since they were last checked, for the incremental verification of issue point 4.

Invariants:
- after `run_ubatch`, `bad[s][k]` is True exactly when the rep row of pool k of s
  (or any value in `alt` for that row) differs from the pooling of the pool's
  current members with their current keys and gates; `full_bad()` recomputes that
  from scratch and the property test holds the two equal;
- the stored state is a function of the trace alone: the scatter picks one writer
  per row (the last entry) before any kernel runs, so thread order never matters.

The kernels come from `kernels.py` (numba) or `reference.py` (numpy); both give
bit-identical arrays.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ..engine.layout import Layout
from ..engine.scatter import ScatterPlan
from ..trace.model import CacheConfig, Trace
from ..verdict import values
from ..verdict.codes import Finding
from .keys import seed_state

BACKENDS = ("numba", "numpy", "none")
DEFAULT_BACKEND = "numba"

# how a row's pooled slot got its value (w_kind)
NEVER, POOLED, PADDING, DECODE_ZERO, DROP_ZERO, RESTORED, COPIED, CLEARED = range(8)


def kernel_module(name: str) -> ModuleType:
    """The kernels of backend `name` ("numba" imports numba: do it only when asked)."""
    if name == "numba":
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
    """A state_write's rows: their arrays and writers, in snapshot order."""

    key: np.ndarray
    gate: np.ndarray
    pooled: np.ndarray
    alt: dict[int, tuple[np.ndarray, list[tuple[int, int]]]]  # snapshot index -> alt


class ValueBackend:
    """Key rows, pooling, scatter and gather for one replay, and KP001 values / KP003."""

    def __init__(self, config: CacheConfig, seed: int, kernels: str = DEFAULT_BACKEND) -> None:
        self.name = kernels
        self.k = kernel_module(kernels)
        self.config = config
        self.kpool, self.kv_size = config.kpool, config.kv_size
        self.n_rows, self.n_embd = config.n_rows, config.n_embd
        self.state = seed_state(seed)
        shape = (self.n_rows, self.n_embd)
        self.key = np.zeros(shape, dtype=np.float32)  # [n_rows, n_embd] | row, d | key
        self.gate = np.zeros(shape, dtype=np.float32)  # [n_rows, n_embd] | row, d | gate logit
        self.pooled = np.zeros(shape, dtype=np.float32)  # [n_rows, n_embd] | row, d | pooled slot
        self.w_kind = np.zeros(self.n_rows, dtype=np.int8)  # [n_rows] | row | NEVER, POOLED, ...
        self.w_ubatch = np.full(self.n_rows, -1, dtype=np.int64)  # [n_rows] | row | when
        self.w_a = np.full(self.n_rows, -1, dtype=np.int64)  # seq / src stream / slot index
        self.w_b = np.full(self.n_rows, -1, dtype=np.int64)  # k
        self.alt: dict[int, tuple[np.ndarray, list[tuple[int, int]]]] = {}
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

    def _set_writer(self, rows: np.ndarray, kind: int, a=-1, b=-1) -> None:
        self.w_kind[rows] = kind
        self.w_ubatch[rows] = self.n_ubatch
        self.w_a[rows] = a
        self.w_b[rows] = b

    def _drop_alt(self, rows: np.ndarray) -> None:
        if self.alt and rows.size:
            for r in rows.tolist():
                self.alt.pop(r, None)

    # -- the Backend protocol (kpool_cli.replay) ----------------------------------------------

    def write_rows(self, rows: np.ndarray, key_ids: np.ndarray) -> None:
        """A ubatch's cells are written: new key and gate rows, pooled slots zeroed."""
        rows, key_ids = _i64(rows), _i64(key_ids)
        self._timed("write_keys", self.k.write_keys, self.state, rows, key_ids, self.key,
                    self.gate)
        self.pooled[rows] = 0
        self._set_writer(rows, DECODE_ZERO)
        self._drop_alt(rows)
        self._touch(rows, True, True)

    def zero_rows(self, rows: np.ndarray) -> None:
        """state_drop: rows only the dropped sequence held are zeroed whole."""
        rows = _i64(rows)
        self.key[rows] = 0
        self.gate[rows] = 0
        self.pooled[rows] = 0
        self._set_writer(rows, DROP_ZERO)
        self._drop_alt(rows)
        self._touch(rows, True, True)

    def copy_stream(self, src: int, dst: int) -> None:
        """Cross-stream seq_cp: every row of stream src (pooled slots included) to dst."""
        kv = self.kv_size
        s, d = slice(src * kv, (src + 1) * kv), slice(dst * kv, (dst + 1) * kv)
        for a in (self.key, self.gate, self.pooled):
            a[d] = a[s]
        dst_rows = np.arange(dst * kv, (dst + 1) * kv, dtype=np.int64)
        self._set_writer(dst_rows, COPIED, src)
        self._drop_alt(dst_rows)
        for r, v in list(self.alt.items()):
            if src * kv <= r < (src + 1) * kv:
                self.alt[r - src * kv + dst * kv] = v
        self._touch(dst_rows, True, True)

    def snapshot(self, slot: str, rows: np.ndarray) -> None:
        """state_write: save the rows whole (pooled slots included), in snapshot order."""
        rows = _i64(rows)
        alt = {i: self.alt[r] for i, r in enumerate(rows.tolist()) if r in self.alt}
        self.snapshots[slot] = _Saved(self.key[rows], self.gate[rows], self.pooled[rows], alt)

    def restore(self, slot: str, rows: np.ndarray) -> None:
        """state_read: the saved rows come back whole into `rows` (snapshot order)."""
        rows = _i64(rows)
        saved = self.snapshots[slot]
        self.key[rows] = saved.key
        self.gate[rows] = saved.gate
        self.pooled[rows] = saved.pooled
        if slot not in self.slot_names:
            self.slot_names.append(slot)
        self._set_writer(rows, RESTORED, self.slot_names.index(slot))
        self._drop_alt(rows)
        for i, v in saved.alt.items():
            self.alt[int(rows[i])] = v
        self._touch(rows, True, True)

    def clear(self) -> None:
        """Every row zeroed."""
        for a in (self.key, self.gate, self.pooled):
            a[:] = 0
        self._set_writer(np.arange(self.n_rows), CLEARED)
        self.alt.clear()
        self._all_dirty = True

    def run_ubatch(self, layout: Layout, plan: ScatterPlan, race: list[Finding],
                   token_seqs: tuple[tuple[int, ...], ...], token_pos: np.ndarray
                   ) -> list[Finding]:
        """Pool the new entries, scatter them, verify what changed, judge the readers.
        Returns `race` (the static KP001 of the plan, if any) with value evidence, and
        KP003 when a token reads a bad pool."""
        vals = self._scatter(layout, plan)
        findings = [values.race_with_values(f, layout, plan, vals) for f in race]
        self._verify(layout)
        f = values.stale_reads(layout, plan, token_seqs, token_pos, self.bad, self.holds)
        if f is not None:
            findings.append(f)
        self.n_ubatch += 1
        return findings

    # -- pool and scatter (ENGINE.md §1 step 4) ----------------------------------------------

    def _scatter(self, layout: Layout, plan: ScatterPlan) -> np.ndarray:
        """Pool every entry, store the last entry's value per row (set_rows run
        sequentially), remember the racing values. Returns [n_new_g, n_embd]."""
        rep = plan.entry_rep
        vals = self._timed("pool", self.k.pool, self.key, self.gate, _i64(plan.entry_rows))
        if rep.size == 0:
            return vals
        order, starts, rows = values.race_groups(rep)
        win = order[starts[1:] - 1]  # the last entry of each row's group
        self._timed("scatter", self.k.scatter, self.pooled, _i64(rows), vals, _i64(win))
        pools = plan.entry_pool[win]
        real = pools >= 0
        self._set_writer(rows[~real], PADDING)
        if real.any():
            seq, k = layout.locate(pools[real])
            self._set_writer(rows[real], POOLED, seq, k)
        self._drop_alt(rows)
        sizes = np.diff(starts)
        if np.any(sizes > 1):
            writers = values.writers_of(layout, plan.entry_pool)
            bits = vals.view(np.uint32)
            for g in np.flatnonzero(sizes > 1).tolist():
                ents = order[starts[g]:starts[g + 1]]
                if not np.all(bits[ents] == bits[ents[0]]):
                    self.alt[int(rows[g])] = (vals[ents], [writers[e] for e in ents.tolist()])
        self._touch(rows, False, True)
        return vals

    # -- verification (issue point 4) ---------------------------------------------------------

    def _differ(self, members: np.ndarray, reps: np.ndarray) -> np.ndarray:
        """[n] bool: rep row (or any of its racing values) differs from the pooling."""
        bad = self._timed("check", self.k.pools_differ, self.key, self.gate, self.pooled,
                          _i64(members), _i64(reps))
        if self.alt:
            hit = np.flatnonzero(np.isin(reps, np.fromiter(self.alt, dtype=np.int64)))
            if hit.size:
                want = self.k.pool(self.key, self.gate, _i64(members[hit])).view(np.uint32)
                for j, w in zip(hit.tolist(), want, strict=True):
                    cand = self.alt[int(reps[j])][0].view(np.uint32)
                    if np.any(cand != w):
                        bad[j] = True
        return bad

    def _candidates(self, layout: Layout, s: int) -> np.ndarray | None:
        """Pools of s to recheck, or None for all of them."""
        sq = layout.seqs[s]
        n_p = len(sq.pools)
        if self._all_dirty or layout.rebuilt[s] or self.bad[s].size > n_p:
            return None
        parts = [np.arange(layout.new_from[s], n_p, dtype=np.int64)]
        if self._pdirty_rows:
            parts.append(np.flatnonzero(self._pdirty[sq.rep_rows.view]))
        if self._kdirty_rows and n_p:
            rows = sq.strm * self.kv_size + sq.cells
            j = np.flatnonzero(self._kdirty[rows])
            if j.size:
                starts = sq.pools.view
                k = np.searchsorted(starts, j, side="right") - 1
                ok = k >= 0
                ok[ok] &= j[ok] < starts[k[ok]] + self.kpool
                parts.append(k[ok])
        return np.unique(np.concatenate(parts))

    def _verify(self, layout: Layout) -> None:
        """Recheck the pools whose verdict may have changed since the last ubatch."""
        for s, sq in enumerate(layout.seqs):
            n_p = len(sq.pools)
            cand = self._candidates(layout, s)
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

    def full_bad(self, layout: Layout) -> list[np.ndarray]:
        """Every sequence's bad pools, recomputed over every pool (the test oracle of
        the incremental `bad`)."""
        out = []
        for sq in layout.seqs:
            ks = np.arange(len(sq.pools), dtype=np.int64)
            if ks.size == 0:
                out.append(np.zeros(0, dtype=bool))
                continue
            out.append(self._differ(sq.members(ks, self.kpool, self.kv_size),
                                    sq.rep_rows.view[ks]))
        return out

    def gather(self, layout: Layout) -> np.ndarray:
        """[n_pool_real, n_embd] float32: every pool's row through pool_cells
        (ggml_get_rows), as the graph reads them."""
        return self._timed("gather", self.k.gather, self.pooled, _i64(layout.pool_cells()))

    # -- messages -------------------------------------------------------------------------

    def holds(self, row: int, s: int, k: int) -> str:
        """What row `row`'s pooled slot holds, said for a reader of pool s:k."""
        kind, when = int(self.w_kind[row]), int(self.w_ubatch[row])
        a, b = int(self.w_a[row]), int(self.w_b[row])
        if row in self.alt:
            writers = self.alt[row][1]
            other = next((w for w in writers if w != (s, k)), writers[0])
            who = "a padding entry" if other == values.PAD_WRITER else f"pool {values._who(other)}"
            names = ", ".join(values._who(w) for w in writers)
            return (f"{who}'s value when that entry wins the race of ubatch {when} "
                    f"(entries of {names}: no defined winner)")
        if kind == POOLED:
            what = ("its own value from before its members changed" if (a, b) == (s, k)
                    else f"pool {a}:{b}'s value")
            text = f"{what} (written at ubatch {when})"
        elif kind == PADDING:
            text = f"a padding entry's value (written at ubatch {when})"
        elif kind == DECODE_ZERO:
            text = f"a slot zeroed by the decode at ubatch {when}"
        elif kind == DROP_ZERO:
            text = f"a slot zeroed by a state_drop before ubatch {when}"
        elif kind == RESTORED:
            text = (f"a slot restored from snapshot {self.slot_names[a]!r} before ubatch "
                    f"{when}")
        elif kind == COPIED:
            text = f"a slot copied from stream {a} before ubatch {when}"
        elif kind == CLEARED:
            text = f"a slot zeroed by clear before ubatch {when}"
        else:
            text = "a never-written slot"
        return text
