"""Write a `Trace` as canonical YAML, format v1 (TRACE_FORMAT.md, "Trace").

Owns: `dump_trace` and `trace_pieces` (the same text in pieces, for a writer that
shows progress: `kpool gen`), and what a written trace weighs without writing it (`Written`:
YAML nodes as the loader counts them, and bytes; `op_written`, `head_written`), which
`gen.scenarios` bounds its traces with. Key order, and which values are left out,
come from the declaration in `trace.format`: a field is written unless it equals its
declared default (a required field, or one `always_written`, always is).

Invariant: `load_trace_text(dump_trace(t))` equals `t` except for `path` and `sha256`
(ops compare without their `loc`), for every `t` that `load_trace` could have
produced. The canonical form:
- keys in the declared order (TRACE_FORMAT.md's); `name`, `description` and `engine`
  only when set; every `cache` field and `seed` always;
- a decode uses the shorthand `{seq, pos}` when that reads back exactly (one
  sequence set, positions contiguous and increasing, no ext, no cell, no fixed
  split), `ubatches` when the split is fixed, explicit `tokens` otherwise;
- a seq set of one sequence is written as an int, else as a list;
- op arguments equal to their defaults (`p0`/`p1` = -1, `expect.ubatch` = -1, unset
  `expect` fields) are left out.

Invariant of the weights: the ops are the last key and a block list at column 0, so
the text of a trace with ops is its head (every key, `ops:` last) followed by each
op's item as YAML writes a list of that one item: `head_written(t)` plus
`op_written(op)` for every op is exactly the nodes and bytes of `dump_trace(t)`
(when no string of the trace holds a U+0085, the one case where non-ASCII text is
escaped instead; tests/test_gen_bounds.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import yaml

from kpool_cli.trace.format import FORMAT_VERSION, OPS, TOKEN, TOP, Field, Section
from kpool_cli.trace.model import Decode, Op, Token, Trace

__all__ = ["Written", "dump_trace", "head_written", "op_written", "trace_pieces"]

# a piece of `trace_pieces` ends once its ops weigh this much (an op: 1 + its tokens;
# PyYAML writes about 20k tokens a second)
PIECE_WEIGHT = 2048


def dump_trace(trace: Trace) -> str:
    """The trace as YAML text; raises ValueError for a `Decode` whose `ubatches` do not
    partition its tokens in order (it could not be written back as given)."""
    return "".join(text for text, _ in trace_pieces(trace))


def trace_pieces(trace: Trace, weight: int = PIECE_WEIGHT) -> Iterator[tuple[str, int]]:
    """`dump_trace(trace)` in pieces, each with the number of ops it writes: the head
    (every key, `ops:` last), then the items of the ops, a piece ending once its ops
    weigh `weight` (an op: 1 + its tokens). Every op is checked (the ValueError of
    `dump_trace`) before the first piece."""
    items = [{op.kind: _args(op)} for op in trace.ops]
    doc = _doc(trace, items)
    allow_unicode = _allow_unicode(doc)
    if not items:
        yield _dump(doc, allow_unicode), 0
        return
    yield _head(doc, allow_unicode), 0
    start, held = 0, 0
    for i, op in enumerate(trace.ops):
        held += 1 + (len(op.tokens) if isinstance(op, Decode) else 0)
        if held >= weight or i == len(items) - 1:
            yield _dump(items[start:i + 1], allow_unicode), i + 1 - start
            start, held = i + 1, 0


@dataclass(frozen=True, slots=True)
class Written:
    """What a part of a trace's YAML weighs: its nodes (every scalar, list and mapping,
    as the loader's composer counts them) and its bytes (UTF-8)."""

    nodes: int = 0
    bytes: int = 0

    def __add__(self, other: Written) -> Written:
        return Written(self.nodes + other.nodes, self.bytes + other.bytes)

    def __mul__(self, k: int) -> Written:
        return Written(self.nodes * k, self.bytes * k)

    __rmul__ = __mul__

    def most(self, other: Written) -> Written:
        """The larger of each count: a bound on either."""
        return Written(max(self.nodes, other.nodes), max(self.bytes, other.bytes))


def op_written(op: Op) -> Written:
    """The op's item of `ops` as `dump_trace` writes it: exactly, in a trace whose
    strings hold no U+0085."""
    item = {op.kind: _args(op)}
    return Written(_nodes(item), len(_dump([item], True).encode("utf-8")))


def head_written(trace: Trace) -> Written:
    """Everything `dump_trace` writes of a trace with ops but the ops' items (the ops
    of `trace` are left out): exactly, as `op_written`."""
    doc = _doc(replace(trace, ops=()), [])
    return Written(_nodes(doc), len(_head(doc, _allow_unicode(doc)).encode("utf-8")))


def _doc(trace: Trace, items: list[dict[str, Any]]) -> dict[str, Any]:
    top = {
        "kpool_trace": FORMAT_VERSION, "name": trace.name, "description": trace.description,
        "cache": trace.cache.as_dict(), "engine": trace.engine, "seed": trace.seed,
        "ops": items,
    }
    return {f.name: top[f.name] for f in TOP.fields if _written(f, top[f.name])}


def _allow_unicode(doc: dict[str, Any]) -> bool:
    # PyYAML writes a raw U+0085 (NEL) in a single-quoted scalar and reads it back as a
    # line fold: escape every non-ASCII character instead when a string holds one.
    return not any("\x85" in s for s in _strings(doc))


def _dump(value: Any, allow_unicode: bool) -> str:
    return yaml.safe_dump(
        value, sort_keys=False, default_flow_style=None, allow_unicode=allow_unicode, width=100
    )


def _head(doc: dict[str, Any], allow_unicode: bool) -> str:
    """The document's text up to its ops' items: `ops:` is its last line."""
    text = _dump({**doc, "ops": []}, allow_unicode)
    assert text.endswith("\nops: []\n") and list(doc)[-1] == "ops", "ops is the last key"
    return text[: -len(" []\n")] + "\n"


def _nodes(value: Any) -> int:
    """The YAML nodes of a value as the writer hands it to PyYAML."""
    if isinstance(value, dict):
        return 1 + sum(1 + _nodes(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_nodes(v) for v in value)
    return 1


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _written(f: Field, value: object) -> bool:
    return f.required or f.always_written or value != f.default


def _seq(seq: tuple[int, ...]) -> int | list[int]:
    return seq[0] if len(seq) == 1 else list(seq)


def _value(f: Field, value: Any) -> Any:
    """A field's value as YAML writes it: tuples as lists, a seq set of one as an int."""
    if f.type.name == "seq_set":
        return _seq(value)
    if isinstance(value, tuple):
        return [_value(f, v) for v in value]
    return value


def _fields(section: Section, obj: object) -> dict[str, Any]:
    """The declared fields of `section` that `obj` (an op, a token) has to write."""
    out: dict[str, Any] = {}
    for f in section.fields:
        v = getattr(obj, f.name)
        if _written(f, v):
            out[f.name] = _value(f, v)
    return out


def _token(t: Token) -> dict[str, Any]:
    return _fields(TOKEN, t)


def _decode(op: Decode) -> dict[str, Any]:
    if op.span is not None:
        sp = op.span
        out: dict[str, Any] = {"seq": _seq(sp.seq), "pos": f"{sp.start}..{sp.stop}"}
        if sp.ext is not None:
            out["ext"] = list(sp.ext)
        return out
    tokens = op.tokens
    if op.ubatches is not None:
        flat = [i for ub in op.ubatches for i in ub]
        if flat != list(range(len(tokens))) or not all(op.ubatches):
            raise ValueError("Decode.ubatches must split its tokens, in order, in non-empty parts")
        return {"ubatches": [[_token(tokens[i]) for i in ub] for ub in op.ubatches]}
    first = tokens[0] if tokens else None
    if first is not None and all(
        t.seq == first.seq and t.pos == first.pos + i and t.ext is None and t.cell is None
        for i, t in enumerate(tokens)
    ):
        end = first.pos + len(tokens)
        pos: int | str = first.pos if len(tokens) == 1 else f"{first.pos}..{end}"
        return {"seq": _seq(first.seq), "pos": pos}
    return {"tokens": [_token(t) for t in tokens]}


def _args(op: Op) -> Any:
    """The value under the op's key."""
    if isinstance(op, Decode):
        return _decode(op)
    section = OPS.get(op.kind)
    if section is None:
        raise TypeError(f"not a trace op: {op!r}")
    if section.body == "text":
        return op.text  # type: ignore[union-attr]
    return _fields(section, op)
