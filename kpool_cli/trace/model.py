"""The trace format v1 as plain frozen data (TRACE_FORMAT.md, "Trace").

Owns: `CacheConfig`, `Token` and one dataclass per op, plus `Trace`. The format's
fields, bounds and defaults are declared in `trace.format`; `CacheConfig` takes its
defaults from there, and the op dataclasses' defaults equal the declared ones
(tests/test_formats.py).

Invariants (enforced by `trace.load`, assumed everywhere else):
- every op carries the `Loc` of its YAML node, so any later complaint about it
  (a recorded `cell` that is not empty at replay time) can name file, line, column;
- ranges are already resolved: `p0 < 0` means 0 and `p1 < 0` means "to the end"
  are kept as written (the engine, not the loader, gives them meaning, because the
  staleness rules of ENGINE.md §4 look at the raw `p0`);
- seq ids are in `[0, n_seq_max)` except where an op allows `-1` ("every sequence");
- a `Decode` either lets the engine split (`ubatches is None`) or fixes the split,
  in which case `ubatches` partitions `tokens` (indices into `tokens`, in order);
  a `Decode` with a `span` has no tokens and no fixed split.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from kpool_cli.trace.format import CACHE


@dataclass(frozen=True, slots=True)
class Loc:
    """Where a node of the trace starts: 1-based line and column."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


NOWHERE = Loc("<built>", 0, 0)


_CACHE_DEFAULT = CACHE.defaults


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The indexer cache's shape (ENGINE.md §2): the fields of `trace.format.CACHE`,
    in its order, with its defaults."""

    kv_size: int
    kpool: int
    n_seq_max: int = _CACHE_DEFAULT["n_seq_max"]  # type: ignore[assignment]
    unified: bool = _CACHE_DEFAULT["unified"]  # type: ignore[assignment]
    by_order: bool = _CACHE_DEFAULT["by_order"]  # type: ignore[assignment]
    n_ubatch: int = _CACHE_DEFAULT["n_ubatch"]  # type: ignore[assignment]
    # llama_context_params.n_batch, when the trace records it (`context_batch`)
    n_batch: int | None = _CACHE_DEFAULT["n_batch"]  # type: ignore[assignment]
    n_embd: int = _CACHE_DEFAULT["n_embd"]  # type: ignore[assignment]
    # the recurrent child's rollback snapshots per sequence (ENGINE.md §3 "The recurrent
    # child"): 0 without MTP, the draft depth with it
    n_rs_seq: int = _CACHE_DEFAULT["n_rs_seq"]  # type: ignore[assignment]

    @property
    def n_stream(self) -> int:
        """Unified: one stream for every sequence; else stream s belongs to sequence s."""
        return 1 if self.unified else self.n_seq_max

    @property
    def n_rows(self) -> int:
        """Global rows: `strm * kv_size + cell` (`context_cells`)."""
        return context_cells(self.kv_size, self.unified, self.n_seq_max)

    @property
    def ctx_n_batch(self) -> int:
        """The context's n_batch (`context_batch`): a decode of more tokens aborts."""
        return context_batch(self.n_batch, self.n_ubatch, self.n_rows)[0]

    @property
    def ctx_n_ubatch(self) -> int:
        """The context's n_ubatch (`context_batch`): the split's ubatch size."""
        return context_batch(self.n_batch, self.n_ubatch, self.n_rows)[1]

    def as_dict(self) -> dict[str, int | bool]:
        """The cache block as the format writes it: every declared field, in order,
        but an unset one (None: `n_batch` when the trace records none)."""
        return {name: v for name in CACHE.names if (v := getattr(self, name)) is not None}


def context_cells(kv_size: int, unified: bool, n_seq_max: int) -> int:
    """The cache's cells over its streams (the context's n_ctx, the global rows): one
    stream when unified, else one a sequence."""
    return kv_size * (1 if unified else n_seq_max)


def context_batch(n_batch: int | None, n_ubatch: int, n_ctx: int) -> tuple[int, int]:
    """ENGINE.md §3: the context's (cparams) n_batch and n_ubatch from the trace's
    llama_context_params and the context's cells `n_ctx`: with causal attention
    `n_batch = min(n_ctx, params.n_batch)`, then `n_ubatch = min(n_batch,
    params.n_ubatch)` (`llama_context::llama_context`, src/llama-context.cpp). A
    trace that records no n_batch: the batch bound is the context, and n_ubatch is
    the trace's as given (docs/ENGINE-NOTES.md, "Not followed")."""
    if n_batch is None:
        return n_ctx, n_ubatch
    n_batch = min(n_ctx, n_batch)
    return n_batch, min(n_batch, n_ubatch)


class Token(NamedTuple):
    """One token of a decode: its pos, its sequence set (order kept: the first seq id
    is the one the token reads through, ENGINE.md §7), an optional M-RoPE `ext`
    and an optional recorded cell (stream-local). A named tuple, not a frozen
    dataclass as the ops are: a trace holds up to millions of them, and one is made
    in 0.24 us where a frozen dataclass takes 0.53 (its `__init__` sets each field
    through `object.__setattr__`)."""

    pos: int
    seq: tuple[int, ...]
    ext: tuple[int, int] | None = None
    cell: int | None = None

    @classmethod
    def each(cls, positions: Iterable[int], seq: tuple[int, ...],
             ext: tuple[int, int] | None = None, cell: int | None = None
             ) -> tuple[Token, ...]:
        """A token at each of `positions`, of sequence set `seq` (one tuple, shared),
        `ext` and `cell`: made in one pass of C (half the time of a `Token(...)` each,
        what a prefill's range of 65,536 tokens costs)."""
        return tuple(map(tuple.__new__, repeat(cls), zip(
            positions, repeat(seq), repeat(ext), repeat(cell))))


_EXT = itemgetter(2)  # Token.ext, read in C


@dataclass(frozen=True, slots=True)
class Span:
    """A shorthand decode `{seq, pos: A..B}` of more tokens than its stream has cells:
    llama_decode refuses it, or past the whole cache aborts, whatever the cache holds
    (ENGINE.md §3), so it is kept as its sequence set, its half-open ends and its
    `ext`, and never built as tokens."""

    seq: tuple[int, ...]
    start: int
    stop: int
    ext: tuple[int, int] | None = None

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class Decode:
    """A decode's tokens, or (`span`, with no tokens) a range too long to build."""

    tokens: tuple[Token, ...]
    ubatches: tuple[tuple[int, ...], ...] | None = None
    loc: Loc = field(default=NOWHERE, compare=False)
    span: Span | None = None
    kind = "decode"

    @property
    def n_tokens(self) -> int:
        return len(self.span) if self.span is not None else len(self.tokens)

    @property
    def is_embd(self) -> bool:
        """A batch of embeddings (image tokens, ENGINE.md §3): any token carries `ext`."""
        if self.span is not None:
            return self.span.ext is not None
        # counted in C: a generator's step per token cost a step of parallel slots 3 us
        return list(map(_EXT, self.tokens)).count(None) != len(self.tokens)


@dataclass(frozen=True, slots=True)
class SeqRm:
    seq: int
    p0: int = -1
    p1: int = -1
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "seq_rm"


@dataclass(frozen=True, slots=True)
class SeqCp:
    src: int
    dst: int
    p0: int = -1
    p1: int = -1
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "seq_cp"

    @property
    def is_whole(self) -> bool:
        """What PR #29994 asserts: `p0 <= 0 && p1 < 0`."""
        return self.p0 <= 0 and self.p1 < 0


@dataclass(frozen=True, slots=True)
class SeqKeep:
    seq: int
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "seq_keep"


@dataclass(frozen=True, slots=True)
class SeqAdd:
    seq: int
    p0: int = -1
    p1: int = -1
    shift: int = 0
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "seq_add"


@dataclass(frozen=True, slots=True)
class SeqDiv:
    seq: int
    p0: int = -1
    p1: int = -1
    d: int = 1
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "seq_div"


@dataclass(frozen=True, slots=True)
class StateWrite:
    seq: int
    slot: str
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "state_write"


@dataclass(frozen=True, slots=True)
class StateRead:
    seq: int
    slot: str
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "state_read"


@dataclass(frozen=True, slots=True)
class StateDrop:
    seq: int
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "state_drop"


@dataclass(frozen=True, slots=True)
class Clear:
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "clear"


@dataclass(frozen=True, slots=True)
class Note:
    text: str
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "note"


@dataclass(frozen=True, slots=True)
class Expect:
    """Assertions on the previous op (for a decode: its ubatch `ubatch`, default the last).

    `None` fields are not checked. `findings` is the exact set of codes the op raised
    (all its ubatches, or its event). `pools` is the exact list of marked pools
    `(seq, k)` of the chosen ubatch."""

    engine: str | None = None
    findings: tuple[str, ...] | None = None
    n_new: int | None = None
    n_new_g: int | None = None
    pools: tuple[tuple[int, int], ...] | None = None
    status: str | None = None
    ubatch: int = -1
    loc: Loc = field(default=NOWHERE, compare=False)
    kind = "expect"


Op = (
    Decode | SeqRm | SeqCp | SeqKeep | SeqAdd | SeqDiv | StateWrite | StateRead | StateDrop
    | Clear | Note | Expect
)

OP_TYPES: dict[str, type] = {
    t.kind: t
    for t in (
        Decode, SeqRm, SeqCp, SeqKeep, SeqAdd, SeqDiv, StateWrite, StateRead, StateDrop,
        Clear, Note, Expect,
    )
}


@dataclass(frozen=True, slots=True)
class Trace:
    cache: CacheConfig
    ops: tuple[Op, ...]
    name: str = ""
    description: str = ""
    engine: str | None = None
    seed: int = 0
    path: str = "<built>"
    sha256: str = ""
