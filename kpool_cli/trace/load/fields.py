"""The ground every section of the walk stands on: its state and the seq ids.

Owns: `FieldReader` (the base of the sections of the walk: `cache`, `ops`,
`decode`), `CacheLimits` (the cache's values the ops are checked against) and
`static_bounds` (a bounded type's declared bounds).

Invariants:
- The cache's values are recorded by the cache block's walk before any op is read,
  each one that parses even if the block as a whole is wrong (so the ops are still
  checked against them); where the cache gives no usable value, only the static
  bound is checked.
- Every seq id is in `[0, n_seq_max)` (ENGINE.md §3), or -1 ("every sequence",
  ENGINE.md §2) where the op allows it (seq_rm, state_drop).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from kpool_cli.trace.format import SEQ, Field, Type
from kpool_cli.trace.yaml_safe import MAX_TOKENS, Node, NodeReader, Parse


@dataclass
class CacheLimits:
    """What the ops are checked against: the cache's values, None where the cache
    does not give a usable one (then only the static bound is checked)."""

    n_seq_max: int | None = None
    kv_size: int | None = None
    unified: bool | None = None
    by_order: bool | None = None
    n_ubatch: int | None = None  # the context's: capped at cache.n_batch
    n_ubatch_capped: bool = False  # cache.n_batch capped it
    n_seq_max_set: bool = True  # the cache block sets n_seq_max (else its default, 1)


def static_bounds(t: Type) -> tuple[int, int]:
    """The static bounds of a bounded type (a seq id's, a range end's)."""
    assert t.lo is not None and t.hi is not None, t
    return t.lo, t.hi


class FieldReader(NodeReader, ABC):
    """The walk's state and what every section reads alike: the cache's values the
    ops are checked against (`lim`, recorded by the cache block's walk), the tokens
    counted so far, the slots written so far, and seq ids. A section of the walk is
    a subclass; `walk._Walker` is made of them all."""

    def __init__(self, file: str, max_tokens: int = MAX_TOKENS,
                 max_nodes: int | None = None) -> None:
        super().__init__(file, max_nodes)
        self.n_tokens = 0
        self.max_tokens = max_tokens
        self.lim = CacheLimits()
        self.slots: set[str] = set()

    @abstractmethod
    def value(self, fld: Field, node: Node, path: str) -> Any:
        """`node` read as the declared field `fld`: by its type, within its bounds
        (the walker's, which reads every declared type)."""

    @abstractmethod
    def reader(self, fld: Field) -> Parse:
        """The parser of the declared field `fld`, for `NodeReader.fields`."""

    @abstractmethod
    def plain_bounds(self, fld: Field) -> tuple[int, int] | None:
        """[lo, hi]: a plain decimal int in it is what the declared field `fld` reads
        it as, with no problem (its reader's bounds); None when `fld` is no int."""

    # -- seq ids, read by every section

    def seq_id(self, node: Node, field: str, *, allow_all: bool = False) -> int | None:
        """A seq id in `[0, n_seq_max)` (ENGINE.md §3), or -1 ("every sequence",
        ENGINE.md §2) when `allow_all`."""
        v = self.int_(node, field)
        if v is None:
            return None
        n = self.lim.n_seq_max
        hi = self.seq_hi()
        if (allow_all and v == -1) or 0 <= v <= hi:
            return v
        # the ids in words, not as a range: a range `A..B` is half-open everywhere else
        ids = "the only seq id is 0" if hi == 0 else f"seq ids are 0 to {hi}"
        msg = f"seq id {v} is out of range: "
        if n is None:
            msg += ids
        elif self.lim.n_seq_max_set:
            msg += f"cache.n_seq_max is {n}, so {ids}"
        else:  # the default bites a trace of several slots that leaves it out
            msg += f"cache.n_seq_max is not set, so it is {n} (its default) and {ids}"
            if 0 < v <= static_bounds(SEQ)[1]:
                msg += f"; set cache.n_seq_max (llama-server's --parallel) to {v + 1} or more"
        if allow_all:
            msg += ", or -1 for every sequence"
        elif v == -1:
            msg += " (-1, every sequence, is only for seq_rm and state_drop)"
        self.problem(node, field, msg)
        return None

    def seq_hi(self) -> int:
        """The highest seq id: cache.n_seq_max - 1, or the static bound where the cache
        gives no usable n_seq_max."""
        n = self.lim.n_seq_max
        return n - 1 if n is not None else static_bounds(SEQ)[1]

    def seq_any(self, node: Node, field: str) -> int | None:
        return self.seq_id(node, field, allow_all=True)
