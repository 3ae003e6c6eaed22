"""Read a trace file (TRACE_FORMAT.md, "Trace", format v1) into `trace.model.Trace`:
the rules of format v1, on nodes that `trace.yaml_safe` composed and bounded.

Owns: `load_trace`, `load_trace_text` and the walk of format v1. Re-exports what
callers import from here: `TraceError`, `Problem` and the bounds (`MAX_*` from
`trace.yaml_safe`, `POS_LIMIT`, `KV_SIZE_MAX`, ... from `trace.format`).

How and why:
- The keys each mapping may hold, which are required, their static bounds and
  defaults are those `trace.format` declares; the walk reads each field by its
  declared type. What no declaration can say stays code here: bounds that depend on
  the cache (seq ids below `n_seq_max`, cells below `kv_size`, `kpool <= kv_size`,
  ubatches of at most `n_ubatch` tokens), a decode's one form, the decode-wide
  rules, slots written before they are read, and `expect` placement.
- Every problem found is reported (up to `MAX_PROBLEMS`), not just the first; the
  version is read first, so a trace of another version gets one problem.
- A `pos` range `A..B` is checked arithmetically before it is built, against the
  tokens left and against the cache: a decode with more tokens than its stream has
  cells (`kv_size`) could never be placed by llama_decode, so it is refused at load
  rather than replayed into a KP006 rejection.

Invariants of a returned `Trace`: those listed in `trace.model`'s docstring, plus
- at most `MAX_OPS` ops and `max_tokens` tokens; a decode has at most `kv_size`
  tokens per stream (stream 0 when unified, else each token's first seq id);
- every seq id is in `[0, n_seq_max)`, or -1 where the op allows it (seq_rm,
  state_drop);
- every position and `ext` coordinate is in `[0, POS_LIMIT)`, so
  `pos + n_ubatch` fits an int32 (llama_pos);
- `ext` appears only when `cache.by_order` is true; within a decode either every
  token has a `cell` (stream-local, `< kv_size`) or none has, and no two tokens
  of the decode name the same cell of the same stream;
- an explicit `ubatches` split has non-empty ubatches of at most `n_ubatch` tokens,
  whose tokens' sequence sets are equal or disjoint (split_equal's ubatches);
- every `state_read` names a slot written by an earlier `state_write`;
- every `expect` follows some op other than `note`/`expect`.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kpool_cli.trace.format import (
    BOUND,
    CACHE,
    CELL,
    DECODE_FORMS,
    DECODE_KEYS,
    EXT,
    FORMAT_VERSION,
    KV_SIZE_MAX,
    N_EMBD_MAX,
    N_RS_SEQ_MAX,
    N_SEQ_MAX_MAX,
    N_UBATCH_MAX,
    OP_STATUSES,
    OPS,
    POOL,
    POS,
    POS_LIMIT,
    SEQ,
    SLOT,
    TOKEN,
    TOP,
    Field,
    Section,
    Type,
)
from kpool_cli.trace.model import (
    OP_TYPES,
    CacheConfig,
    Decode,
    Loc,
    Note,
    Op,
    Span,
    StateRead,
    StateWrite,
    Token,
    Trace,
)
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
    DECIMAL,
    MAX_BYTES,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    MAX_ITEMS,
    MAX_NODE_VISITS,
    MAX_OPS,
    MAX_PROBLEMS,
    MAX_TOKENS,
    NUMBER_LIKE,
    STR,
    Map,
    Node,
    NodeReader,
    Parse,
    Problem,
    Scalar,
    Seq,
    Shape,
    Stop,
    TraceError,
    check_max_tokens,
    clip,
    compose,
    describe,
    encode_trace_text,
    not_decimal,
    plain_int,
    quote,
    read_trace_file,
    suggest,
)
from kpool_cli.versions import VERSIONS

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

FINDING_CODE = re.compile(r"KP[0-9]{3}", re.ASCII)
POS_RANGE = re.compile(r"\s*([^\s.]+)\s*\.\.\s*([^\s.]+)\s*")  # ends: see DECIMAL

# --- entry points -------------------------------------------------------------------


def load_trace(path: str | Path, *, max_tokens: int = MAX_TOKENS) -> Trace:
    """Read and validate the trace at `path`, of at most `max_tokens` tokens (>= 1).
    Raises `TraceError`, never anything else for a bad file (missing, a directory,
    not UTF-8, too large, invalid)."""
    check_max_tokens(max_tokens)
    file, text, sha256 = read_trace_file(path)
    return _load(text, file, sha256, max_tokens)


def load_trace_text(
    text: str, path: str = "<string>", *, max_tokens: int = MAX_TOKENS
) -> Trace:
    """Validate a trace given as text; `path` only names it in problems and in
    `Trace.path`. `Trace.sha256` is the hash of the text encoded as UTF-8."""
    check_max_tokens(max_tokens)
    return _load(text, path, encode_trace_text(text, path), max_tokens)


def _load(text: str, file: str, sha256: str, max_tokens: int) -> Trace:
    # The node graph and the trace are acyclic (a recursive alias is refused): the
    # cyclic collector would only rescan the young nodes over and over (about 60% of
    # the time of a 130k-token trace), so it is paused while loading.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        return _load_nodes(text, file, sha256, max_tokens)
    finally:
        if gc_was_on:
            gc.enable()


def _load_nodes(text: str, file: str, sha256: str, max_tokens: int) -> Trace:
    root = compose(text, file, max_tokens, SHAPE)
    if root is None:
        raise TraceError([Problem(
            file, 1, 1, "<document>",
            "empty document: a trace is a mapping with kpool_trace, cache and ops",
        )])
    w = _Walker(file, max_tokens)
    try:
        trace = w.trace(root, sha256)
    except Stop:
        trace = None
    if w.problems or trace is None:
        problems = sorted(w.problems, key=lambda p: (p.line, p.column))
        raise TraceError(problems, w.truncated)
    return trace


# --- what the composer bounds --------------------------------------------------------

# The most tokens kpool builds of a listed decode (`tokens:`, `ubatches:`, a `pos`
# list) that llama_decode refuses for being larger than the cache: up to this many
# (or kv_size * n_stream, if more) it is built and replayed as the refused decode it
# is (KP006); past it, a hostile list would cost memory for nothing, so the trace is
# refused. A range (`pos: A..B`) of any length is never built.
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
        " n_stream cells (llama_decode refuses it) and than kpool builds of such a"
        " decode; write it as a range (pos: A..B), which kpool replays unbuilt as the"
        " refused decode (KP006)"
    )


def _static(t: Type) -> tuple[int, int]:
    """The static bounds of a bounded type (a seq id's, a range end's)."""
    assert t.lo is not None and t.hi is not None, t
    return t.lo, t.hi


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


# --- the walk -----------------------------------------------------------------------


@dataclass
class _Limits:
    """What the ops are checked against: the cache's values, None where the cache
    does not give a usable one (then only the static bound is checked)."""

    n_seq_max: int | None = None
    kv_size: int | None = None
    unified: bool | None = None
    by_order: bool | None = None
    n_ubatch: int | None = None


def _set_words(seqs) -> str:
    return "{" + ", ".join(str(s) for s in seqs) + "}"


@dataclass
class _Tok:
    """A parsed explicit token and where its parts are, for the decode-wide checks."""

    token: Token | None
    field: str
    node: Node
    ext_node: Node | None
    cell_node: Node | None


class _Walker(NodeReader):
    """The walk of format v1: a `Trace` from the root node, or problems."""

    def __init__(self, file: str, max_tokens: int = MAX_TOKENS) -> None:
        super().__init__(file)
        self.n_tokens = 0
        self.max_tokens = max_tokens
        self.lim = _Limits()
        self.slots: set[str] = set()

    # -- the trace

    def trace(self, root: Node, sha256: str) -> Trace | None:
        if isinstance(root, Map):  # the version first: a v2 trace gets one problem
            for k, v in root.value:
                if isinstance(k, Scalar) and k.tag == STR and k.value == "kpool_trace":
                    self.version(v)
                    break
        top = self.map_(root, "", TOP.names, TOP.required)
        if top is None:
            return None
        before = len(self.problems)
        cache = self.cache(top["cache"]) if "cache" in top else None
        vals: dict[str, Any] = {
            k: self.value(TOP[k], top[k], k) if k in top else TOP[k].default
            for k in ("name", "description", "seed")
        }
        engine = self.value(TOP["engine"], top["engine"], "engine") if "engine" in top else None
        ops = self.ops(top["ops"]) if "ops" in top else None
        if len(self.problems) != before or cache is None or ops is None:
            return None
        assert None not in vals.values()
        return Trace(cache=cache, ops=ops, engine=engine, path=self.file, sha256=sha256, **vals)

    def engine(self, node: Node) -> str | None:
        """The trace's default engine: a registered version only. A trace is data and
        runs no code, so a plug-in (`module:Name`) is taken from `--engine` alone."""
        name = self.str_(node, "engine", nonempty=True)
        if name is None or name in VERSIONS:
            return name
        known = ", ".join(VERSIONS)
        how = ("a plug-in version (module:Name) is given with --engine only, never by a "
               "trace" if ":" in name else "a plug-in version is given with --engine")
        self.problem(node, "engine", f"{quote(name)} is not a registered engine version "
                     f"(known: {known}); {how}")
        return None

    def version(self, node: Node) -> None:
        v = self.int_(node, "kpool_trace")
        if v is not None and v != FORMAT_VERSION:
            # Nothing else is checked: another version's fields would only add noise.
            self.fatal(
                node, "kpool_trace",
                f"unsupported format version {v}, this kpool reads {FORMAT_VERSION}",
            )

    def cache(self, node: Node) -> CacheConfig | None:
        """TRACE_FORMAT.md "Trace" (cache block) and ENGINE.md §2. Records the values
        that parse in `self.lim` even if the block as a whole is wrong, so that the
        ops are still checked against them."""
        f = "cache"
        before = len(self.problems)
        m = self.map_(node, f, CACHE.names, CACHE.required)
        if m is None:
            return None
        kv = self.value(CACHE["kv_size"], m["kv_size"], "cache.kv_size") if "kv_size" in m else None
        kpool = None
        if "kpool" in m:
            kpool = self.value(CACHE["kpool"], m["kpool"], "cache.kpool")
            if kpool is not None and kv is not None and kpool > kv:
                self.problem(
                    m["kpool"], "cache.kpool",
                    f"out of range: kpool {kpool} is larger than cache.kv_size ({kv})",
                )
                kpool = None
        vals: dict[str, Any] = {
            fld.name: self.value(fld, m[fld.name], f"cache.{fld.name}") if fld.name in m
            else fld.default
            for fld in CACHE.fields if not fld.required
        }
        self.lim = _Limits(
            n_seq_max=vals["n_seq_max"], kv_size=kv, unified=vals["unified"],
            by_order=vals["by_order"], n_ubatch=vals["n_ubatch"],
        )
        if len(self.problems) != before or kv is None or kpool is None:
            return None
        cfg = CacheConfig(kv_size=kv, kpool=kpool, **vals)
        return cfg

    def ops(self, node: Node) -> tuple[Op, ...] | None:
        items = self.list_(node, "ops")
        if items is None:
            return None
        if len(items) > MAX_OPS:  # an alias of a list, or the composer's bound lifted
            self.fatal(
                items[MAX_OPS], f"ops[{MAX_OPS}]",
                f"more than {MAX_OPS:,} ops in the trace: refusing it (the bound on its ops)",
            )
        before = len(self.problems)
        out: list[Op] = []
        after_op = False  # some op other than note/expect came before
        for i, item in enumerate(items):
            f = f"ops[{i}]"
            name, op = self.op(item, f)
            if name == "expect" and not after_op:
                self.problem(
                    item, f,
                    "expect has no op before it (it checks the previous op; notes do not count)",
                )
            elif name is not None and name not in ("note", "expect"):
                after_op = True
            if op is not None:
                out.append(op)
        return tuple(out) if len(self.problems) == before else None

    def op(self, item: Node, f: str) -> tuple[str | None, Op | None]:
        """One item of `ops`: a mapping with exactly one key, the op name. Returns the
        op name when it is a known one (even if the op is invalid) and the op."""
        if not self.visit(item, f):
            return None, None
        if not isinstance(item, Map):
            self.problem(
                item, f,
                f"an op is a mapping with one key, the op name (`- seq_rm: {{seq: 0}}`),"
                f" got {describe(item)}",
            )
            return None, None
        if not item.value:
            self.problem(item, f, "empty op: expected one key, the op name")
            return None, None
        if len(item.value) > 1:
            names = ", ".join(
                clip(k.value, 20) if isinstance(k, Scalar) else describe(k)
                for k, _ in item.value[:4]
            ) + (", ..." if len(item.value) > 4 else "")
            self.problem(
                item.value[1][0], f,
                f"an op item has exactly one key, the op name; this one has {len(item.value)}"
                f" ({names}): a missing '-'?",
            )
            return None, None
        key, value = item.value[0]
        if not self.visit(key, f):
            return None, None
        if not (isinstance(key, Scalar) and key.tag == STR):
            self.problem(key, f, f"expected an op name, got {describe(key)}")
            return None, None
        name = key.value
        if name not in OPS:
            self.problem(key, f, f"unknown op {quote(name)}{suggest(name, OPS)}")
            return None, None
        loc = Loc(self.file, item.line, item.column)
        build: Callable[[Node, str, Loc], Op | None] | None = getattr(self, f"op_{name}", None)
        if build is None:
            return name, self.op_fields(OPS[name], value, f"{f}.{name}", loc)
        return name, build(value, f"{f}.{name}", loc)

    def op_fields(self, op: Section, node: Node, f: str, loc: Loc) -> Op | None:
        """An op that is a mapping of its declared fields, each read by its type; the
        fields left out take their declared defaults."""
        d = self.fields(node, f, {
            fld.name: (fld.required, self.reader(fld)) for fld in op.fields
        }, null_ok=op.body == "empty")
        return None if d is None else OP_TYPES[op.name](loc=loc, **{**op.defaults, **d})

    def value(self, fld: Field, node: Node, path: str) -> Any:
        """`node` read as the declared field `fld`: by its type, within its bounds."""
        return _READ[fld.type.name](self, fld, node, path)

    def reader(self, fld: Field) -> Parse:
        read = _READ[fld.type.name]
        return lambda node, path: read(self, fld, node, path)

    # -- scalar parsers shared by the ops

    def seq_id(self, node: Node, field: str, *, allow_all: bool = False) -> int | None:
        """A seq id in `[0, n_seq_max)` (ENGINE.md §3), or -1 ("every sequence",
        ENGINE.md §2) when `allow_all`."""
        v = self.int_(node, field)
        if v is None:
            return None
        n = self.lim.n_seq_max
        hi = n - 1 if n is not None else _static(SEQ)[1]
        if (allow_all and v == -1) or 0 <= v <= hi:
            return v
        msg = f"seq id {v} is out of range: "
        msg += (f"cache.n_seq_max is {n}, so seq ids are 0..{hi}" if n is not None
                else f"seq ids are 0..{hi}")
        if allow_all:
            msg += ", or -1 for every sequence"
        elif v == -1:
            msg += " (-1, every sequence, is only for seq_rm and state_drop)"
        self.problem(node, field, msg)
        return None

    def seq_any(self, node: Node, field: str) -> int | None:
        return self.seq_id(node, field, allow_all=True)

    def seq_set(self, node: Node, field: str) -> tuple[int, ...] | None:
        """A token's sequence set: an int or a list of distinct ints, order kept."""
        if isinstance(node, Scalar):
            v = self.seq_id(node, field)
            return None if v is None else (v,)
        items = self.list_(node, field, "a seq id or a list of seq ids")
        if items is None:
            return None
        if not items:
            self.problem(node, field, "a token needs at least one seq id")
            return None
        out: list[int] = []
        ok = True
        for i, it in enumerate(items):
            v = self.seq_id(it, f"{field}[{i}]")
            if v is None:
                ok = False
            elif v in out:
                self.problem(it, f"{field}[{i}]", f"seq id {v} is listed twice")
                ok = False
            else:
                out.append(v)
        return tuple(out) if ok else None

    def pos(self, node: Node, field: str) -> int | None:
        return self.int_(node, field, POS.lo, POS.hi, POS.hint)

    def positions(self, node: Node, field: str) -> Sequence[int] | None:
        """`pos` of the shorthand decode: an int, "A..B" (half-open, A < B) or a list.
        A range is returned unbuilt (a `range`): its length is checked first."""
        if isinstance(node, Seq):
            items = self.list_(node, field)
            if items is None:
                return None
            ps = [self.pos(it, f"{field}[{i}]") for i, it in enumerate(items)]
            return None if None in ps else ps  # type: ignore[return-value]
        if isinstance(node, Scalar) and node.tag == STR and ".." in node.value:
            if not self.visit(node, field):
                return None
            return self.pos_range(node, field)
        if (isinstance(node, Scalar) and node.tag == STR
                and not (node.plain and NUMBER_LIKE.match(node.value))):
            if self.visit(node, field):
                self.problem(
                    node, field,
                    f"expected a position, a range 'A..B' or a list of positions,"
                    f" got {describe(node)}",
                )
            return None
        v = self.pos(node, field)  # an int, or a number written some other way: int_ says
        return None if v is None else [v]

    def pos_range(self, node: Scalar, field: str) -> range | None:
        """"A..B": both ends plain decimal (as every int), checked before any int()."""
        q = quote(node.value)
        m = POS_RANGE.fullmatch(node.value)
        if m is None or not all(NUMBER_LIKE.match(end) for end in m.groups()):
            self.problem(
                node, field,
                f"expected a position, a range 'A..B' or a list of positions, got {describe(node)}",
            )
            return None
        ends: list[int] = []
        for end in m.groups():
            if not DECIMAL.fullmatch(end):
                self.problem(node, field, f"in the range {q}, {not_decimal(end)}")
                return None
            digits = len(end) - end.startswith("-")
            if digits > MAX_INT_DIGITS:
                self.problem(
                    node, field,
                    f"out of range: the range {q} has an end of {digits} digits"
                    " (positions are below 2**31 - 2**20)",
                )
                return None
            ends.append(int(end))
        a, b = ends
        if a >= b:
            self.problem(node, field, f"empty range {q}: A..B needs A < B")
            return None
        if a < 0 or b > POS_LIMIT:
            past = "starts below 0" if a < 0 else f"ends past {POS_LIMIT - 1}"
            self.problem(
                node, field, f"out of range: {q} {past} (positions are below 2**31 - 2**20)"
            )
            return None
        return range(a, b)

    def ext(self, node: Node, field: str) -> tuple[int, int] | None:
        items = self.list_(node, field, "a list [x, y]")
        if items is None:
            return None
        if len(items) != 2:
            self.problem(node, field, f"ext is [x, y], got {len(items)} values")
            return None
        x, y = (self.int_(it, f"{field}[{i}]", EXT.lo, EXT.hi) for i, it in enumerate(items))
        return None if x is None or y is None else (x, y)

    def cell(self, node: Node, field: str) -> int | None:
        kv = self.lim.kv_size
        hint = f" (cells are stream-local: below cache.kv_size, {kv})" if kv else ""
        return self.int_(node, field, CELL.lo, kv - 1 if kv else CELL.hi, hint)

    def p_bound(self, node: Node, field: str) -> int | None:
        v = self.int_(node, field)
        if v is None:
            return None
        lo, hi = _static(BOUND)
        if not lo <= v <= hi:
            self.problem(node, field, f"out of range: {v} (a position >= 0, or -1 for no bound)")
            return None
        return v

    def count_tokens(self, n: int, node: Node, field: str) -> None:
        """Count `n` more tokens, before they are built: past `max_tokens`, stop."""
        if self.n_tokens + n > self.max_tokens:
            here = f" ({n:,} here, {self.n_tokens:,} before)" if n > 1 else ""
            self.fatal(
                node, field,
                f"more than {self.max_tokens:,} tokens in the trace{here}: refusing it"
                " (the bound on its tokens, --max-tokens)",
            )
        self.n_tokens += n

    def beyond_the_stream(self, n: int, seq0: int) -> bool:
        """ENGINE.md §3: every token of a decode takes one cell of its stream, all
        placed before anything applies, so more tokens than a stream's `kv_size`
        cells can never be placed, whatever the cache holds. Such a decode is valid
        (llama_decode refuses it: KP006 at replay); a range this long stays unbuilt."""
        kv, unified = self.lim.kv_size, self.lim.unified
        return kv is not None and unified is not None and n > kv

    # -- decode (TRACE_FORMAT.md "Trace"; ENGINE.md §3)

    def op_decode(self, node: Node, f: str, loc: Loc) -> Decode | None:
        before = len(self.problems)
        m = self.map_(node, f, DECODE_KEYS)
        if m is None:
            return None
        forms = [k for form in DECODE_FORMS[1:] for k in form.names if k in m]
        short = [k for k in SHORTHAND.names if k in m]
        if len(forms) + (1 if short else 0) > 1:
            self.problem(
                node, f,
                "a decode takes one form: {seq, pos} (with optional ext, cell), {tokens: [...]}"
                f" or {{ubatches: [[...], ...]}}; got keys {', '.join(forms + short)}",
            )
            return None
        ubatches: tuple[tuple[int, ...], ...] | None = None
        if forms == ["tokens"]:
            items = self.list_(m["tokens"], f"{f}.tokens", "a list of tokens")
            if items is None:
                return None
            toks = [self.token(it, f"{f}.tokens[{i}]") for i, it in enumerate(items)]
            if not toks:
                self.problem(m["tokens"], f"{f}.tokens", "a decode needs at least one token")
        elif forms == ["ubatches"]:
            parsed = self.ubatches(m["ubatches"], f"{f}.ubatches")
            if parsed is None:
                return None
            toks, ubatches = parsed
        else:
            return self.shorthand(node, m, f, loc, before)
        self.check_decode(toks)
        if len(self.problems) != before:
            return None
        return Decode(tokens=tuple(t.token for t in toks), ubatches=ubatches, loc=loc)  # type: ignore[misc]

    def ubatches(
        self, node: Node, f: str
    ) -> tuple[list[_Tok], tuple[tuple[int, ...], ...]] | None:
        groups = self.list_(node, f, "a list of ubatches (lists of tokens)")
        if groups is None:
            return None
        if not groups:
            self.problem(node, f, "a decode needs at least one token")
            return None
        toks: list[_Tok] = []
        split: list[tuple[int, ...]] = []
        for j, g in enumerate(groups):
            items = self.list_(g, f"{f}[{j}]", "a ubatch (a list of tokens)")
            if items is None:
                continue
            if not items:
                self.problem(g, f"{f}[{j}]", "a ubatch must not be empty")
                continue
            n_ubatch = self.lim.n_ubatch
            if n_ubatch is not None and len(items) > n_ubatch:
                self.problem(
                    g, f"{f}[{j}]",
                    f"a ubatch of {len(items)} tokens, more than cache.n_ubatch ({n_ubatch})",
                )
            start = len(toks)
            toks.extend(self.token(it, f"{f}[{j}][{i}]") for i, it in enumerate(items))
            self.check_ubatch_sets(toks[start:])
            split.append(tuple(range(start, len(toks))))
        return toks, tuple(split)

    def check_ubatch_sets(self, ub: list[_Tok]) -> None:
        """ENGINE.md §3: the hybrid memory splits with split_equal, whose ubatch
        collects sequence sets that overlap none already taken: two tokens of one
        ubatch carry the same set or disjoint ones. A recorded ubatch with sets {0}
        and {0, 1} is no split llama.cpp makes (its recurrent child's find_slot
        assumes one cell per set)."""
        seen: list[frozenset[int]] = []
        for t in ub:
            if t.token is None:
                continue
            ss = frozenset(t.token.seq)
            other = next((o for o in seen if o != ss and o & ss), None)
            if other is not None:
                self.problem(
                    t.node, f"{t.field}.seq",
                    f"sequence set {_set_words(t.token.seq)} overlaps set "
                    f"{_set_words(sorted(other))} of an earlier token of this ubatch: "
                    "split_equal puts only equal or disjoint sets in one ubatch",
                )
                return
            if ss not in seen:
                seen.append(ss)

    def token(self, node: Node, f: str) -> _Tok:
        before = len(self.problems)
        self.count_tokens(1, node, f)
        m = self.map_(node, f, TOKEN.names, TOKEN.required)
        if m is None:
            return _Tok(None, f, node, None, None)
        pos = self.pos(m["pos"], f"{f}.pos") if "pos" in m else None
        seq = self.seq_set(m["seq"], f"{f}.seq") if "seq" in m else None
        ext = self.ext(m["ext"], f"{f}.ext") if "ext" in m else None
        cell = self.cell(m["cell"], f"{f}.cell") if "cell" in m else None
        token = None
        if len(self.problems) == before:
            assert pos is not None and seq is not None
            token = Token(pos=pos, seq=seq, ext=ext, cell=cell)
        return _Tok(token, f, node, m.get("ext"), m.get("cell"))

    def check_decode(self, toks: list[_Tok]) -> None:
        """The decode-wide rules on explicit tokens: ext needs by_order; all or no
        cells; no cell named twice in one stream (ENGINE.md §2: stream = 0 when
        unified, else the token's first seq id). More tokens in a stream than it has
        cells is llama_decode's refusal, not the loader's (KP006 at replay)."""
        if self.lim.by_order is False:
            first = next((t for t in toks if t.ext_node is not None), None)
            if first is not None:
                assert first.ext_node is not None
                self.problem(first.ext_node, f"{first.field}.ext", _EXT_NEEDS_BY_ORDER)
        with_cell = [t for t in toks if t.cell_node is not None]
        if with_cell and len(with_cell) != len(toks):
            lacking = next(t for t in toks if t.cell_node is None)
            self.problem(
                lacking.node, lacking.field,
                f"this token has no cell but {with_cell[0].field} has one:"
                " give every token of a decode a cell, or none",
            )
        if not with_cell or self.lim.unified is None:
            return
        taken: dict[tuple[int, int], str] = {}
        for t in with_cell:
            if t.token is None or t.token.cell is None:
                continue
            strm = 0 if self.lim.unified else t.token.seq[0]
            key = (strm, t.token.cell)
            if key in taken:
                where = "" if self.lim.unified else f" of stream {strm}"
                assert t.cell_node is not None
                self.problem(
                    t.cell_node, f"{t.field}.cell",
                    f"cell {t.token.cell}{where} is already taken by {taken[key]}"
                    " in this decode",
                )
            else:
                taken[key] = t.field

    def shorthand(
        self, node: Node, m: dict[str, Node], f: str, loc: Loc, before: int
    ) -> Decode | None:
        """`{seq: S, pos: P}` (+ optional ext for every token, cell for a single one)."""
        for key in SHORTHAND.required:
            if key not in m:
                self.problem(node, f"{f}.{key}", "required key missing")
        seq = self.seq_set(m["seq"], f"{f}.seq") if "seq" in m else None
        ps = self.positions(m["pos"], f"{f}.pos") if "pos" in m else None
        ext = None
        if "ext" in m:
            ext = self.ext(m["ext"], f"{f}.ext")
            if self.lim.by_order is False:
                self.problem(m["ext"], f"{f}.ext", _EXT_NEEDS_BY_ORDER)
        cell = None
        if "cell" in m:
            cell = self.cell(m["cell"], f"{f}.cell")
            if ps is not None and len(ps) != 1:
                self.problem(
                    m["cell"], f"{f}.cell",
                    f"cell names one cell, but pos gives {len(ps)} positions"
                    " (use tokens: to place several)",
                )
        if ps is not None and not ps:
            self.problem(m["pos"], f"{f}.pos", "a decode needs at least one token")
        if len(self.problems) != before or seq is None or ps is None:
            return None
        # from the length alone: a range longer than its stream is never built
        if isinstance(ps, range) and self.beyond_the_stream(len(ps), seq[0]):
            return Decode(tokens=(), span=Span(seq, ps.start, ps.stop, ext), loc=loc)
        self.count_tokens(len(ps), m["pos"], f"{f}.pos")
        return Decode(tokens=tuple(Token(p, seq, ext, cell) for p in ps), loc=loc)

    # -- the ops read by code of their own (the others: `op_fields`; ENGINE.md §2 for
    # what they do)

    def slot(self, node: Node, field: str) -> str | None:
        return self.str_(node, field, nonempty=SLOT.nonempty)

    def op_state_write(self, node: Node, f: str, loc: Loc) -> Op | None:
        before = len(self.problems)
        m = self.map_(node, f, OPS["state_write"].names, OPS["state_write"].required)
        if m is None:
            return None
        seq = self.seq_id(m["seq"], f"{f}.seq") if "seq" in m else None
        slot = self.slot(m["slot"], f"{f}.slot") if "slot" in m else None
        if slot is not None:  # written even if the op is otherwise wrong: no cascade
            self.slots.add(slot)
        if len(self.problems) != before or seq is None or slot is None:
            return None
        return StateWrite(seq=seq, slot=slot, loc=loc)

    def op_state_read(self, node: Node, f: str, loc: Loc) -> Op | None:
        before = len(self.problems)
        m = self.map_(node, f, OPS["state_read"].names, OPS["state_read"].required)
        if m is None:
            return None
        seq = self.seq_id(m["seq"], f"{f}.seq") if "seq" in m else None
        slot = self.slot(m["slot"], f"{f}.slot") if "slot" in m else None
        if slot is not None and slot not in self.slots:
            self.problem(
                m["slot"], f"{f}.slot",
                f"slot {quote(slot)} is not written by an earlier state_write"
                f"{suggest(slot, self.slots)}",
            )
        if len(self.problems) != before or seq is None or slot is None:
            return None
        return StateRead(seq=seq, slot=slot, loc=loc)

    def op_note(self, node: Node, f: str, loc: Loc) -> Op | None:
        text = self.str_(node, f)
        return None if text is None else Note(text=text, loc=loc)

    def findings(self, node: Node, field: str) -> tuple[str, ...] | None:
        items = self.list_(node, field, "a list of finding codes")
        if items is None:
            return None
        out: list[str] = []
        ok = True
        for i, it in enumerate(items):
            fi = f"{field}[{i}]"
            code = self.str_(it, fi)
            if code is None:
                ok = False
            elif not FINDING_CODE.fullmatch(code):
                self.problem(
                    it, fi, f"not a finding code: {quote(code)} (codes are KP001, KP002, ...)"
                )
                ok = False
            elif code in out:
                self.problem(it, fi, f"finding {code} is listed twice")
                ok = False
            else:
                out.append(code)
        return tuple(out) if ok else None

    def pools(self, node: Node, field: str) -> tuple[tuple[int, int], ...] | None:
        items = self.list_(node, field, "a list of pools ([seq, k] or {seq, k})")
        if items is None:
            return None
        out: list[tuple[int, int]] = []
        ok = True
        for i, it in enumerate(items):
            fi = f"{field}[{i}]"
            pool = self.pool(it, fi)
            if pool is None:
                ok = False
            elif pool in out:
                self.problem(it, fi, f"pool {list(pool)} is listed twice")
                ok = False
            else:
                out.append(pool)
        return tuple(out) if ok else None

    def pool(self, node: Node, field: str) -> tuple[int, int] | None:
        """A pool of `expect.pools`: {seq, k} (`POOL`) or [seq, k]."""
        k_ = self.reader(POOL["k"])
        if isinstance(node, Map):
            d = self.fields(node, field, {
                f.name: (f.required, self.reader(f)) for f in POOL.fields
            })
            return None if d is None else (d["seq"], d["k"])
        items = self.list_(node, field, "a pool: [seq, k] or {seq, k}")
        if items is None:
            return None
        if len(items) != 2:
            self.problem(node, field, f"a pool is [seq, k], got {len(items)} values")
            return None
        s = self.seq_id(items[0], f"{field}[0]")
        k = k_(items[1], f"{field}[1]")
        return None if s is None or k is None else (s, k)

    def status(self, node: Node, field: str) -> str | None:
        v = self.str_(node, field)
        if v is not None and v not in OP_STATUSES:
            self.problem(
                node, field,
                f"unknown status {quote(v)}{suggest(v, OP_STATUSES)}"
                f" (one of {', '.join(OP_STATUSES)})",
            )
            return None
        return v


SHORTHAND = DECODE_FORMS[0]  # {seq, pos} (+ ext, cell); the others have one key each

# How the walk reads a field of each declared type (`trace.format`): the checks that
# depend on the cache are in the readers of seq ids and cells.
_READ: dict[str, Callable[[_Walker, Field, Node, str], Any]] = {
    "int": lambda w, f, n, p: w.int_(n, p, f.lo, f.hi, f.hint),
    "engine": lambda w, f, n, p: w.engine(n),
    "bool": lambda w, f, n, p: w.bool_(n, p),
    "str": lambda w, f, n, p: w.str_(n, p, nonempty=f.type.nonempty),
    "seq": lambda w, f, n, p: w.seq_id(n, p),
    "seq_or_all": lambda w, f, n, p: w.seq_any(n, p),
    "seq_set": lambda w, f, n, p: w.seq_set(n, p),
    "pos": lambda w, f, n, p: w.pos(n, p),
    "positions": lambda w, f, n, p: w.positions(n, p),
    "ext": lambda w, f, n, p: w.ext(n, p),
    "cell": lambda w, f, n, p: w.cell(n, p),
    "bound": lambda w, f, n, p: w.p_bound(n, p),
    "slot": lambda w, f, n, p: w.slot(n, p),
    "findings": lambda w, f, n, p: w.findings(n, p),
    "pools": lambda w, f, n, p: w.pools(n, p),
    "status": lambda w, f, n, p: w.status(n, p),
}

_EXT_NEEDS_BY_ORDER = (
    "ext (an M-RoPE token) needs cache.by_order: true, but cache.by_order is false"
)
