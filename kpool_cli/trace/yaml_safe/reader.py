"""Typed reading of composed nodes: `NodeReader`, the base of the loader's walk.

Owns: `NodeReader` (reads nodes as typed values, collecting located problems),
`Stop` (too many problems, or a fatal one: stop walking) and `Parse` (a field's
reader, as `NodeReader.fields` takes it).

Invariants:
- Only the standard scalar, list and mapping tags are read: any other tag
  (`!!python/...`, `!custom`, `!!set`) and merge keys `<<` are problems.
- It counts the nodes it visits again, aliases expanded, against its node bound
  (`limits.node_limit`: `MAX_NODE_VISITS`, or the caller's; past it, a fatal
  problem); it collects at most `MAX_PROBLEMS`
  problems (one more raises `Stop` and sets `truncated`).
- Ints are plain decimal (`decimal`): any other way of writing a number is a
  problem saying what to write instead.
- Mappings are strict: unknown keys (with the closest known key suggested),
  duplicate keys, non-string keys and missing required keys are problems; wrong
  types too (YAML `true` is not the int 1; an int is not a bool; `"5"` is not an
  int).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...wording import unknown_key
from . import limits
from .decimal import DECIMAL, NUMBER_LIKE, not_decimal
from .nodes import (
    BOOL,
    BOOLS,
    FLOAT,
    INT,
    MAP,
    MERGE,
    NULL,
    SEQ,
    STR,
    TIMESTAMP,
    Map,
    Node,
    OpMap,
    Scalar,
    Seq,
    TokenMap,
    describe,
    short_tag,
)
from .problems import Problem, clip, join, quote


class Stop(Exception):
    """Too many problems: stop walking."""


def _bounds(lo: int | None, hi: int | None) -> str:
    if lo is None and hi is None:
        return ""
    lo_s = "" if lo is None else f"{lo} <= "
    hi_s = "" if hi is None else f" <= {hi}"
    return f" (must be {lo_s}value{hi_s})"


Parse = Callable[[Node, str], Any]

_ALLOWED_TAGS: dict[type, frozenset[str]] = {
    Scalar: frozenset({STR, INT, BOOL, FLOAT, NULL, TIMESTAMP}),
    Seq: frozenset({SEQ}),
    Map: frozenset({MAP}),
    TokenMap: frozenset({MAP}),
    OpMap: frozenset({MAP}),
}
_NUMBER_LIKE_TAGS = frozenset({STR, FLOAT, TIMESTAMP})


class NodeReader:
    """Reads composed nodes as typed values, collecting located problems (at most
    `MAX_PROBLEMS`: one more raises `Stop`) and counting the nodes it visits, aliases
    expanded (past `node_limit`: `MAX_NODE_VISITS` unless the caller chose another
    bound, `--max-nodes`; a fatal problem)."""

    def __init__(self, file: str, max_nodes: int | None = None) -> None:
        self.file = file
        self.problems: list[Problem] = []
        self.truncated = False
        self.visits = 0
        self.node_limit = limits.node_limit(max_nodes)

    # -- reporting

    def problem(self, node: Node, field: str, message: str) -> None:
        if len(self.problems) >= limits.MAX_PROBLEMS:
            self.truncated = True
            raise Stop
        self.problems.append(
            Problem(self.file, node.line, node.column, field or "<document>", message)
        )

    def fatal(self, node: Node, field: str, message: str) -> None:
        self.problem(node, field, message)
        raise Stop

    # -- generic nodes

    def visit(self, node: Node, field: str) -> bool:
        """Count the node; False (with a problem) if its tag is not a plain one."""
        self.visits += 1
        if self.visits > self.node_limit:
            self.fatal(
                node, field,
                f"more than {self.node_limit:,} YAML nodes visited (aliases expanded):"
                " refusing the trace (an alias bomb?; the bound on a trace's size,"
                " --max-nodes)",
            )
        if node.tag in _ALLOWED_TAGS[type(node)]:
            return True
        if node.tag == MERGE:
            self.problem(node, field, "merge keys (<<) are not supported in a trace")
        else:
            self.problem(
                node, field,
                f"tag {short_tag(node.tag)} is not allowed: a trace holds only plain YAML"
                " scalars, lists and mappings",
            )
        return False

    def typed(self, node: Node, field: str, tag: str, expected: str) -> Scalar | None:
        if not self.visit(node, field):
            return None
        if isinstance(node, Scalar) and node.tag == tag:
            return node
        hint = ""
        if tag == INT and node.tag == BOOL:
            hint = " (YAML true/false is a bool, not an int)"
        elif tag == STR and isinstance(node, Scalar):
            hint = " (quote it to make it a string)"
        self.problem(node, field, f"expected {expected}, got {describe(node)}{hint}")
        return None

    def int_(
        self, node: Node, field: str, lo: int | None = None, hi: int | None = None,
        hint: str = "",
    ) -> int | None:
        """An int in plain decimal (`DECIMAL`); any other way of writing a number
        (YAML 1.1's `010`, `0x1F`, `1:20`, ..., or a string such as `0o17`) is a
        problem saying what to write instead."""
        if not self.visit(node, field):
            return None
        if not isinstance(node, Scalar) or not (
            node.tag == INT
            or (node.plain and node.tag in _NUMBER_LIKE_TAGS and NUMBER_LIKE.match(node.value))
        ):
            why = " (YAML true/false is a bool, not an int)" if node.tag == BOOL else ""
            self.problem(node, field, f"expected an int, got {describe(node)}{why}")
            return None
        text = node.value
        if not DECIMAL.fullmatch(text):
            self.problem(node, field, not_decimal(text))
            return None
        digits = len(text) - text.startswith("-")
        if digits > limits.MAX_INT_DIGITS:
            self.problem(
                node, field, f"out of range: an integer of {digits} digits{_bounds(lo, hi)}{hint}"
            )
            return None
        v = int(text)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.problem(node, field, f"out of range: {v}{_bounds(lo, hi)}{hint}")
            return None
        return v

    def bool_(self, node: Node, field: str) -> bool | None:
        scalar = self.typed(node, field, BOOL, "a bool (true or false)")
        if scalar is None:
            return None
        v = BOOLS.get(scalar.value.lower())
        if v is None:  # an explicit !!bool tag on some other text
            self.problem(node, field, f"not a valid bool: {quote(scalar.value)}")
        return v

    def str_(self, node: Node, field: str, *, nonempty: bool = False) -> str | None:
        scalar = self.typed(node, field, STR, "a string")
        if scalar is None:
            return None
        if nonempty and not scalar.value:
            self.problem(node, field, "must not be empty")
            return None
        return scalar.value

    def list_(self, node: Node, field: str, what: str = "a list") -> list[Node] | None:
        if not self.visit(node, field):
            return None
        if not isinstance(node, Seq):
            self.problem(node, field, f"expected {what}, got {describe(node)}")
            return None
        return list(node.value)

    def map_(
        self, node: Node, field: str, known: Sequence[str], required: Sequence[str] = (),
        *, null_ok: bool = False,
    ) -> dict[str, Node] | None:
        """The mapping's values by key. Unknown, duplicate and non-string keys and
        missing required keys are reported; the known keys found are still returned."""
        if not self.visit(node, field):
            return None
        if null_ok and isinstance(node, Scalar) and node.tag == NULL:
            return {}
        if not isinstance(node, Map):
            self.problem(node, field, f"expected a mapping, got {describe(node)}")
            return None
        out: dict[str, Node] = {}
        key_at: dict[str, Node] = {}
        for k, v in node.value:
            if not self.visit(k, field):
                continue
            if not (isinstance(k, Scalar) and k.tag == STR):
                self.problem(k, field, f"keys must be strings, got {describe(k)}")
                continue
            name = k.value
            if name not in known:
                self.problem(k, join(field, clip(name)), unknown_key(name, known))
            elif name in out:
                first = key_at[name]
                self.problem(
                    k, join(field, name),
                    f"duplicate key {name!r} (first at line {first.line}, column {first.column})",
                )
            else:
                out[name] = v
                key_at[name] = k
        for name in required:
            if name not in out:
                self.problem(node, join(field, name), "required key missing")
        return out

    def fields(
        self, node: Node, field: str, spec: dict[str, tuple[bool, Parse]], *,
        null_ok: bool = False,
    ) -> dict[str, Any] | None:
        """Parse a mapping of scalar-ish fields: `spec` maps each key to (required,
        parser). None if anything about it was wrong (a problem was reported)."""
        before = len(self.problems)
        m = self.map_(node, field, tuple(spec), [k for k, (req, _) in spec.items() if req],
                      null_ok=null_ok)
        if m is None:
            return None
        out = {k: spec[k][1](v, join(field, k)) for k, v in m.items()}
        return out if len(self.problems) == before else None
