"""Located problems: what is wrong with a trace, and where.

Owns: `Problem`, `TraceError`, and how a problem words what it names: `join` (a
dotted field path); `clip` and `quote` (a scalar, cut) are `wording.clip` and
`wording.quoted`, re-exported.

Invariants:
- Every problem carries the node's start (1-based line and column) and a dotted
  field path such as `ops[3].decode.tokens[1].pos` (or `<file>`, `<yaml>`,
  `<document>`); a problem quotes at most 40 characters of a scalar; at most
  `MAX_PROBLEMS` are collected (`TraceError.truncated` says whether more were left
  unreported).
- A `TraceError` keeps the raw text of its problems; its `str` makes each line
  visible (no line break or escape sequence from a path or a quoted value).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kpool_cli.wording import clip as clip
from kpool_cli.wording import quoted, visible

quote = quoted  # how a problem quotes a scalar: the wording's


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a trace. `line`/`column` are 1-based (0: no position,
    e.g. an unreadable file); `field` is a dotted path (`cache.kv_size`,
    `ops[3].decode.tokens[1].pos`) or `<file>`, `<yaml>`, `<document>`."""

    file: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        if self.line == 0:  # no position: the file as a whole
            where = "" if self.field == "<file>" else f" {self.field}:"
            return f"{self.file}:{where} {self.message}"
        return f"{self.file}:{self.line}:{self.column}: {self.field}: {self.message}"


class TraceError(Exception):
    """A trace that cannot be loaded; `problems` lists why (at most `MAX_PROBLEMS`,
    `truncated` says whether more were left unreported)."""

    def __init__(self, problems: Sequence[Problem], truncated: bool = False) -> None:
        super().__init__(list(problems), truncated)
        self.problems: list[Problem] = list(problems)
        self.truncated = truncated

    @property
    def unread(self) -> bool:
        """The file could not be read at all (missing, a FIFO, too large): no problem
        has a position in it."""
        return all(p.field == "<file>" and p.line == 0 for p in self.problems)

    def __str__(self) -> str:
        """One line per problem, each made visible (a path or a quoted value cannot
        break a line or carry an escape sequence): the Problems keep the raw text."""
        lines = [visible(str(p)) for p in self.problems]
        if self.truncated:
            lines.append(f"(stopped after {len(self.problems)} problems)")
        return "\n".join(lines)


def join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key
