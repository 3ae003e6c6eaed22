"""What the value backend tells the rules about one ubatch (ENGINE.md §8): plain facts,
no words. The rules (KP001's value evidence, KP003) turn them into findings.

Owns: `ValueFacts` (what `ValueBackend.run_ubatch` returns), `RowContent` (what a
pooled row holds, and who wrote it) with its kinds (`NEVER` ... `CLEARED`), and
`groups_equal` (whether the entries racing on each row carry one value).

Racing writes have no defined winner (set_rows splits entries across threads), so
no fact depends on which racing entry the backend stored: a raced row is judged by
every racing entry's value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..arrays import rows_equal

# how a row's pooled slot got its value (RowContent.kind)
NEVER, POOLED, PADDING, DECODE_ZERO, DROP_ZERO, RESTORED, COPIED, CLEARED = range(8)


@dataclass(frozen=True, slots=True)
class RowContent:
    """What a row's pooled slot holds: written by `kind` at ubatch `ubatch` (for the
    kinds that happen between ubatches: before it). `a`, `b`: the pool (seq, k) of a
    POOLED write, the stream copied from (COPIED), the sequence dropped (DROP_ZERO);
    `snapshot` the slot's name (RESTORED). `racers`: when the row's last scatter was
    a race of entries with different values, every racing entry's (seq, k) (padding
    (-1, -1)), else empty."""

    kind: int
    ubatch: int
    a: int = -1
    b: int = -1
    snapshot: str = ""
    racers: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ValueFacts:
    """One ubatch's values, once pooled, scattered and verified.

    `equal` [n_groups] bool: the entries of race group g (`engine.context.race_groups`)
    write equal values. `bad[s]` [n_pools of s] bool, for each sequence s with a bad
    pool: pool k of s reads wrong (its row, or a racing writer's value, differs from
    the pooling of its current members); every pool of another sequence reads right.
    `first_bad[s]`: for each sequence with a bad pool, its first bad pool k and what
    that pool's rep row holds. `all_equal`: every group writes equal values (`equal`
    is all True), said whenever it holds."""

    equal: np.ndarray
    bad: dict[int, np.ndarray]
    first_bad: dict[int, tuple[int, int, RowContent]]  # s -> (k, rep row, content)
    all_equal: bool = False


def groups_equal(bits: np.ndarray, members: np.ndarray, order: np.ndarray,
                 starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([n_groups] bool, [n_groups] bool): every entry of the group has the same value
    bits (`bits` [n_entries, n_embd] uint32; groups as `engine.context.race_groups`
    gives them), and every entry names the same member rows (`members` [n_entries,
    kpool]). An entry with its group's first's members has its value (a pooling is a
    function of its members' rows), so only the others' bits are compared."""
    if starts.size < 2:
        return np.ones(0, dtype=bool), np.ones(0, dtype=bool)
    head = order[np.repeat(starts[:-1], np.diff(starts))]
    same = rows_equal(members[order], members[head])
    one_pooling = np.logical_and.reduceat(same, starts[:-1])
    todo = np.flatnonzero(~same)
    if todo.size:
        same[todo] = np.all(bits[order[todo]] == bits[head[todo]], axis=1)
    return np.logical_and.reduceat(same, starts[:-1]), one_pooling
