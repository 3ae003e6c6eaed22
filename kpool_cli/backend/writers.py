"""Who wrote what a row holds: the writer bookkeeping behind `content()` and KP003's
messages, and the racing writers of KP001.

Owns:
- who last wrote each slot (`w_kind`, `w_ubatch`, `w_a`, `w_b`: per-slot arrays the
  slot table keeps, `slots.py`), stamped by `stamp` with the current ubatch
  (`n_ubatch`: run_ubatch calls so far, the index of the current ubatch), a
  scatter's rows by `stamp_winners` (one kernel pass over its race groups); a zero
  row's writer is its stream's (`NEVER`, `CLEARED` since a clear, `COPIED` since a
  cross-stream copy): zeroing a row that has no slot (only a pending copy's
  destination can be one) changes nothing a reader can see;
- `alt`: the rows whose last scatter was a race between entries of different
  values, with every racing entry's writer (row -> int64 [g, 2]). Their values are
  not kept: a row with two different racing values reads wrong whatever its members
  pool to (at least one racing value differs from any single value), so it is bad
  until rewritten (`verify.py` reads `raced`);
- `slot_names`: the snapshot slots restored so far (a RESTORED writer's `w_a` is
  an index into it);
- `content(row)`: what a row's pooled slot holds, and who wrote it.

Invariants: a row is in `alt` exactly while what it holds came from a scatter race
of different values (directly, or restored or stream-copied with it): every other
write of the row drops it (`drop_raced`, `copy_stream`, `clear`); `content` of a
row is a function of the trace alone, whichever slot the row has; every write of
`w_ubatch` writes the current ubatch, so a slot's `w_ubatch` never falls, and the
slots a standing plan writes again each ubatch (`wrote_again`, the same array while
it stands) are held as that array and the last ubatch (`_again`), their `w_ubatch`
the larger of the two: a ubatch of a plan that stands costs no pass over its race
groups, and the array is written in (`_settle`) when another comes or `content`
reads.

Memory: `bytes_held` (the racing writers, the held slots), `bytes_bound` (what a
trace can make `alt` and the held slots hold).
"""

from __future__ import annotations

import numpy as np

from ..trace.model import CacheConfig
from .facts import CLEARED, COPIED, NEVER, PADDING, POOLED, RESTORED, RowContent
from .guarded import GuardedKernels
from .slots import SlotTable


class Writers:
    """The writer of every slot and of every stream's zero rows, and racing writers."""

    # an `alt` entry besides its writers (int64 [g, 2]): the dict slot, the array header
    ALT_ROW_BYTES = 256

    def __init__(self, config: CacheConfig, slots: SlotTable) -> None:
        self.slots = slots
        self.kv_size = config.kv_size
        self.n_ubatch = 0  # run_ubatch calls so far: the index of the current ubatch
        # the writer of a zero row (slot 0), per stream
        n_stream = config.n_stream
        self._zero_kind = np.full(n_stream, NEVER, dtype=np.int8)
        self._zero_ubatch = np.full(n_stream, -1, dtype=np.int64)
        self._zero_a = np.full(n_stream, -1, dtype=np.int64)
        self.alt: dict[int, np.ndarray] = {}  # row -> racing writers, int64 [g, 2]
        self.slot_names: list[str] = []
        # slots written again by their last writers, and the last ubatch that did
        # (`wrote_again`): w_ubatch of each is at least that ubatch, not written yet
        self._again: tuple[np.ndarray, int] | None = None

    # -- memory --------------------------------------------------------------------------

    @classmethod
    def alt_row_bytes(cls, config: CacheConfig) -> int:
        """An `alt` entry of a row written by a pool of every sequence: its writers
        (a seq and a k each) and the entry itself."""
        n_col = config.n_seq_max if config.unified else 1
        return cls.ALT_ROW_BYTES + 16 * n_col

    @classmethod
    def bytes_bound(cls, config: CacheConfig, slots: int, entries: int) -> int:
        """Bytes `alt` can hold: at most an entry per row with a slot (`slots`, the
        zero row included), a writer per sequence (and row 0's padding under
        row-zero padding, a writer per entry of a ubatch of `entries`); and the
        slots written again that are held (`wrote_again`: a plan's race groups, at
        most one per entry), which may outlive the plan that stood."""
        return (slots - 1) * cls.alt_row_bytes(config) + 16 * entries + 8 * entries

    def bytes_held(self) -> int:
        """Bytes of the racing writers and of the held slots written again."""
        return (sum(self.ALT_ROW_BYTES + w.nbytes for w in self.alt.values())
                + (0 if self._again is None else self._again[0].nbytes))

    # -- writes -------------------------------------------------------------------------

    def stamp(self, slots: np.ndarray, kind: int, a=-1, b=-1) -> None:
        """`slots` were written now by `kind` (`facts.py`: POOLED, RESTORED, ...)."""
        t = self.slots
        t.w_kind[slots] = kind
        t.w_ubatch[slots] = self.n_ubatch
        t.w_a[slots] = a
        t.w_b[slots] = b

    def stamp_winners(self, kernels: GuardedKernels, order: np.ndarray, starts: np.ndarray,
                      entry_pool: np.ndarray, pool_start: np.ndarray, slots: np.ndarray
                      ) -> None:
        """A scatter wrote the rows of its race groups (`order`, `starts`; the rows'
        `slots`): each row's writer now is its group's last entry, POOLED with its
        pool's (seq, k) (`entry_pool`, global; `pool_start`, the layout's) or PADDING.
        One kernel pass (`kernels.stamp_winners`), what `stamp` would write for each
        kind."""
        kernels.stamp_winners(order, starts, entry_pool, pool_start, slots, self.n_ubatch,
                              POOLED, PADDING)

    def scatter_singles(self, kernels: GuardedKernels, entry_rows: np.ndarray,
                        rep: np.ndarray, order: np.ndarray, rows: np.ndarray,
                        entry_pool: np.ndarray, pool_start: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, int] | None:
        """A scatter of race groups of one entry each, its winners stamped as
        `stamp_winners` stamps them, in one kernel pass (`GuardedKernels.scatter_singles`,
        whose answer this is)."""
        return kernels.scatter_singles(entry_rows, rep, order, rows, entry_pool, pool_start,
                                       self.n_ubatch, POOLED, PADDING)

    def wrote_again(self, slots: np.ndarray, grown_from: np.ndarray | None = None) -> None:
        """`slots` were written now by the writers that wrote them last (the same kind,
        sequence and pool): only their `w_ubatch` changes, to now. Held, not written
        (the module's invariants): the very array again (a plan that stands hands in
        its race groups' slots each ubatch) moves the held ubatch alone. `grown_from`:
        an array `slots` holds every slot of (a plan grown from the standing one by
        appended pools: the standing plan's race groups' slots); when it is the one
        held, `slots` takes its place, none written. The caller never writes `slots`
        after."""
        again = self._again
        if again is not None and again[0] is not slots and again[0] is not grown_from:
            self._settle()
        self._again = (slots, self.n_ubatch)

    def _settle(self) -> None:
        """Write the held `wrote_again` into `w_ubatch`: each held slot's is the later
        of its own (a write since, of the current ubatch then) and the held one."""
        if self._again is not None:
            slots, when = self._again
            w = self.slots.w_ubatch
            w[slots] = np.maximum(w[slots], when)
            self._again = None

    def drop_raced(self, rows: np.ndarray) -> None:
        """`rows` were written by something else than a racing scatter."""
        if self.alt and rows.size:
            for r in rows.tolist():
                self.alt.pop(r, None)

    def raced(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows)] bool: the row is in `alt` (none, most ubatches: no search)."""
        if not self.alt:
            return np.zeros(rows.size, dtype=bool)
        return np.isin(rows, np.fromiter(self.alt, dtype=np.int64, count=len(self.alt)))

    def copy_stream(self, s_dst: np.ndarray, src: int, dst: int) -> None:
        """Stream `dst` became a copy of stream `src`: its rows with a slot (`s_dst`),
        its zero rows and its racing writers are stream src's."""
        kv = self.kv_size
        self.stamp(s_dst, COPIED, src)
        self._zero_kind[dst], self._zero_ubatch[dst], self._zero_a[dst] = (
            COPIED, self.n_ubatch, src)
        for r in [r for r in self.alt if dst * kv <= r < (dst + 1) * kv]:
            del self.alt[r]
        for r, v in [(r, v) for r, v in self.alt.items() if src * kv <= r < (src + 1) * kv]:
            self.alt[r - src * kv + dst * kv] = v

    def clear(self) -> None:
        """Every row zeroed: every stream's zero rows cleared now, no race left (and no
        slot held: they are all freed)."""
        self._settle()
        self._zero_kind[:] = CLEARED
        self._zero_ubatch[:] = self.n_ubatch
        self._zero_a[:] = -1
        self.alt.clear()

    def races_of(self, rows: np.ndarray) -> dict[int, np.ndarray]:
        """The racing writers of `rows` (checked), by index in `rows`: a snapshot's."""
        return {i: self.alt[r] for i, r in enumerate(rows.tolist()) if r in self.alt}

    def restored(self, s: np.ndarray, rows: np.ndarray, slot: str,
                 races: dict[int, np.ndarray]) -> None:
        """`rows` (slots `s`) were restored from snapshot `slot`, whose racing writers
        are `races` (`races_of`)."""
        if slot not in self.slot_names:
            self.slot_names.append(slot)
        self.stamp(s, RESTORED, self.slot_names.index(slot))
        self.drop_raced(rows)
        for i, v in races.items():
            self.alt[int(rows[i])] = v

    # -- what a row holds --------------------------------------------------------------

    def content(self, row: int) -> RowContent:
        """What row `row`'s pooled slot holds, and who wrote it."""
        self._settle()
        t = self.slots
        slot = int(t.slot_of[row])
        if slot:
            kind, when = int(t.w_kind[slot]), int(t.w_ubatch[slot])
            a, b = int(t.w_a[slot]), int(t.w_b[slot])
        else:  # a zero row: its stream's writer
            strm = row // self.kv_size
            kind, when = int(self._zero_kind[strm]), int(self._zero_ubatch[strm])
            a, b = int(self._zero_a[strm]), -1
        racers = (tuple((int(w[0]), int(w[1])) for w in self.alt[row].tolist())
                  if row in self.alt else ())
        return RowContent(kind, when, a, b, self.slot_names[a] if kind == RESTORED else "",
                          racers)
