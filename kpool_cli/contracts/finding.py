"""The `Finding` record every rule raises (ENGINE.md §8), the `Code` it carries, and
their parts.

Owns: `Code` (a code's number, name, severity, one-line summary: what a rule module
declares), `Finding` (which carries its `Code` whole, so its name and severity need
no registry), `RowIds` and `PoolIds` (the rows and the pools a finding names, each
as one array), the severities and `EVIDENCE_ROWS`. Imports nothing of kpool: every
layer may read findings.

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


class _Ids:
    """Ids a finding names, held as one read-only int64 array of `_SHAPE` (a
    re-pool-all race names every row and pool of the cache, and the rules hand over
    the arrays they computed); it iterates, compares and hashes as the tuple it
    stands for."""

    __slots__ = ("_a",)
    _SHAPE: tuple[int, ...] = (-1,)

    def __init__(self, ids: Iterable | np.ndarray = ()) -> None:
        a = np.array(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64)
        a = a.reshape(self._SHAPE)
        a.flags.writeable = False
        self._a = a

    @property
    def array(self) -> np.ndarray:
        return self._a

    def __len__(self) -> int:
        return self._a.shape[0]

    def __iter__(self) -> Iterator:
        raise NotImplementedError

    def _tuple(self) -> tuple:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, type(self)):
            return bool(np.array_equal(self._a, other._a))
        if isinstance(other, tuple):
            return self._tuple() == tuple(self._item(p) for p in other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._a.tobytes())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._tuple()!r})"

    @staticmethod
    def _item(value: object) -> object:
        return value


class RowIds(_Ids):
    """The global rows a finding names, in order: ints."""

    __slots__ = ()

    def __iter__(self) -> Iterator[int]:
        return iter(self._a.tolist())


class PoolIds(_Ids):
    """The (seq, k) pools a finding names, in order, as an [n, 2] array: (seq, k) pairs."""

    __slots__ = ()
    _SHAPE = (-1, 2)

    @classmethod
    def of(cls, seq: np.ndarray, k: np.ndarray) -> PoolIds:
        """The pools (seq[i], k[i]), held in the one array built here (no copy of it)."""
        a = np.empty((len(seq), 2), dtype=np.int64)
        a[:, 0], a[:, 1] = seq, k
        a.flags.writeable = False
        out = cls.__new__(cls)
        out._a = a
        return out

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((a, b) for a, b in self._a.tolist())

    @staticmethod
    def _item(value: object) -> object:
        return tuple(value)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding, carrying the `Code` of the rule that raised it (`rule`). `rows` are
    global rows and `pools` (seq, k) pairs, each given as any iterable or array and
    held as `RowIds` and `PoolIds`; `tokens` are (pos, seq) of the tokens involved.
    `evidence` holds code-specific plain data."""

    rule: Code
    message: str
    rows: RowIds = field(default_factory=RowIds)
    seqs: tuple[int, ...] = ()
    tokens: tuple[tuple[int, int], ...] = ()
    pools: PoolIds = field(default_factory=PoolIds)
    evidence: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.rows, RowIds):
            object.__setattr__(self, "rows", RowIds(self.rows))
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
