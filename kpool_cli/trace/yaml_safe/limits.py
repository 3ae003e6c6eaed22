"""The bounds of a trace file: how much of it kpool reads, composes, walks and
reports, and the two bounds a caller chooses (`max_tokens` and `max_nodes`, checked
by `check_max_tokens` and `check_max_nodes`).

Owns: `MAX_BYTES`, `MAX_NODE_VISITS`, `MAX_DEPTH`, `MAX_OPS`, `MAX_ITEMS`,
`MAX_TOKENS`, `MAX_INT_DIGITS`, `MAX_PROBLEMS`, `node_limit`, `check_max_tokens` and
`check_max_nodes`.

Invariants:
- Bounds are checked *before* the work they bound ("refuse before spending"): at
  most `MAX_BYTES` of text, read no further (`text`). The composer (`composer`)
  counts while it composes and stops at the first bound crossed, naming the node
  there (line, column, field): `node_limit(max_nodes)` nodes (`MAX_NODE_VISITS`
  unless the caller chose another bound: the CLI's `--max-nodes`, for a trace of
  more explicit tokens than the default allows), an alias counting as the
  size of the node it names (so an alias bomb stops at the alias that crosses; an
  alias to a node still being composed is a recursive alias); `MAX_DEPTH` levels;
  `MAX_OPS` ops; `MAX_ITEMS` items in any other list or mapping but a token list;
  tokens (the items of a decode's `pos`, `tokens` and `ubatches[i]` lists):
  `max_tokens` in the trace (default `MAX_TOKENS`; the CLI's `--max-tokens`) and,
  once the cache block has been read, the shape's `decode_cap` in one decode.
  `NodeReader` (`reader`) counts the nodes it visits again, aliases expanded,
  against the same `node_limit(max_nodes)`.
- An int of more than `MAX_INT_DIGITS` digits is refused by its size, never parsed
  (`decimal`); at most `MAX_PROBLEMS` problems are collected (`reader`).
- Every bound is read from this module when it is checked (`limits.MAX_OPS`, never a
  copy taken at import), by the composer, the node reader and the loader's walk
  alike, the node bound once a load starts (`node_limit`): one constant each, so
  lowering one here (a test's `monkeypatch.setattr(limits, ...)`) lowers it
  everywhere at once, and `kpool gen` (`gen.scenarios.LOADER_BOUNDS`) reads them
  here too. The names `trace.yaml_safe`
  and `trace.load` re-export are copies, for reading.
"""

from __future__ import annotations

MAX_BYTES = 64 * 1024 * 1024  # a larger document is refused unread
# nodes, aliases expanded: ~130 B and 2 to 3 us each to parse, compose and walk. A
# recorded token line is 5 nodes (`{pos: P, seq: S}`, as kpool writes it) or 6
# (`seq: [S]`): a recorded llama-server trace of 2,100 decodes of 64 tokens has 680k
# to 817k, and this default caps explicit tokens near 200k (160k) unless the caller
# raises it (`node_limit`, the CLI's --max-nodes).
MAX_NODE_VISITS = 1_000_000
MAX_OPS = 2**16  # ops in a trace (that same recorded trace has 2,100)
MAX_ITEMS = 2**16  # items of any other list or mapping, but a token list
MAX_PROBLEMS = 20  # problems collected before giving up
MAX_TOKENS = 2**22  # default token bound of a trace (a Token object: ~1 us, ~100 B)
MAX_DEPTH = 32  # YAML nesting levels (a valid trace needs 9)
MAX_INT_DIGITS = 20  # SEED_MAX has 20 digits: a longer int is out of range everywhere


def node_limit(max_nodes: int | None) -> int:
    """The node bound of a load: the caller's `max_nodes`, or `MAX_NODE_VISITS` (read
    here when the load starts) for None."""
    return MAX_NODE_VISITS if max_nodes is None else max_nodes


def _check_bound(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def check_max_tokens(max_tokens: int) -> None:
    _check_bound("max_tokens", max_tokens)


def check_max_nodes(max_nodes: int | None) -> None:
    if max_nodes is not None:
        _check_bound("max_nodes", max_nodes)
