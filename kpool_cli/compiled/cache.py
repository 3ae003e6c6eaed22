"""The compiled core's cache: the reference cache (cache/kv.py, cache/cells.py) whose
per-ubatch work, find_slot and a decode's writes with their index, runs as kernels
(compiled/kernels.py) over the same arrays.

Owns: `CompiledStream` (Stream.write) and `CompiledKvCache` (KvCache._find_slot).
Invariants: the state is the reference's, cell for cell and key for key (the
streams' `check_invariants` hold after every op, and tests hold the two cores'
reports byte-identical); every other mutator is the reference's own.
"""

from __future__ import annotations

import numpy as np

from ..cache.cells import EMPTY_POS, SortedKeys, Stream
from ..cache.kv import KvCache
from . import kernels as k

_NO_CELLS = np.empty(0, dtype=np.int64)


def add_keys(index: SortedKeys, keys: np.ndarray) -> None:
    """`SortedKeys.add` through `kernels.sorted_add` (keys not present yet)."""
    n = len(index)
    buf = index.spare(n + keys.size)
    index.set_len(k.sorted_add(buf, n, keys))


class CompiledStream(Stream):
    def write(self, cells: np.ndarray, pos: np.ndarray, ext: np.ndarray | None,
              seqs: list[tuple[int, ...]], key_ids: np.ndarray) -> None:
        """Stream.write: the cells through `kernels.write_cells`, then each sequence's
        new pairs into its index."""
        assert np.all(self.pos[cells] == EMPTY_POS), "writing a cell that is not empty"
        col = self._col
        ptr = [0]
        flat: list[int] = []
        by_seq: dict[int, list[int]] = {}
        for i, ss in enumerate(seqs):
            for s in ss:
                flat.append(col[s])
                by_seq.setdefault(s, []).append(i)
            ptr.append(len(flat))
        ext_a = ext if ext is not None else self.ext[:0]
        k.write_cells(cells, pos, ext_a, ext is not None, np.array(ptr, dtype=np.int64),
                      np.array(flat, dtype=np.int64), key_ids, self.pos, self.ext,
                      self.has, self.seq_count, self.key_id)
        self.used += int(cells.size)
        keys = (pos.astype(np.int64) << 32) | cells
        for s, idx in by_seq.items():
            add_keys(self.seq_keys[s], keys if len(idx) == keys.size else keys[idx])
            self.touched.add(s)


class CompiledKvCache(KvCache):
    STREAM = CompiledStream

    @staticmethod
    def _find_slot(st: Stream, used: int, head: int, n: int,
                   taken: np.ndarray | None = None) -> np.ndarray | None:
        """KvCache._find_slot: its head reset, then `kernels.find_slot`."""
        size = st.kv_size
        if n > size:
            return None
        if head > used + 2 * n or head >= size:
            head = 0
        out = np.empty(n, dtype=np.int64)
        got = k.find_slot(st.pos, head, n, _NO_CELLS if taken is None else taken, out)
        return out if got == n else None
