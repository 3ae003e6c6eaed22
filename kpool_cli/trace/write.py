"""Write a `Trace` as canonical YAML, format v1 (TRACE_FORMAT.md, "Trace").

Owns: `dump_trace`. Key order, and which values are left out, come from the
declaration in `trace.format`: a field is written unless it equals its declared
default (a required field, or one `always_written`, always is).

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
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from kpool_cli.trace.format import FORMAT_VERSION, OPS, TOKEN, TOP, Field, Section
from kpool_cli.trace.model import Decode, Op, Token, Trace

__all__ = ["dump_trace"]


def dump_trace(trace: Trace) -> str:
    """The trace as YAML text; raises ValueError for a `Decode` whose `ubatches` do not
    partition its tokens in order (it could not be written back as given)."""
    top = {
        "kpool_trace": FORMAT_VERSION, "name": trace.name, "description": trace.description,
        "cache": trace.cache.as_dict(), "engine": trace.engine, "seed": trace.seed,
        "ops": [{op.kind: _args(op)} for op in trace.ops],
    }
    doc = {f.name: top[f.name] for f in TOP.fields if _written(f, top[f.name])}
    # PyYAML writes a raw U+0085 (NEL) in a single-quoted scalar and reads it back as a
    # line fold: escape every non-ASCII character instead when a string holds one.
    allow_unicode = not any("\x85" in s for s in _strings(doc))
    return yaml.safe_dump(
        doc, sort_keys=False, default_flow_style=None, allow_unicode=allow_unicode, width=100
    )


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
