"""What the value verdicts (KP001's value evidence, KP003's messages) and the value
backend's scatter say about racing scatter entries (ENGINE.md §8).

Owns: who wrote each scatter entry (`writers_of`, `PAD_WRITER` for padding; `writer`
names one) and whether the entries racing on each row carry one value
(`groups_equal`), over the race groups of `context.UbatchContext`.

Racing writes have no defined winner (set_rows splits entries across threads), so
no verdict depends on which racing entry the backend stored: a raced row is judged
by every racing entry's value.
"""

from __future__ import annotations

import numpy as np

from ..engine.layout import Layout

PAD_WRITER = (-1, -1)  # the (seq, k) of a padding entry in KP001 evidence


def writers_of(layout: Layout, entry_pool: np.ndarray) -> np.ndarray:
    """[n_entries, 2] the (seq, k) of each entry; PAD_WRITER for padding."""
    out = np.full((entry_pool.size, 2), -1, dtype=np.int64)
    real = np.flatnonzero(entry_pool >= 0)
    if real.size:
        seq, k = layout.locate(entry_pool[real])
        out[real, 0], out[real, 1] = seq, k
    return out


def groups_equal(bits: np.ndarray, members: np.ndarray, order: np.ndarray,
                 starts: np.ndarray) -> np.ndarray:
    """[n_groups] bool: every entry of the group has the same value bits (`bits`
    [n_entries, n_embd] uint32; groups as `context.race_groups` gives them). An entry
    with the same member rows (`members` [n_entries, kpool]) as its group's first has
    the same value (a pooling is a function of its members' rows), so only the
    others' bits are compared."""
    if starts.size < 2:
        return np.ones(0, dtype=bool)
    head = order[np.repeat(starts[:-1], np.diff(starts))]
    same = np.all(members[order] == members[head], axis=1)
    todo = np.flatnonzero(~same)
    if todo.size:
        same[todo] = np.all(bits[order[todo]] == bits[head[todo]], axis=1)
    return np.logical_and.reduceat(same, starts[:-1])


def writer(w: tuple[int, int]) -> str:
    """A writer as messages name it: `seq:k`, or `padding`."""
    return "padding" if w == PAD_WRITER else f"{w[0]}:{w[1]}"
