"""What a replay yields: plain frozen records, the only thing views, writers, the
diff and the checks see of the engine (DESIGN.md, "Data flow").

Owns: `OpEvent`, `UbatchRecord`, `Pools` (and its `PoolInfo`), `CellMap`,
`ExpectResult`, and the shared vocabulary `STATUS_*`. Arrays in records are numpy
arrays that nobody mutates after the record is yielded; rows are global rows
(`strm * kv_size + cell`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .finding import Finding

APPLIED, REJECTED, ABORTED = "applied", "rejected", "aborted"


@dataclass(frozen=True, slots=True)
class OpEvent:
    """A non-decode op, or a decode refused before any ubatch ran."""

    op: int
    kind: str
    status: str  # applied | rejected | aborted
    stale: dict[int, int] = field(default_factory=dict)  # the stale positions it set
    message: str = ""
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolInfo:
    seq: int
    k: int
    first_pos: int
    last_pos: int
    cells: tuple[int, ...]  # global member rows
    rep: int
    new: bool


@dataclass(frozen=True, slots=True, eq=False)
class Pools:
    """The pools a ubatch lists (its marked pools, or every pool with pools="all"), in
    layout order, as columns: a re-pool-all ubatch lists thousands, so nothing here is
    an object per pool until a view asks (iteration yields PoolInfo)."""

    seq: np.ndarray  # [n] | i | seq id
    k: np.ndarray  # [n] | i | pool number within its sequence
    first_pos: np.ndarray  # [n] | i | first member's pos
    last_pos: np.ndarray  # [n] | i | rep's pos
    cells: np.ndarray  # [n, kpool] | i, member | global member rows
    rep: np.ndarray  # [n] | i | global rep row
    new: np.ndarray  # [n] bool | i | marked by this ubatch

    @classmethod
    def none(cls, kpool: int) -> Pools:
        e = np.empty(0, dtype=np.int64)
        return cls(e, e, e, e, e.reshape(0, kpool), e, e.astype(bool))

    def __len__(self) -> int:
        return int(self.seq.size)

    def __iter__(self) -> Iterator[PoolInfo]:
        for s, k, f, la, c, r, n in zip(self.seq.tolist(), self.k.tolist(),
                                        self.first_pos.tolist(), self.last_pos.tolist(),
                                        self.cells.tolist(), self.rep.tolist(),
                                        self.new.tolist(), strict=True):
            yield PoolInfo(s, k, f, la, tuple(c), r, n)

    def marked(self) -> tuple[tuple[int, int], ...]:
        """(seq, k) of the pools this ubatch marked."""
        return tuple(zip(self.seq[self.new].tolist(), self.k[self.new].tolist(),
                         strict=True))


SEQ_EMPTY, SEQ_SHARED = -1, -2  # CellMap.seq codes besides a seq id


@dataclass(frozen=True, slots=True)
class CellMap:
    """The cache's cells after a ubatch's layout update, per global row: the picture
    llama.cpp's debug dump prints (ENGINE.md §2). Only with `replay(..., cell_map=True)`."""

    kv_size: int  # cells per stream: row r is cell r % kv_size of stream r // kv_size
    seq: np.ndarray  # [n_rows] int16 | row | SEQ_EMPTY, its one seq id, or SEQ_SHARED
    rep_rows: np.ndarray  # [n_rep] int64 | i | distinct rep rows of the layout's pools, sorted


@dataclass(frozen=True, slots=True)
class UbatchRecord:
    index: int  # ubatch number in the whole replay
    op: int  # index of the decode in the trace's ops
    batch_ubatch: int  # position of this ubatch in its batch
    token_pos: np.ndarray  # [n_tokens] | i | pos
    token_seqs: tuple[tuple[int, ...], ...]  # [n_tokens] | i | seq ids, in the order given
    token_rows: np.ndarray  # [n_tokens] | i | global row of the token's cell
    token_ext: np.ndarray | None  # [n_tokens, 2] | i | (x, y), M-RoPE only
    token_visible: np.ndarray  # [n_tokens] | i | pools of its first seq the token sees
    stale_batch: dict[int, int]  # ubatch 0 of a batch: the stale snapshot it starts from
    n_pool_real: int
    n_new: int
    n_new_g: int
    pools: Pools  # marked pools (or every pool, with pools="all")
    scatter_rep: np.ndarray  # [n_new_g] | e | row entry e writes
    scatter_rows: np.ndarray  # [n_new_g, kpool] | e, member | member rows it pools
    scatter_pad: np.ndarray  # [n_new_g] | e | padding entry?
    scatter_pool: np.ndarray  # [n_new_g] | e | global pool index, -1 for padding
    cost: dict[str, int]
    findings: tuple[Finding, ...]
    aborted: bool = False
    cell_map: CellMap | None = None  # the cells after this ubatch (replay(cell_map=True))
    # [m, 2] | run | [a, b): the runs of `pools` and of the scatter entries
    # (contracts/runs.py), as the core found them; None: not found (the writer finds
    # them when it writes runs)
    pool_spans: np.ndarray | None = None
    scatter_spans: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.token_pos.size)


@dataclass(frozen=True, slots=True)
class ExpectResult:
    """The outcome of an `expect` op of the trace (`kpool replay --check`). `target`:
    the op it checked (-1: none ran before it); `diffs`: what did not hold, each as
    (what, expected, actual), the words of `message` side by side."""

    op: int
    ok: bool
    message: str
    target: int = -1
    diffs: tuple[tuple[str, str, str], ...] = ()


Record = OpEvent | UbatchRecord | ExpectResult


def first_difference(a: object, b: object, where: str = "record") -> str | None:
    """Where two records (or values inside them: dataclasses, tuples, lists, dicts,
    numpy arrays, scalars) differ, as a path such as `record.pools.members`, or None
    when they are equal field for field (arrays by dtype, shape and every element)."""
    if type(a) is not type(b):
        return f"{where} ({type(a).__name__} vs {type(b).__name__})"
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        same = a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        return None if same else where
    if hasattr(a, "__dataclass_fields__"):
        for name in a.__dataclass_fields__:
            d = first_difference(getattr(a, name), getattr(b, name), f"{where}.{name}")
            if d is not None:
                return d
        return None
    if isinstance(a, tuple | list):
        assert isinstance(b, tuple | list)
        if len(a) != len(b):
            return f"{where} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = first_difference(x, y, f"{where}[{i}]")
            if d is not None:
                return d
        return None
    if isinstance(a, dict):
        assert isinstance(b, dict)
        if list(a) != list(b):
            return f"{where} (keys)"
        for key in a:
            d = first_difference(a[key], b[key], f"{where}[{key!r}]")
            if d is not None:
                return d
        return None
    return None if a == b else where
