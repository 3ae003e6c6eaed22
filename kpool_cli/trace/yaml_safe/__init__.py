"""Safe YAML for a trace file: bounded reading and composition, typed reading of the
nodes, and located problems. What a trace must hold (format v1) is `trace.load`'s.

One module per part, each with its invariants:
- `limits`: the bounds of a trace file (`MAX_BYTES`, `MAX_NODE_VISITS`,
  `MAX_DEPTH`, `MAX_OPS`, `MAX_ITEMS`, `MAX_TOKENS`, `MAX_INT_DIGITS`,
  `MAX_PROBLEMS`), `node_limit`, `check_max_tokens` and `check_max_nodes`;
- `problems`: `Problem` and `TraceError`, located problems, and how a problem quotes
  (`clip`, `quote`, `join`; a close name: `wording.suggest`);
- `text`: `read_trace_file` and `encode_trace_text` (text and hash, bounded);
- `nodes`: the light nodes `Scalar`/`Seq`/`Map` (and `TokenMap`, `OpMap`) and the tags they
  carry;
- `composer`: `compose` (text to light nodes, bounded as it goes; `Shape` says where
  in the document the ops, the cache block, a decode and its token lists are);
- `decimal`: the one int syntax, plain decimal (`DECIMAL`, `not_decimal`,
  `plain_int`, `decimal_int`);
- `reader`: `NodeReader`, the base of the loader's walk: it reads nodes as typed
  values and collects located problems.

Each module imports only modules listed above it (`limits` and `problems` none of
them), and none imports this package. This package re-exports the names other
modules import from `trace.yaml_safe`; the bounds among them are copies: a bound is
checked as `limits.NAME`, so lowering one means setting it in `limits`.
"""

from __future__ import annotations

from .composer import (
    C_CACHE,
    C_DECODE,
    C_OP,
    C_OPS,
    C_ROOT,
    C_TOKENS,
    C_UBATCHES,
    Composer,
    Shape,
    compose,
)
from .decimal import DECIMAL, NUMBER_LIKE, decimal_int, not_decimal, plain_int
from .limits import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    MAX_ITEMS,
    MAX_NODE_VISITS,
    MAX_OPS,
    MAX_PROBLEMS,
    MAX_TOKENS,
    check_max_nodes,
    check_max_tokens,
)
from .nodes import BOOL, BOOLS, INT, MAP, STR, Map, Node, OpMap, Scalar, Seq, TokenMap, describe
from .problems import Problem, TraceError, clip, quote
from .reader import NodeReader, Parse, Stop
from .text import encode_trace_text, read_trace_file

__all__ = [
    "BOOL",
    "BOOLS",
    "C_CACHE",
    "C_DECODE",
    "C_OP",
    "C_OPS",
    "C_ROOT",
    "C_TOKENS",
    "C_UBATCHES",
    "DECIMAL",
    "INT",
    "MAP",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_ITEMS",
    "MAX_NODE_VISITS",
    "MAX_OPS",
    "MAX_PROBLEMS",
    "MAX_TOKENS",
    "NUMBER_LIKE",
    "STR",
    "Composer",
    "Map",
    "Node",
    "NodeReader",
    "OpMap",
    "Parse",
    "Problem",
    "Scalar",
    "Seq",
    "Shape",
    "Stop",
    "TokenMap",
    "TraceError",
    "check_max_nodes",
    "check_max_tokens",
    "clip",
    "compose",
    "decimal_int",
    "describe",
    "encode_trace_text",
    "not_decimal",
    "plain_int",
    "quote",
    "read_trace_file",
]
