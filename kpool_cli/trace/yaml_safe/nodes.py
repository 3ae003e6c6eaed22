"""The light nodes a trace's YAML is composed into, and the tags they carry.

Owns: `Scalar`, `Seq` and `Map` (`Node`: any of them; `TokenMap`, a token line's
`Map`, made lazily, and `token_mapping`, that line's text), the standard tags (`STR`,
`INT`, `BOOL`, `FLOAT`, `NULL`, `TIMESTAMP`, `SEQ`, `MAP`, `MERGE`), `BOOLS`
(YAML 1.1's bools, by lowercased text), and a node in words for a problem
(`describe`, `short_tag`).

Invariants:
- A node is slotted and carries no Mark objects, only where it starts (1-based
  line and column): about 130 B a node where PyYAML's take 350. Its tag is the
  one PyYAML's safe resolver gives (`composer`); no Python object is ever built
  from it.
- A node in words quotes at most 40 characters of a scalar, and of a tag.
"""

from __future__ import annotations

import re

from .problems import clip, quote

_Y = "tag:yaml.org,2002:"
STR, INT, BOOL, FLOAT, NULL, TIMESTAMP = (
    _Y + "str", _Y + "int", _Y + "bool", _Y + "float", _Y + "null", _Y + "timestamp"
)
SEQ, MAP, MERGE = _Y + "seq", _Y + "map", _Y + "merge"
_TYPE_NAMES = {
    STR: "a string", INT: "an int", BOOL: "a bool", FLOAT: "a float", NULL: "null",
    TIMESTAMP: "a timestamp",
}
# SafeConstructor.bool_values: YAML 1.1's bools, by lowercased text
BOOLS = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}


class Scalar:
    """A scalar node: its resolved tag, its text, where it starts (1-based) and whether
    it was written plain (not quoted, not a block scalar)."""

    __slots__ = ("column", "line", "plain", "tag", "value")

    def __init__(self, tag: str, value: str, line: int, column: int, plain: bool) -> None:
        self.tag = tag
        self.value = value
        self.line = line
        self.column = column
        self.plain = plain


class Seq:
    """A list node: `value` is the list of its item nodes."""

    __slots__ = ("column", "line", "tag", "value")

    def __init__(self, tag: str, value: list[Node], line: int, column: int) -> None:
        self.tag = tag
        self.value = value
        self.line = line
        self.column = column


class Map:
    """A mapping node: `value` is the list of its (key node, value node) pairs, in order."""

    __slots__ = ("column", "line", "tag", "value")

    def __init__(self, tag: str, value: list[tuple[Node, Node]], line: int, column: int) -> None:
        self.tag = tag
        self.value = value
        self.line = line
        self.column = column


# a token line's mapping as the writer gives it; `TokenMap` places its nodes by it
_TOKEN_HEAD, _TOKEN_SEP, _TOKEN_SEQ = "{pos: ", ", ", "seq: "


def token_mapping(group: str) -> str:
    """The regex of a token line's mapping, `{pos: P, seq: S}` with P and S plain
    decimal, each in a `group` (`(` to capture them, `(?:` not)."""
    number = rf"{group}0|[1-9][0-9]*)"
    return (re.escape(_TOKEN_HEAD) + number + re.escape(_TOKEN_SEP + _TOKEN_SEQ) + number
            + re.escape("}"))


class TokenMap(Map):
    """The mapping of a recorder's token line, `{pos: P, seq: S}` with P and S plain
    decimal (the composer's `_TokenLines`): a `Map` whose pairs, the very nodes the
    mapping's events make, are made when first read. `pos` and `seq` hold P and S, so
    a reader of that form takes them without the pairs."""

    __slots__ = ("_pairs", "pos", "seq")

    def __init__(self, pos: str, seq: str, line: int, column: int) -> None:
        # Map.__init__ is not called: `value` is the property below
        self.tag, self.line, self.column = MAP, line, column
        self.pos, self.seq = pos, seq
        self._pairs: list[tuple[Node, Node]] | None = None

    @property
    def value(self) -> list[tuple[Node, Node]]:
        if self._pairs is None:
            n, c = self.line, self.column + len(_TOKEN_HEAD)  # P's column
            c_seq = c + len(self.pos) + len(_TOKEN_SEP)
            self._pairs = [
                (Scalar(STR, "pos", n, self.column + 1, True), Scalar(INT, self.pos, n, c, True)),
                (Scalar(STR, "seq", n, c_seq, True),
                 Scalar(INT, self.seq, n, c_seq + len(_TOKEN_SEQ), True)),
            ]
        return self._pairs

    @value.setter  # Map's `value` is writable: a subclass keeps it so
    def value(self, pairs: list[tuple[Node, Node]]) -> None:
        self._pairs = pairs


Node = Scalar | Seq | Map


def short_tag(tag: str) -> str:
    return clip("!!" + tag[len(_Y):] if tag.startswith(_Y) else tag)


def describe(node: Node) -> str:
    if isinstance(node, Seq):
        return "a list"
    if isinstance(node, Map):
        return "a mapping"
    name = _TYPE_NAMES.get(node.tag, f"a {short_tag(node.tag)} scalar")
    if node.tag == NULL:
        return name
    return f"{name} ({quote(node.value)})"
