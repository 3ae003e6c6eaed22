"""Read a trace file (TRACE_FORMAT.md, "Trace", format v1) into `trace.model.Trace`:
the rules of format v1, on nodes that `trace.yaml_safe` composed and bounded.

Owns: `load_trace` and `load_trace_text`, the entry points. Re-exports what callers
import from here: `TraceError`, `Problem` and the bounds (`MAX_*` from
`trace.yaml_safe`, `POS_LIMIT`, `KV_SIZE_MAX`, ... from `trace.format`), and the
walk's `SHAPE` and `LISTED_PAST_THE_CACHE` (`shape`).

The walk of format v1, one module per section of the format, each with the
invariants it enforces:
- `shape`: what the composer bounds while it composes (`SHAPE`);
- `fields`: the walk's state (the cache's values the ops are checked against, the
  tokens counted, the slots written) and the reader every section shares, of seq
  ids;
- `cache`: the cache block;
- `ops`: the ops list and the ops in general: those read by their declared fields
  alone (the edits, `clear`), `note`, `expect` and its placement, the state ops;
- `decode`: a decode: its one form (shorthand, `tokens`, `ubatches`), positions and
  ranges, the fields of a token, the decode-wide rules;
- `walk`: the top level (the version first, then the cache block, the ops and the
  other keys), the walker made of the sections, and how it reads each declared type.

How and why:
- The keys each mapping may hold, which are required, their static bounds and
  defaults are those `trace.format` declares; the walk reads each field by its
  declared type. What no declaration can say stays code here: bounds that depend on
  the cache (seq ids below `n_seq_max`, cells below `kv_size`, `kpool <= kv_size`,
  ubatches of at most `n_ubatch` tokens), a decode's one form, the decode-wide
  rules, slots written before they are read, and `expect` placement.
- Every problem found is reported (up to `MAX_PROBLEMS`, sorted by position), not
  just the first; the version is read first, so a trace of another version gets one
  problem, which says the rest was not checked (`walk`).
- A `pos` range `A..B` is checked arithmetically before it is built, against the
  tokens left and against the cache (`decode`).
- The cyclic garbage collector is paused while loading: the node graph and the
  trace are acyclic.

Invariants of a returned `Trace`: those listed in `trace.model`'s docstring, plus
- at most `MAX_OPS` ops and `max_tokens` tokens; a decode listing more tokens than
  the cache's `kv_size * n_stream` cells is built up to `LISTED_PAST_THE_CACHE`
  tokens (or that many cells, if more: past it the trace is refused), and a range
  of more tokens than a stream's `kv_size` cells is kept unbuilt, as a `Span`:
  llama_decode refuses such a decode (KP006 at replay), or past the whole cache
  aborts on its assert on n_batch (KP005);
- every seq id is in `[0, n_seq_max)`, or -1 where the op allows it (seq_rm,
  state_drop);
- every position and `ext` coordinate is in `[0, POS_LIMIT)`, so
  `pos + n_ubatch` fits an int32 (llama_pos);
- `ext` appears only when `cache.by_order` is true; within a decode either every
  token has a `cell` (stream-local, `< kv_size`) or none has, and no two tokens
  of the decode name the same cell of the same stream (stream 0 when unified, else
  the token's first seq id);
- an explicit `ubatches` split has non-empty ubatches of at most `n_ubatch` tokens,
  whose tokens' sequence sets are equal or disjoint (split_equal's ubatches);
- every `state_read` names a slot written by an earlier `state_write`;
- every `expect` follows some op other than `note`/`expect`.
"""

from __future__ import annotations

import gc
from pathlib import Path

from kpool_cli.trace.format import (
    KV_SIZE_MAX,
    N_EMBD_MAX,
    N_RS_SEQ_MAX,
    N_SEQ_MAX_MAX,
    N_UBATCH_MAX,
    POS_LIMIT,
)
from kpool_cli.trace.model import Trace
from kpool_cli.trace.yaml_safe import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    MAX_ITEMS,
    MAX_NODE_VISITS,
    MAX_OPS,
    MAX_PROBLEMS,
    MAX_TOKENS,
    Problem,
    Stop,
    TraceError,
    check_max_nodes,
    check_max_tokens,
    compose,
    encode_trace_text,
    read_trace_file,
)

from .decode import POS_RANGE as POS_RANGE
from .decode import SHORTHAND as SHORTHAND
from .ops import FINDING_CODE as FINDING_CODE
from .shape import LISTED_PAST_THE_CACHE as LISTED_PAST_THE_CACHE
from .shape import SHAPE
from .walk import _Walker

__all__ = [
    "KV_SIZE_MAX",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_ITEMS",
    "MAX_NODE_VISITS",
    "MAX_OPS",
    "MAX_PROBLEMS",
    "MAX_TOKENS",
    "N_EMBD_MAX",
    "N_RS_SEQ_MAX",
    "N_SEQ_MAX_MAX",
    "N_UBATCH_MAX",
    "POS_LIMIT",
    "Problem",
    "TraceError",
    "load_trace",
    "load_trace_text",
]

# --- entry points -------------------------------------------------------------------


def load_trace(path: str | Path, *, max_tokens: int = MAX_TOKENS,
               max_nodes: int | None = None) -> Trace:
    """Read and validate the trace at `path`, of at most `max_tokens` tokens and
    `max_nodes` YAML nodes, aliases expanded (each >= 1; None: `MAX_NODE_VISITS`).
    Raises `TraceError`, never anything else for a bad file (missing, a directory,
    not UTF-8, too large, invalid)."""
    check_max_tokens(max_tokens)
    check_max_nodes(max_nodes)
    file, text, sha256 = read_trace_file(path)
    return _load(text, file, sha256, max_tokens, max_nodes)


def load_trace_text(
    text: str, path: str = "<string>", *, max_tokens: int = MAX_TOKENS,
    max_nodes: int | None = None,
) -> Trace:
    """Validate a trace given as text; `path` only names it in problems and in
    `Trace.path`. `Trace.sha256` is the hash of the text encoded as UTF-8."""
    check_max_tokens(max_tokens)
    check_max_nodes(max_nodes)
    return _load(text, path, encode_trace_text(text, path), max_tokens, max_nodes)


def _load(text: str, file: str, sha256: str, max_tokens: int, max_nodes: int | None
          ) -> Trace:
    # The node graph and the trace are acyclic (a recursive alias is refused): the
    # cyclic collector would only rescan the young nodes over and over (about 60% of
    # the time of a 130k-token trace), so it is paused while loading.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        return _load_nodes(text, file, sha256, max_tokens, max_nodes)
    finally:
        if gc_was_on:
            gc.enable()


def _load_nodes(text: str, file: str, sha256: str, max_tokens: int,
                max_nodes: int | None) -> Trace:
    root = compose(text, file, max_tokens, SHAPE, max_nodes)
    if root is None:
        raise TraceError([Problem(
            file, 1, 1, "<document>",
            "empty document: a trace is a mapping with kpool_trace, cache and ops",
        )])
    w = _Walker(file, max_tokens, max_nodes)
    try:
        trace = w.trace(root, sha256)
    except Stop:
        trace = None
    if w.problems or trace is None:
        problems = sorted(w.problems, key=lambda p: (p.line, p.column))
        raise TraceError(problems, w.truncated)
    return trace
