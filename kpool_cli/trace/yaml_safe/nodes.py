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


# an op line's item as the writer gives it, `NAME: {KEY: VALUE, ...}`: plain words
# and values (a decimal int, maybe negative, or two joined by `..`), single spaces;
# `OpMap` places its nodes by it
_OP_WORD = r"[a-z][a-z0-9_]{0,31}"
_OP_VALUE = r"-?(?:0|[1-9][0-9]{0,15})(?:\.\.(?:0|[1-9][0-9]{0,15}))?"
OP_PAIRS_MOST = 8  # pairs in an op line's mapping (an op declares at most 7 fields)
_OP_PAIR = rf"{_OP_WORD}: {_OP_VALUE}"


def op_mapping(group: str) -> str:
    """The regex of an op line's item, `NAME: {K: V, ...}` (`OP_PAIRS_MOST` pairs at
    most), its name and its mapping's inside each in a `group` (`(` to capture them,
    `(?:` not)."""
    return (rf"{group}{_OP_WORD}): \{{{group}{_OP_PAIR}(?:, {_OP_PAIR})"
            rf"{{0,{OP_PAIRS_MOST - 1}}})\}}")


class OpMap(Map):
    """The item of an op line, `NAME: {K: V, ...}` (`op_mapping`; the composer's
    `_TokenLines`): a `Map` whose pair, the name and its mapping, and the mapping's
    pairs are made when first read, the very nodes the events make. `name` and
    `fields` hold the texts and their tags (`fields`: (key, its tag, value, its tag)
    a pair), so that a reader of the plain forms takes them without the nodes."""

    __slots__ = ("_pairs", "fields", "name", "name_tag")

    def __init__(self, name: str, name_tag: str, fields: tuple[tuple[str, str, str, str], ...],
                 line: int, column: int) -> None:
        # Map.__init__ is not called: `value` is the property below
        self.tag, self.line, self.column = MAP, line, column
        self.name, self.name_tag, self.fields = name, name_tag, fields
        self._pairs: list[tuple[Node, Node]] | None = None

    @property
    def value(self) -> list[tuple[Node, Node]]:
        if self._pairs is None:
            n = self.line
            brace = self.column + len(self.name) + len(": ")  # the `{`'s column
            c = brace + 1  # the first key's
            pairs: list[tuple[Node, Node]] = []
            for key, key_tag, value, value_tag in self.fields:
                c_value = c + len(key) + len(": ")
                pairs.append((Scalar(key_tag, key, n, c, True),
                               Scalar(value_tag, value, n, c_value, True)))
                c = c_value + len(value) + len(", ")
            self._pairs = [(Scalar(self.name_tag, self.name, n, self.column, True),
                            Map(MAP, pairs, n, brace))]
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
