"""Flat per-sequence columns: one [n_seq_max, cap] int64 array per column, so that a
kernel reads and writes every sequence's column in one call (a step of parallel
slots updates 64 sequences' layouts at once: compiled/layout.py).

Owns: `Arena` (the array and each row's live length), `ArenaRow`, a row as a
`GrowArray` (cache/cells.py): the same methods with the same results, so the
reference layout's steps run on it unchanged, and `ArenaKeys`, a row as a
`SortedKeys` (a stream's index of a sequence's cells).

Invariants:
- row s's live values are `buf[s, :lens[s]]`; `lens[s] <= cap` (the array's width);
- the width only grows, for every row at once, to what a row asks, doubling while
  under `cap_max` (a sequence holds at most `kv_size` pairs, and a kpool-th of them
  pool); no row is asked for more than its sequence can hold (`bytes_bound`);
- a `view` or `spare` of any row is stale once any row of the same arena grows (a
  GrowArray's only once its own does): nothing keeps one across a mutation.

Memory: `rows x cap` values, the widest row at most twice over (the doubling), and
while it grows the old array too: `bytes_bound`.
"""

from __future__ import annotations

import numpy as np

from ..cache.cells import GrowArray, SortedKeys


class Arena:
    """Row s of `buf` is sequence s's column; `lens[s]` its live length."""

    __slots__ = ("buf", "cap_max", "lens")

    def __init__(self, n_rows: int, cap_max: int, cap: int = 16) -> None:
        self.cap_max = max(cap_max, 1)
        self.buf = np.empty((n_rows, min(cap, self.cap_max)), dtype=np.int64)
        self.lens = np.zeros(n_rows, dtype=np.int64)

    @property
    def cap(self) -> int:
        return int(self.buf.shape[1])

    def reserve(self, need: int) -> None:
        """Room for `need` values in every row (the live values kept)."""
        cap = self.buf.shape[1]
        if need <= cap:
            return
        grown = np.empty((self.buf.shape[0], max(need, min(2 * cap, self.cap_max))),
                         dtype=np.int64)
        width = int(self.lens.max())
        grown[:, :width] = self.buf[:, :width]
        self.buf = grown

    @staticmethod
    def bytes_bound(n_rows: int, values: int) -> int:
        """Bytes an arena of `n_rows` rows holds when no row is asked for more than
        `values` values: the width below twice that (a doubling from below it), and
        the old array beside the new one while it grows (narrower than `values`)."""
        return 3 * 8 * n_rows * max(values, 16)


class ArenaRow(GrowArray):
    """Row `s` of an arena, as a GrowArray (cache/cells.py): `view`, `spare` and the
    rest read and write `arena.buf[s]`, the length is `arena.lens[s]`."""

    __slots__ = ("_arena", "_s")

    def __init__(self, arena: Arena, s: int) -> None:  # no GrowArray.__init__: no array
        self._arena, self._s = arena, s

    # GrowArray's own methods (SortedKeys's too) read and write these two
    @property
    def _a(self) -> np.ndarray:  # type: ignore[override]
        return self._arena.buf[self._s]

    @property
    def _n(self) -> int:
        return int(self._arena.lens[self._s])

    @_n.setter
    def _n(self, n: int) -> None:
        self._arena.lens[self._s] = n

    def __len__(self) -> int:
        return int(self._arena.lens[self._s])

    @property
    def view(self) -> np.ndarray:
        arena, s = self._arena, self._s
        return arena.buf[s, :arena.lens[s]]

    def extend(self, values: np.ndarray) -> None:
        arena, s = self._arena, self._s
        n = int(arena.lens[s])
        need = n + values.size
        arena.reserve(need)
        arena.buf[s, n:need] = values
        arena.lens[s] = need

    def append(self, value: int) -> None:
        arena, s = self._arena, self._s
        n = int(arena.lens[s])
        arena.reserve(n + 1)
        arena.buf[s, n] = value
        arena.lens[s] = n + 1

    @property
    def capacity(self) -> int:
        return self._arena.cap

    def spare(self, n: int) -> np.ndarray:
        arena = self._arena
        arena.reserve(n)
        return arena.buf[self._s]

    def last(self) -> int:
        arena, s = self._arena, self._s
        n = int(arena.lens[s])
        assert n, "no live value"
        return int(arena.buf[s, n - 1])

    def set_len(self, n: int) -> None:
        assert 0 <= n <= self._arena.cap
        self._arena.lens[self._s] = n

    def truncate(self, n: int) -> None:
        arena, s = self._arena, self._s
        arena.lens[s] = min(int(arena.lens[s]), n)


class ArenaKeys(ArenaRow, SortedKeys):
    """Row `s` of an arena as a SortedKeys (cache/cells.py): its inserts, removals and
    ranges over the row."""

    __slots__ = ()
