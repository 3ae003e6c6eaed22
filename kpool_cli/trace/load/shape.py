"""What the composer bounds while it composes a trace (`trace.yaml_safe`'s
`Shape`): where the ops, the cache block, a decode and its token lists are, by the
declared types of `trace.format`, and the most tokens one decode may list.

Owns: `SHAPE` (given to `compose`), `LISTED_PAST_THE_CACHE`.

Invariants:
- The contexts follow the declarations: the ops list and the cache block of the top
  level, a decode, and a decode's lists of tokens (`pos`, `tokens`) and of
  ubatches.
- A listed decode (`tokens:`, `ubatches:`, a `pos` list) of more than
  max(kv_size * n_stream, `LISTED_PAST_THE_CACHE`) tokens is refused as it is
  composed, once the cache block's scalars give that cap (none: no cap but the
  trace's tokens); a range (`pos: A..B`) of any length is never built, so it is left
  to the walk (`decode`).
"""

from __future__ import annotations

from typing import cast

from kpool_cli.trace.format import CACHE, OPS, TOP, Field
from kpool_cli.trace.yaml_safe import (
    BOOL,
    BOOLS,
    C_CACHE,
    C_DECODE,
    C_OP,
    C_OPS,
    C_ROOT,
    C_TOKENS,
    C_UBATCHES,
    Scalar,
    Shape,
    plain_int,
)

# The most tokens kpool builds of a listed decode (`tokens:`, `ubatches:`, a `pos`
# list) larger than the cache, which llama_decode's assert on n_batch aborts (KP005,
# docs/ENGINE.md §3): up to this many (or kv_size * n_stream, if more) it is built
# and replayed; past it, a hostile list would cost memory for nothing, so the trace
# is refused. A range (`pos: A..B`) of any length is never built.
LISTED_PAST_THE_CACHE = 65_536


def _decode_cap(cache: dict[str, Scalar]) -> int | None:
    """max(kv_size * n_stream, LISTED_PAST_THE_CACHE) from the cache block's scalars,
    if they are valid."""
    kv = plain_int(cache.get("kv_size"))
    n_seq = (plain_int(cache["n_seq_max"]) if "n_seq_max" in cache
             else cast(int, CACHE["n_seq_max"].default))
    unified = cast("bool | None", CACHE["unified"].default)
    if "unified" in cache:
        u = cache["unified"]
        unified = BOOLS.get(u.value.lower()) if u.tag == BOOL else None
    if kv is None or n_seq is None or unified is None:
        return None
    if not (_within(kv, CACHE["kv_size"]) and _within(n_seq, CACHE["n_seq_max"])):
        return None
    return max(kv * (1 if unified else n_seq), LISTED_PAST_THE_CACHE)


def _within(v: int, f: Field) -> bool:
    return (f.lo is None or f.lo <= v) and (f.hi is None or v <= f.hi)


def _unplaceable_list(cap: int) -> str:
    return (
        f"a decode listing more than {cap:,} tokens: more than the cache's kv_size *"
        " n_stream cells (llama_decode's assert on n_batch aborts it) and than kpool"
        " builds of such a decode; write it as a range (pos: A..B), which kpool"
        " replays unbuilt as the abort it is (KP005)"
    )


# The keys whose values the composer counts, by their declared types: the ops list
# and the cache block of the top level, a decode, and a decode's lists of tokens
# (`pos`, `tokens`) and of ubatches.
_CONTEXT_OF_TYPE = {"ops": C_OPS, "section": C_CACHE, "positions": C_TOKENS,
                    "tokens": C_TOKENS, "ubatches": C_UBATCHES}
SHAPE = Shape(
    routes={
        **{(C_ROOT, f.name): _CONTEXT_OF_TYPE[f.type.name] for f in TOP.fields
           if f.type.name in _CONTEXT_OF_TYPE},
        (C_OP, "decode"): C_DECODE,
        **{(C_DECODE, f.name): _CONTEXT_OF_TYPE[f.type.name] for f in OPS["decode"].fields
           if f.type.name in _CONTEXT_OF_TYPE},
    },
    decode_cap=_decode_cap,
    unplaceable=_unplaceable_list,
)
