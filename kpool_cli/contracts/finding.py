"""The `Finding` record every rule raises (ENGINE.md §8), the `Code` it carries, and
their parts.

Owns: `Code` (a code's number, name, severity, one-line summary: what a rule module
declares), `Finding` (which carries its `Code` whole, so its name and severity need
no registry), `PoolIds` (the pools a finding names, as one array), the severities
and `EVIDENCE_ROWS`. Imports nothing of kpool: every layer may read findings.

Codes are a public contract: never renumber one, never reuse a retired one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

SEVERITIES = ("warning", "error")

# per-row evidence of a finding (KP001's entries and values) lists this many rows and
# counts the others: a re-pool-all ubatch races on every rep row
EVIDENCE_ROWS = 64


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


@dataclass(frozen=True, slots=True)
class Code:
    """A finding code. Severity decides the exit status (`--fail-on`). `values_only`:
    only a value backend can raise it (a model-only replay does not look for it)."""

    code: str
    name: str
    severity: str
    summary: str
    values_only: bool = False

    def __post_init__(self) -> None:
        assert self.severity in SEVERITIES, self.severity


class PoolIds:
    """The (seq, k) pools a finding names, in order, held as one int64 array [n, 2]
    (a re-pool-all race names every pool of the cache). Iterates, compares and hashes
    as the tuple of (seq, k) pairs it stands for; `array` is a read-only view."""

    __slots__ = ("_a",)

    def __init__(self, pairs: Iterable[tuple[int, int]] | np.ndarray = ()) -> None:
        a = np.array(pairs if isinstance(pairs, np.ndarray) else list(pairs), dtype=np.int64)
        a = a.reshape(-1, 2)
        a.flags.writeable = False
        self._a = a

    @classmethod
    def of(cls, seq: np.ndarray, k: np.ndarray) -> PoolIds:
        return cls(np.stack((np.asarray(seq, np.int64), np.asarray(k, np.int64)), axis=1))

    @property
    def array(self) -> np.ndarray:
        return self._a

    def __len__(self) -> int:
        return self._a.shape[0]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((a, b) for a, b in self._a.tolist())

    def _pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PoolIds):
            return bool(np.array_equal(self._a, other._a))
        if isinstance(other, tuple):
            return self._pairs() == tuple(tuple(p) for p in other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._a.tobytes())

    def __repr__(self) -> str:
        return f"PoolIds({self._pairs()!r})"


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding, carrying the `Code` of the rule that raised it (`rule`). `rows` are
    global rows, `pools` are (seq, k) pairs (given as any iterable of pairs, held as
    `PoolIds`), `tokens` are (pos, seq) of the tokens involved. `evidence` holds
    code-specific plain data."""

    rule: Code
    message: str
    rows: tuple[int, ...] = ()
    seqs: tuple[int, ...] = ()
    tokens: tuple[tuple[int, int], ...] = ()
    pools: PoolIds = field(default_factory=PoolIds)
    evidence: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pools, PoolIds):
            object.__setattr__(self, "pools", PoolIds(self.pools))

    @property
    def code(self) -> str:
        return self.rule.code

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def severity(self) -> str:
        return self.rule.severity
