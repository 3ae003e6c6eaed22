"""Write a `Trace` as canonical YAML, format v1 (TRACE_FORMAT.md, "Trace").

Owns: `dump_trace`.

Invariant: `load_trace_text(dump_trace(t))` equals `t` except for `path` and `sha256`
(ops compare without their `loc`), for every `t` that `load_trace` could have
produced. The canonical form:
- top-level keys in TRACE_FORMAT.md's order; `name`, `description` and `engine` only
  when set; every `cache` field and `seed` always;
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

from kpool_cli.trace.model import (
    FORMAT_VERSION,
    Clear,
    Decode,
    Expect,
    Note,
    Op,
    SeqAdd,
    SeqCp,
    SeqDiv,
    SeqKeep,
    SeqRm,
    StateDrop,
    StateRead,
    StateWrite,
    Token,
    Trace,
)

__all__ = ["dump_trace"]


def dump_trace(trace: Trace) -> str:
    """The trace as YAML text; raises ValueError for a `Decode` whose `ubatches` do not
    partition its tokens in order (it could not be written back as given)."""
    doc: dict[str, Any] = {"kpool_trace": FORMAT_VERSION}
    if trace.name:
        doc["name"] = trace.name
    if trace.description:
        doc["description"] = trace.description
    doc["cache"] = trace.cache.as_dict()
    if trace.engine is not None:
        doc["engine"] = trace.engine
    doc["seed"] = trace.seed
    doc["ops"] = [{op.kind: _args(op)} for op in trace.ops]
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


def _seq(seq: tuple[int, ...]) -> int | list[int]:
    return seq[0] if len(seq) == 1 else list(seq)


def _token(t: Token) -> dict[str, Any]:
    out: dict[str, Any] = {"pos": t.pos, "seq": _seq(t.seq)}
    if t.ext is not None:
        out["ext"] = list(t.ext)
    if t.cell is not None:
        out["cell"] = t.cell
    return out


def _decode(op: Decode) -> dict[str, Any]:
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


def _range(args: dict[str, Any], p0: int, p1: int) -> dict[str, Any]:
    if p0 != -1:
        args["p0"] = p0
    if p1 != -1:
        args["p1"] = p1
    return args


def _args(op: Op) -> Any:
    """The value under the op's key."""
    match op:
        case Decode():
            return _decode(op)
        case SeqRm():
            return _range({"seq": op.seq}, op.p0, op.p1)
        case SeqCp():
            return _range({"src": op.src, "dst": op.dst}, op.p0, op.p1)
        case SeqKeep():
            return {"seq": op.seq}
        case SeqAdd():
            return {**_range({"seq": op.seq}, op.p0, op.p1), "shift": op.shift}
        case SeqDiv():
            return {**_range({"seq": op.seq}, op.p0, op.p1), "d": op.d}
        case StateWrite() | StateRead():
            return {"seq": op.seq, "slot": op.slot}
        case StateDrop():
            return {"seq": op.seq}
        case Clear():
            return {}
        case Note():
            return op.text
        case Expect():
            return _expect(op)
    raise TypeError(f"not a trace op: {op!r}")


def _expect(op: Expect) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if op.engine is not None:
        out["engine"] = op.engine
    if op.findings is not None:
        out["findings"] = list(op.findings)
    if op.n_new is not None:
        out["n_new"] = op.n_new
    if op.n_new_g is not None:
        out["n_new_g"] = op.n_new_g
    if op.pools is not None:
        out["pools"] = [list(p) for p in op.pools]
    if op.status is not None:
        out["status"] = op.status
    if op.ubatch != -1:
        out["ubatch"] = op.ubatch
    return out
